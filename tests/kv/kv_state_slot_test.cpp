// State slots (kv_config::n_state_slots): a recurrent layer's state per sequence, one slot each,
// taken at the first reserve (all or nothing with the blocks), given back at release and by a
// preemption; forks refused; the ledger and check() count them.
#include <stdexcept>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kv/kv_core.h"
#include "tests/kv/kv_test_util.h"

namespace anvil::kv {
namespace {

using testing::iota_tokens;
using ::testing::HasSubstr;

kv_config slots_cfg(std::int64_t n_blocks, std::int64_t n_slots) {
  return {.n_blocks = n_blocks, .block_size = 4, .prefix_caching = false, .n_state_slots = n_slots};
}

TEST(KvStateSlots, ASequenceTakesASlotAtItsFirstReserveAndGivesItBackAtRelease) {
  kv_core c(slots_cfg(16, 2));
  c.begin(1, iota_tokens(6, 0));
  EXPECT_EQ(c.state_slot(1), -1) << "no slot before the first reserve";
  ASSERT_TRUE(c.reserve(1, 6).ok);
  EXPECT_EQ(c.state_slot(1), 0);
  ASSERT_TRUE(c.reserve(1, 9).ok);
  EXPECT_EQ(c.state_slot(1), 0) << "the same slot for the sequence's whole life";
  c.begin(2, iota_tokens(3, 10));
  ASSERT_TRUE(c.reserve(2, 3).ok);
  EXPECT_EQ(c.state_slot(2), 1);
  EXPECT_EQ(c.state_ledger().in_use, 2);
  EXPECT_EQ(c.state_ledger().free, 0);
  EXPECT_EQ(c.check(), "");
  c.release(1);
  EXPECT_EQ(c.state_ledger().free, 1);
  c.begin(3, iota_tokens(2, 20));
  ASSERT_TRUE(c.reserve(3, 2).ok);
  EXPECT_EQ(c.state_slot(3), 0) << "the slot released";
  EXPECT_EQ(c.check(), "");
}

TEST(KvStateSlots, NoFreeSlotIsNoRoomAndChangesNothing) {
  kv_core c(slots_cfg(16, 1));
  c.begin(1, iota_tokens(4, 0));
  ASSERT_TRUE(c.reserve(1, 4).ok);
  c.begin(2, iota_tokens(4, 10));
  const ledger before = c.ledger();
  EXPECT_FALSE(c.reserve(2, 4).ok) << "blocks are free but no slot is";
  EXPECT_EQ(c.ledger().in_use, before.in_use);
  EXPECT_TRUE(c.block_table(2).empty());
  EXPECT_EQ(c.state_slot(2), -1);
  EXPECT_EQ(c.check(), "");
  // And no block is no room even with a slot free: the slot stays free.
  kv_core d(slots_cfg(1, 2));
  d.begin(1, iota_tokens(8, 0));
  EXPECT_FALSE(d.reserve(1, 8).ok);
  EXPECT_EQ(d.state_ledger().free, 2);
  EXPECT_EQ(d.check(), "");
}

TEST(KvStateSlots, APreemptedVictimGivesItsSlotToTheServedSequence) {
  kv_core c(slots_cfg(16, 1));
  kv_batch b;
  b.ops.push_back(testing::op_begin(1, iota_tokens(4, 0)));
  b.ops.push_back(testing::op_reserve(1, 4));
  ASSERT_TRUE(c.apply(b).results[1].ok);
  kv_batch next;
  next.ops.push_back(testing::op_begin(2, iota_tokens(4, 10)));
  next.ops.push_back(testing::op_reserve(2, 4, true));
  next.victims = {1, 2};
  const kv_batch_result r = c.apply(next);
  EXPECT_EQ(r.preempted, (std::vector<std::uint64_t>{1}));
  EXPECT_TRUE(r.results[1].ok);
  EXPECT_EQ(r.results[1].state_slot, 0);
  EXPECT_EQ(r.state_counts.in_use, 1);
  EXPECT_EQ(r.state_counts.total, 1);
  EXPECT_EQ(c.stats().state_counts.in_use, 1);
  EXPECT_EQ(c.check(), "");
}

TEST(KvStateSlots, AForkIsRefused) {
  kv_core c(slots_cfg(16, 4));
  c.begin(1, iota_tokens(4, 0));
  ASSERT_TRUE(c.reserve(1, 4).ok);
  EXPECT_THROW(c.fork(2, 1), std::logic_error);
  EXPECT_FALSE(c.live(2));
  EXPECT_EQ(c.check(), "");
}

TEST(KvStateSlots, CheckNoticesASlotHeldTwiceOrLost) {
  kv_core c(slots_cfg(16, 3));
  for (std::uint64_t id : {1, 2}) {
    c.begin(id, iota_tokens(4, std::int32_t(id) * 10));
    ASSERT_TRUE(c.reserve(id, 4).ok);
  }
  ASSERT_EQ(c.check(), "");
  kv_core_test_access::state_slot(c, 2) = 0;
  EXPECT_THAT(c.check(), HasSubstr("live sequences hold it 2 times"));
  kv_core_test_access::state_slot(c, 2) = 1;
  ASSERT_EQ(c.check(), "");
  kv_core_test_access::state_pool(c).unref(1, false);  // the pool thinks slot 1 free; seq 2 holds it
  EXPECT_THAT(c.check(), HasSubstr("refcount 0 but live sequences hold it 1 times"));
  kv_core_test_access::state_pool(c).take();
  ASSERT_EQ(c.check(), "");
  kv_core_test_access::state_slot(c, 2) = 7;
  EXPECT_THAT(c.check(), HasSubstr("out-of-range state slot"));
}

TEST(KvStateSlots, RejectsSlotsItCannotRun) {
  EXPECT_THROW(kv_core(slots_cfg(8, -1)), std::invalid_argument);
  EXPECT_NO_THROW(kv_core(kv_config{.n_blocks = 8, .block_size = 4, .prefix_caching = true, .n_state_slots = 2}))
      << "prefix caching with state slots keeps snapshots";
}

}  // namespace
}  // namespace anvil::kv
