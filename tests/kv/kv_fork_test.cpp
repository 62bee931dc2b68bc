// fork and copy-on-write: a fork shares every block; the first write into a shared block copies
// it, so one fork's writes never land in a block the other reads.
#include <stdexcept>

#include <gtest/gtest.h>

#include "kv/kv_core.h"
#include "tests/kv/kv_test_util.h"

namespace anvil::kv {
namespace {

using testing::concat;
using testing::fake_kv_pool;
using testing::iota_tokens;
using testing::table_of;

struct KvFork : ::testing::Test {
  kv_core core{kv_config{16, 4, true}};
  fake_kv_pool kv{16, 4};

  // One step of `id` computing tokens[computed, size); expects room.
  std::vector<gpu_worker::block_copy> step(std::uint64_t id, const std::vector<std::int32_t>& tokens) {
    reserve_result r = core.reserve(id, static_cast<std::int64_t>(tokens.size()));
    EXPECT_TRUE(r.ok);
    kv.copy(r.copies);
    kv.write(core.block_table(id), core.computed(id), tokens);
    core.commit(id, tokens);
    EXPECT_EQ(core.check(), "");
    return r.copies;
  }
  void expect_reads_back(std::uint64_t id, const std::vector<std::int32_t>& tokens) {
    EXPECT_EQ(kv.verify(core.block_table(id), tokens, core.computed(id)), "") << "seq " << id;
  }
  std::int32_t refcount(block_id b) { return kv_core_test_access::pool(core).refcount(b); }
};

TEST_F(KvFork, ForkSharesEveryBlockAndTheComputedCount) {
  const auto prompt = iota_tokens(6, 0);
  core.begin(1, prompt);
  step(1, prompt);
  core.fork(2, 1);
  EXPECT_EQ(table_of(core, 2), table_of(core, 1));
  EXPECT_EQ(core.computed(2), 6);
  for (block_id b : core.block_table(1)) EXPECT_EQ(refcount(b), 2);
  EXPECT_EQ(core.ledger().in_use, 2) << "a fork takes no new blocks";
  EXPECT_EQ(core.check(), "");
}

TEST_F(KvFork, FirstWriteIntoTheSharedPartialBlockCopiesIt) {
  const auto prompt = iota_tokens(6, 0);  // block 0 full, block 1 holds 2 of 4
  core.begin(1, prompt);
  step(1, prompt);
  core.fork(2, 1);
  const auto shared = table_of(core, 1);

  const auto a = concat(prompt, {100});
  const auto copies = step(1, a);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, shared[1]);
  const auto t1 = table_of(core, 1);
  EXPECT_EQ(copies[0].dst, t1[1]);
  EXPECT_EQ(t1[0], shared[0]) << "the full block is only read: still shared";
  EXPECT_EQ(table_of(core, 2), shared) << "the other fork keeps the original";
  EXPECT_EQ(refcount(shared[0]), 2);
  EXPECT_EQ(refcount(shared[1]), 1);
  EXPECT_EQ(refcount(t1[1]), 1);

