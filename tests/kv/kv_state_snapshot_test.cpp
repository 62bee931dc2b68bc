// Prefix caching with state slots (kv_config::n_state_slots, prefix_caching): a reserve marked
// snapshot takes a spare slot for the state after its step, which becomes the prefix's snapshot at
// the commit of exactly those positions; begin hands out a cached prefix only up to its last block
// with a snapshot and the first reserve copies it; snapshots are evicted LRU by sequences needing
// a slot and die with their prefix's last block; check() audits every slot after each step.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kv/kv_core.h"
#include "tests/kv/kv_test_util.h"

namespace anvil::kv {
namespace {

using testing::iota_tokens;

kv_config snap_cfg(std::int64_t n_blocks, std::int64_t n_slots) {
  return {.n_blocks = n_blocks, .block_size = 4, .prefix_caching = true, .n_state_slots = n_slots};
}

// Runs a whole prompt the way the scheduler does with state snapshots: a step to the last block
// boundary before the last token (with a snapshot), then the rest; commits each; returns the
// snapshot slot taken (-1 for none).
std::int32_t prefill(kv_core& c, std::uint64_t id, const std::vector<std::int32_t>& prompt) {
  const std::int64_t cached = c.begin(id, prompt);
  const auto n = std::int64_t(prompt.size());
  const std::int64_t stop = (n - 1) / 4 * 4;
  std::int32_t snap = -1;
  if (stop > cached) {
    const reserve_result r = c.reserve(id, stop, true);
    EXPECT_TRUE(r.ok);
    snap = r.snapshot_slot;
    c.commit(id, std::span(prompt).first(std::size_t(stop)));
  }
  EXPECT_TRUE(c.reserve(id, n).ok);
  c.commit(id, prompt);
  EXPECT_EQ(c.check(), "");
  return snap;
}

TEST(KvStateSnapshots, ACommittedSnapshotLetsALaterPromptResumeFromIt) {
  kv_core c(snap_cfg(32, 3));
  const auto prompt = iota_tokens(10, 100);
  c.begin(1, prompt);
  const reserve_result r1 = c.reserve(1, 8, true);
  ASSERT_TRUE(r1.ok);
  EXPECT_EQ(c.state_slot(1), 0);
  EXPECT_EQ(r1.snapshot_slot, 1) << "a spare slot for the state after position 8";
  EXPECT_EQ(r1.state_from, -1);
  EXPECT_EQ(c.state_ledger().in_use, 2) << "a snapshot being written is in use";
  EXPECT_EQ(c.check(), "");
  c.commit(1, std::span(prompt).first(8));
  EXPECT_EQ(c.state_ledger().cached, 1);
  EXPECT_EQ(c.stats().state_snapshots, 1);
  ASSERT_TRUE(c.reserve(1, 10).ok);
  c.commit(1, prompt);
  c.release(1);
  EXPECT_EQ(c.check(), "");

  // The same prompt with more after it: blocks 0-1 and the state after them.
  const auto longer = testing::concat(prompt, iota_tokens(5, 7));
  EXPECT_EQ(c.begin(2, longer), 8);
  EXPECT_EQ(c.state_ledger().in_use, 1) << "the snapshot is pinned until the first reserve copies it";
  EXPECT_EQ(c.check(), "");
  const reserve_result r2 = c.reserve(2, 12);
  ASSERT_TRUE(r2.ok);
  EXPECT_EQ(r2.state_from, 1) << "copy the snapshot into the sequence's slot first";
  EXPECT_NE(c.state_slot(2), 1);
  EXPECT_EQ(c.state_ledger().cached, 1) << "the snapshot stays cached for the next one";
  EXPECT_EQ(c.stats().prefix_hits, 8);
  EXPECT_EQ(c.stats().prefix_state_misses, 0);
  EXPECT_EQ(c.check(), "");
}

TEST(KvStateSnapshots, CachedBlocksWithoutASnapshotAtTheirEndAreRecomputed) {
  kv_core c(snap_cfg(32, 3));
  const auto prompt = iota_tokens(13, 0);
  c.begin(1, prompt);
  ASSERT_TRUE(c.reserve(1, 13).ok);  // one step, no snapshot: its blocks are cached, the state is not
  c.commit(1, prompt);
  c.release(1);
  EXPECT_EQ(c.ledger().cached, 3);
  EXPECT_EQ(c.begin(2, prompt), 0);
  EXPECT_EQ(c.stats().prefix_state_misses, 12) << "three cached blocks, no state after any of them";
  EXPECT_EQ(c.check(), "");
  c.release(2);

  // A snapshot after block 1 of 3: the hit stops there and the rest counts as a state miss.
  kv_core d(snap_cfg(32, 3));
  d.begin(1, prompt);
  ASSERT_EQ(d.reserve(1, 8, true).snapshot_slot, 1);
  d.commit(1, std::span(prompt).first(8));
  ASSERT_TRUE(d.reserve(1, 13).ok);
  d.commit(1, prompt);
  d.release(1);
  EXPECT_EQ(d.begin(2, prompt), 8);
  EXPECT_EQ(d.stats().prefix_state_misses, 4);
  EXPECT_EQ(d.ledger().cached, 1) << "the block past the snapshot went back to the cache";
  EXPECT_EQ(d.check(), "");
}

TEST(KvStateSnapshots, ASnapshotThatDoesNotEndItsCommitIsGivenBack) {
  kv_core c(snap_cfg(32, 3));
  const auto prompt = iota_tokens(13, 0);
  c.begin(1, prompt);
  ASSERT_EQ(c.reserve(1, 8, true).snapshot_slot, 1);
  ASSERT_TRUE(c.reserve(1, 13).ok);  // the commit below covers more than the snapshot's step
  c.commit(1, prompt);
  EXPECT_EQ(c.state_ledger().cached, 0);
  EXPECT_EQ(c.state_ledger().in_use, 1);
  EXPECT_EQ(c.stats().state_snapshots, 0);
  EXPECT_EQ(c.check(), "");
  // A sequence released before its step committed gives its snapshot slot back.
  c.begin(2, iota_tokens(9, 50));
  ASSERT_EQ(c.reserve(2, 8, true).snapshot_slot, 2);
  c.release(2);
  EXPECT_EQ(c.state_ledger().free, 2);
  EXPECT_EQ(c.check(), "");
  // Not a block boundary, or nothing new to compute: no snapshot.
  c.begin(3, iota_tokens(9, 70));
  EXPECT_EQ(c.reserve(3, 6, true).snapshot_slot, -1);
  EXPECT_EQ(c.check(), "");
}

// Planned ahead, a step's reserve comes before the commit of the step before it: both its
// snapshot and the earlier one are pending, and each settles with the commit of its own step.
TEST(KvStateSnapshots, SnapshotsOfStepsPlannedAheadSettleWithTheirOwnCommits) {
  kv_core c(snap_cfg(32, 4));
  const auto prompt = iota_tokens(14, 0);
  c.begin(1, prompt);
  ASSERT_EQ(c.reserve(1, 4, true).snapshot_slot, 1);
  ASSERT_EQ(c.reserve(1, 12, true).snapshot_slot, 2);
  EXPECT_EQ(c.reserve(1, 12, true).snapshot_slot, -1) << "one snapshot per position";
  EXPECT_EQ(c.state_ledger().in_use, 3);
  EXPECT_EQ(c.check(), "");
  c.commit(1, std::span(prompt).first(4));
  EXPECT_EQ(c.state_ledger().cached, 1);
  EXPECT_EQ(c.check(), "");
  c.commit(1, std::span(prompt).first(12));
  EXPECT_EQ(c.state_ledger().cached, 2);
  EXPECT_EQ(c.stats().state_snapshots, 2);
  EXPECT_EQ(c.check(), "");
  c.release(1);
  EXPECT_EQ(c.begin(2, prompt), 12);
  EXPECT_EQ(c.check(), "");
}

TEST(KvStateSnapshots, TwoSequencesOnOnePrefixKeepOneSnapshot) {
  kv_core c(snap_cfg(32, 4));
  const auto prompt = iota_tokens(9, 0);
  for (std::uint64_t id : {1, 2}) {
    c.begin(id, prompt);
    ASSERT_GE(c.reserve(id, 8, true).snapshot_slot, 0);
  }
  for (std::uint64_t id : {1, 2}) c.commit(id, std::span(prompt).first(8));
  EXPECT_EQ(c.state_ledger().cached, 1) << "the second snapshot of the same prefix goes back";
  EXPECT_EQ(c.stats().state_snapshots, 1);
  EXPECT_EQ(c.check(), "");
}

TEST(KvStateSnapshots, ASequenceNeedingASlotEvictsTheLeastRecentSnapshot) {
  kv_core c(snap_cfg(64, 3));
  ASSERT_EQ(prefill(c, 1, iota_tokens(9, 0)), 1);
  c.release(1);
  ASSERT_EQ(prefill(c, 2, iota_tokens(9, 100)), 2);  // slot 0 is free again, for the sequence
  c.release(2);
  EXPECT_EQ(c.state_ledger().cached, 2);
  // Three sequences at once: the third takes a slot from the snapshots, the oldest first.
  for (std::uint64_t id : {3, 4}) {
    c.begin(id, iota_tokens(5, std::int32_t(id) * 1000));
    ASSERT_TRUE(c.reserve(id, 4).ok);
  }
  EXPECT_EQ(c.state_ledger().cached, 1);
  EXPECT_EQ(c.begin(5, iota_tokens(9, 0)), 0) << "the first prompt's snapshot was evicted";
  EXPECT_EQ(c.begin(6, iota_tokens(9, 100)), 8) << "the second's is still there";
  EXPECT_EQ(c.check(), "");
  // Pinned by seq 6, it is not evictable: seq 5 finds no slot.
  EXPECT_FALSE(c.reserve(5, 4).ok);
  const reserve_result r6 = c.reserve(6, 9);
  EXPECT_FALSE(r6.ok) << "and seq 6 needs a slot of its own besides the snapshot";
  c.release(3);
  const reserve_result again = c.reserve(6, 9);
  ASSERT_TRUE(again.ok);
  EXPECT_GE(again.state_from, 0);
  EXPECT_EQ(c.check(), "");
}

TEST(KvStateSnapshots, ASnapshotDiesWithItsPrefixsLastBlock) {
  kv_core c(snap_cfg(4, 3));  // 4 blocks: the first prefix's two are evicted by the next prompt
  ASSERT_EQ(prefill(c, 1, iota_tokens(9, 0)), 1);
  c.release(1);
  EXPECT_EQ(c.state_ledger().cached, 1);
  ASSERT_GE(prefill(c, 2, iota_tokens(16, 500)), 0);
  EXPECT_EQ(c.state_ledger().cached, 1) << "the second prompt's snapshot alone: the first died with its blocks";
  EXPECT_EQ(c.check(), "");
  c.release(2);
  EXPECT_EQ(c.begin(3, iota_tokens(9, 0)), 0);
  EXPECT_EQ(c.check(), "");
}

TEST(KvStateSnapshots, CheckNoticesASnapshotNamedWrongOrLeaked) {
  kv_core c(snap_cfg(32, 3));
  ASSERT_EQ(prefill(c, 1, iota_tokens(9, 0)), 1);
  c.release(1);
  ASSERT_EQ(c.check(), "");
  auto& snaps = kv_core_test_access::snapshots(c);
  ASSERT_EQ(snaps.size(), 1u);
  const auto saved = *snaps.begin();
  snaps.begin()->second = 2;
  EXPECT_THAT(c.check(), ::testing::HasSubstr("snapshot is elsewhere"));
  snaps.clear();
  EXPECT_THAT(c.check(), ::testing::HasSubstr("snapshot is elsewhere"));
  snaps.insert(saved);
  ASSERT_EQ(c.check(), "");
  snaps.emplace(saved.first + 1, saved.second);  // a second prefix naming the same slot
  EXPECT_THAT(c.check(), ::testing::HasSubstr("disagrees"));
  snaps.erase(saved.first + 1);
  ASSERT_EQ(c.check(), "");
  kv_core_test_access::state_pool(c).ref(saved.second);  // a reference no sequence holds
  EXPECT_THAT(c.check(), ::testing::HasSubstr("refcount 1 but live sequences hold it 0 times"));
}

}  // namespace
}  // namespace anvil::kv
