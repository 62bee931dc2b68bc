// kv_core::apply: ops in order, tables and copies in the results, and preemption — victims
// released in order until a may_preempt reserve fits, later ops on them skipped.
#include <gtest/gtest.h>

#include "kv/kv_core.h"
#include "tests/kv/kv_test_util.h"

namespace anvil::kv {
namespace {

using namespace testing;

// Four blocks of 4 tokens; sequences 1, 2 and 3 hold one block each (4 computed tokens).
struct KvApply : ::testing::Test {
  kv_core core{kv_config{4, 4, true}};

  void SetUp() override {
    kv_batch b;
    for (std::uint64_t id = 1; id <= 3; ++id) {
      b.ops.push_back(op_begin(id, iota_tokens(4, static_cast<std::int32_t>(100 * id))));
      b.ops.push_back(op_reserve(id, 4));
      b.ops.push_back(op_commit(id, iota_tokens(4, static_cast<std::int32_t>(100 * id))));
    }
    const kv_batch_result r = core.apply(b);
    ASSERT_EQ(r.results.size(), 9u);
    for (const auto& o : r.results) ASSERT_TRUE(o.ok);
    ASSERT_EQ(r.counts.free, 1);
  }
};

TEST_F(KvApply, RunsOpsInOrderAndReportsTablesCopiesAndTheLedger) {
  const block_id seq1_block = core.block_table(1)[0];
  const auto prompt = iota_tokens(5, 100);  // seq 1's four tokens and one more
  kv_batch b;
  b.ops = {op_release(2), op_begin(4, prompt), op_reserve(4, 5), op_commit(4, prompt), op_fork(5, 4), op_reserve(5, 6)};
  const kv_batch_result r = core.apply(b);
  ASSERT_EQ(r.results.size(), 6u);
  for (std::size_t i = 0; i < r.results.size(); ++i) EXPECT_TRUE(r.results[i].ok) << "op " << i;
  EXPECT_EQ(r.results[1].seq_id, 4u);
  EXPECT_EQ(r.results[1].cached_tokens, 4) << "seq 1's block is a prefix hit";
  EXPECT_EQ(r.results[1].block_table, (std::vector<std::int32_t>{seq1_block}));
  ASSERT_EQ(r.results[2].block_table.size(), 2u);
  EXPECT_TRUE(r.results[3].block_table.empty()) << "commit reports no table";
  EXPECT_EQ(r.results[4].block_table, r.results[2].block_table) << "the fork shares seq 4's table";
  // Seq 5 writes position 5, in the block it shares with seq 4: copied into seq 2's evicted block.
  ASSERT_EQ(r.results[5].copies.size(), 1u);
  EXPECT_EQ(r.results[5].copies[0].src, r.results[2].block_table[1]);
  EXPECT_EQ(r.results[5].copies[0].dst, r.results[5].block_table[1]);
  EXPECT_EQ(r.results[5].block_table[0], seq1_block);
  EXPECT_TRUE(r.preempted.empty());
  EXPECT_EQ(r.counts.in_use, 4);
  EXPECT_EQ(r.counts.free + r.counts.cached, 0);
  EXPECT_EQ(core.stats().evictions, 1);
  EXPECT_EQ(core.check(), "");
}

TEST_F(KvApply, ReserveWithoutMayPreemptReportsNoRoomAndReleasesNobody) {
  kv_batch b;
  b.ops = {op_reserve(1, 12)};
  b.victims = {2, 3};
  const kv_batch_result r = core.apply(b);
  EXPECT_FALSE(r.results[0].ok);
  EXPECT_FALSE(r.results[0].preempted);
  EXPECT_TRUE(r.preempted.empty());
  EXPECT_TRUE(core.live(2) && core.live(3));
  EXPECT_EQ(r.results[0].block_table.size(), 1u) << "the table is unchanged";
}

TEST_F(KvApply, ReleasesVictimsInOrderUntilTheReserveFits) {
  kv_batch b;
  b.ops = {op_reserve(1, 12, true)};  // needs two more blocks, one is free
  b.victims = {3, 2};
  const kv_batch_result r = core.apply(b);
  EXPECT_TRUE(r.results[0].ok);
  EXPECT_EQ(r.results[0].block_table.size(), 3u);
  EXPECT_EQ(r.preempted, (std::vector<std::uint64_t>{3}));
  EXPECT_FALSE(core.live(3));
  EXPECT_TRUE(core.live(2)) << "one victim was enough";
  EXPECT_EQ(core.stats().preemptions, 1);
  EXPECT_EQ(core.check(), "");
}

TEST_F(KvApply, LaterOpsOnAPreemptedSequenceAreSkipped) {
  kv_batch b;
  b.ops = {op_reserve(1, 12, true), op_reserve(3, 5), op_commit(3, iota_tokens(4, 300)), op_fork(6, 3),
           op_reserve(6, 1), op_release(3), op_begin(7, iota_tokens(3, 0)), op_reserve(2, 4)};
  b.victims = {3};
  const kv_batch_result r = core.apply(b);
  ASSERT_EQ(r.results.size(), 8u);
  EXPECT_TRUE(r.results[0].ok);
  EXPECT_EQ(r.preempted, (std::vector<std::uint64_t>{3}));
  for (std::size_t i : {1u, 2u, 3u, 4u, 5u}) {
    EXPECT_TRUE(r.results[i].preempted) << "op " << i;
    EXPECT_FALSE(r.results[i].ok) << "op " << i;
    EXPECT_TRUE(r.results[i].block_table.empty()) << "op " << i;
  }
  EXPECT_FALSE(core.live(6)) << "a fork from a victim does not happen";
  EXPECT_TRUE(r.results[6].ok && !r.results[6].preempted) << "a begin of a new id is fine";
  EXPECT_TRUE(core.live(7));
  EXPECT_TRUE(r.results[7].ok && !r.results[7].preempted);
  EXPECT_EQ(core.check(), "");
}

TEST_F(KvApply, NeverPreemptsTheSequenceBeingServed) {
  kv_batch b;
  b.ops = {op_reserve(1, 12, true)};
  b.victims = {2, 1};  // seq 2 ranks below seq 1
  const kv_batch_result r = core.apply(b);
  EXPECT_TRUE(r.results[0].ok);
  EXPECT_EQ(r.preempted, (std::vector<std::uint64_t>{2}));
  EXPECT_TRUE(core.live(1));
}

TEST_F(KvApply, NeverPreemptsASequenceThatRanksAboveTheServedOne) {
  kv_batch b;
  b.ops = {op_reserve(1, 12, true)};
  b.victims = {1, 2};  // seq 1, the one served, ranks lowest: seq 2 keeps its blocks
  const kv_batch_result r = core.apply(b);
  EXPECT_FALSE(r.results[0].ok) << "no room without preempting a sequence that ranks above it";
  EXPECT_TRUE(r.preempted.empty());
  EXPECT_TRUE(core.live(1));
  EXPECT_TRUE(core.live(2));
  EXPECT_EQ(core.stats().preemptions, 0);
}

TEST_F(KvApply, SkipsVictimsThatAreNotLive) {
  kv_batch b;
  b.ops = {op_release(2), op_reserve(1, 16, true)};  // three more blocks: one free, seq 2's cached
  b.victims = {2, 99, 3};
  const kv_batch_result r = core.apply(b);
  EXPECT_TRUE(r.results[1].ok);
  EXPECT_EQ(r.preempted, (std::vector<std::uint64_t>{3})) << "seq 2 was already released, 99 never existed";
  EXPECT_EQ(core.stats().evictions, 2);
  EXPECT_EQ(core.stats().preemptions, 1);
}

TEST_F(KvApply, VictimsRunningOutLeavesThemReleasedAndTheReserveFailed) {
  kv_batch b;
  b.ops = {op_reserve(1, 24, true)};  // needs five more blocks: the pool has four
  b.victims = {2, 3};
  const kv_batch_result r = core.apply(b);
  EXPECT_FALSE(r.results[0].ok);
  EXPECT_FALSE(r.results[0].preempted);
  EXPECT_EQ(r.preempted, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(r.results[0].block_table.size(), 1u);
  EXPECT_EQ(r.counts.in_use, 1);
  EXPECT_EQ(core.stats().preemptions, 2);
  EXPECT_EQ(core.check(), "");
}

TEST_F(KvApply, PreemptingAForkSiblingCanRemoveTheCopyOnWrite) {
  // Seq 4 shares seq 1's partially written block; the pool is then full.
  kv_batch setup;
  setup.ops = {op_release(1), op_begin(1, iota_tokens(2, 0)), op_reserve(1, 2), op_commit(1, iota_tokens(2, 0)),
               op_fork(4, 1), op_begin(5, iota_tokens(2, 9)), op_reserve(5, 4)};
  ASSERT_EQ(core.apply(setup).counts.in_use, 4);
  kv_batch b;
  b.ops = {op_reserve(1, 3, true)};  // would copy the shared block: no room
  b.victims = {4};
  const kv_batch_result r = core.apply(b);
  EXPECT_TRUE(r.results[0].ok);
  EXPECT_TRUE(r.results[0].copies.empty()) << "with its sibling gone the block is seq 1's alone";
  EXPECT_EQ(r.preempted, (std::vector<std::uint64_t>{4}));
  EXPECT_EQ(core.check(), "");
}

TEST_F(KvApply, ACallerBugInABatchThrowsAfterTheOpsBeforeIt) {
  kv_batch b;
  b.ops = {op_release(1), op_reserve(42, 4), op_release(2)};
  EXPECT_THROW(core.apply(b), std::logic_error);
  EXPECT_FALSE(core.live(1));
  EXPECT_TRUE(core.live(2));
  EXPECT_EQ(core.check(), "");
}

}  // namespace
}  // namespace anvil::kv