  const auto b = concat(prompt, {200});
  EXPECT_TRUE(step(2, b).empty()) << "the original is no longer shared: written in place";
  EXPECT_EQ(table_of(core, 2), shared);
  expect_reads_back(1, a);
  expect_reads_back(2, b);
}

TEST_F(KvFork, WritesOfOneForkNeverLandInBlocksTheOtherReads) {
  auto a = iota_tokens(5, 0);
  core.begin(1, a);
  step(1, a);
  core.fork(2, 1);
  core.fork(3, 2);
  auto b = a, c = a;
  for (std::int32_t i = 0; i < 9; ++i) {  // diverging decode steps, interleaved
    a.push_back(1000 + i);
    step(1, a);
    b.push_back(2000 + i);
    step(2, b);
    c.push_back(3000 + i);
    step(3, c);
    expect_reads_back(1, a);
    expect_reads_back(2, b);
    expect_reads_back(3, c);
  }
}

TEST_F(KvFork, ForkAtABlockBoundaryNeedsNoCopy) {
  const auto prompt = iota_tokens(8, 0);
  core.begin(1, prompt);
  step(1, prompt);
  core.fork(2, 1);
  EXPECT_TRUE(step(1, concat(prompt, {1})).empty());
  EXPECT_TRUE(step(2, concat(prompt, {2})).empty());
  EXPECT_EQ(core.ledger().in_use, 4);
}

TEST_F(KvFork, ForkSharesOnlyTheBlocksHoldingComputedPositions) {
  const auto prompt = iota_tokens(2, 0);
  core.begin(1, prompt);
  ASSERT_TRUE(core.reserve(1, 12).ok);  // three blocks, only positions 0 and 1 computed
  kv.write(core.block_table(1), 0, prompt);
  core.commit(1, prompt);
  core.fork(2, 1);
  EXPECT_EQ(table_of(core, 2), (std::vector<block_id>{core.block_table(1)[0]}))
      << "blocks reserved ahead hold nothing yet: they stay seq 1's";
  EXPECT_THROW(core.commit(2, iota_tokens(3, 0)), std::logic_error) << "the fork reserved nothing past position 2";
  const reserve_result r = core.reserve(2, 12);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.copies.size(), 1u) << "only the shared partial block is copied";
  for (block_id b : core.block_table(1)) EXPECT_EQ(refcount(b), 1);
  EXPECT_EQ(core.ledger().in_use, 6);
  EXPECT_EQ(core.check(), "");
}

TEST_F(KvFork, ForkNeverWritesIntoABlockItsSourceFilledAndCached) {
  const auto prompt = iota_tokens(6, 0);  // block 1 holds positions 4, 5
  core.begin(1, prompt);
  step(1, prompt);
  ASSERT_TRUE(core.reserve(1, 8).ok);  // seq 1 reserves its next step (no copy: block 1 is its own)
  core.fork(2, 1);                      // ...and is forked before that step runs
  const auto full = concat(prompt, {50, 51});
  kv.write(core.block_table(1), 6, full);  // the step fills block 1, which seq 2 still shares
  core.commit(1, full);                    // block 1 is full: indexed
  core.release(1);                         // seq 2 alone holds an indexed block it will write into
  const auto b = concat(prompt, {60});
  EXPECT_EQ(step(2, b).size(), 1u) << "the cached block must be copied, not overwritten";
  expect_reads_back(2, b);
  core.begin(3, concat(full, {1}));
  EXPECT_EQ(core.computed(3), 8);
  expect_reads_back(3, full);  // the prefix hit still holds seq 1's KV
}

TEST_F(KvFork, ReleasingOneForkLeavesTheOtherIntact) {
  const auto prompt = iota_tokens(10, 0);
  core.begin(1, prompt);
  step(1, prompt);
  core.fork(2, 1);
  const auto shared = table_of(core, 1);
  core.release(1);
  EXPECT_EQ(table_of(core, 2), shared);
  for (block_id b : shared) EXPECT_EQ(refcount(b), 1);
  expect_reads_back(2, prompt);
  EXPECT_EQ(core.ledger().in_use, 3);
  const auto more = concat(prompt, {42});
  EXPECT_TRUE(step(2, more).empty()) << "sole owner again: no copy";
  expect_reads_back(2, more);
  core.release(2);
  EXPECT_EQ(core.ledger().in_use, 0);
  EXPECT_EQ(core.ledger().cached, 2);
  EXPECT_EQ(core.check(), "");
}

TEST_F(KvFork, NoRoomCountsTheCopyOnWriteBlock) {
  const auto prompt = iota_tokens(6, 0);
  core.begin(1, prompt);
  step(1, prompt);
  core.fork(2, 1);
  core.begin(3, iota_tokens(1, 9));
  ASSERT_TRUE(core.reserve(3, 56).ok);  // the remaining fourteen blocks
  const auto before = table_of(core, 1);
  const reserve_result r = core.reserve(1, 7);  // no new block, but a copy
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(r.copies.empty());
  EXPECT_EQ(table_of(core, 1), before);
  EXPECT_EQ(refcount(before[1]), 2);
  core.release(3);
  EXPECT_EQ(core.reserve(1, 7).copies.size(), 1u);
  EXPECT_EQ(core.check(), "");
}

}  // namespace
}  // namespace anvil::kv
