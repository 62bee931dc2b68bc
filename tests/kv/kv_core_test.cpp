// kv_core basics: allocation and release keep the ledger balanced, "no room" changes nothing,
// cached blocks are evicted least recently used first, and caller bugs throw before any change.
#include "kv/kv_core.h"

#include <limits>
#include <stdexcept>

#include <gtest/gtest.h>

#include "tests/kv/kv_test_util.h"

namespace anvil::kv {
namespace {

using testing::iota_tokens;
using testing::table_of;

kv_config cfg(std::int64_t n_blocks, std::int64_t block_size, bool prefix_caching = true) {
  return {n_blocks, block_size, prefix_caching};
}

void expect_ledger(const kv_core& c, std::int64_t free, std::int64_t cached, std::int64_t in_use) {
  const ledger l = c.ledger();
  EXPECT_EQ(l.free, free);
  EXPECT_EQ(l.cached, cached);
  EXPECT_EQ(l.in_use, in_use);
  EXPECT_EQ(l.free + l.cached + l.in_use, l.total);
  EXPECT_EQ(c.check(), "");
}

// Begins, reserves and commits `tokens` as one step; returns the sequence's table.
std::vector<block_id> compute(kv_core& c, std::uint64_t id, const std::vector<std::int32_t>& tokens) {
  c.begin(id, tokens);
  EXPECT_TRUE(c.reserve(id, static_cast<std::int64_t>(tokens.size())).ok);
  c.commit(id, tokens);
  return table_of(c, id);
}

TEST(KvCore, AllocationAndReleaseRoundTripsKeepTheLedgerBalanced) {
  kv_core c(cfg(8, 4));
  expect_ledger(c, 8, 0, 0);
  EXPECT_EQ(c.begin(1, iota_tokens(10, 0)), 0);
  expect_ledger(c, 8, 0, 0);
  ASSERT_TRUE(c.reserve(1, 10).ok);
  EXPECT_EQ(table_of(c, 1), (std::vector<block_id>{0, 1, 2}));
  expect_ledger(c, 5, 0, 3);
  c.release(1);  // nothing committed: nothing worth caching
  expect_ledger(c, 8, 0, 0);
  for (int round = 0; round < 3; ++round) {
    c.begin(2, iota_tokens(3, 100));
    ASSERT_TRUE(c.reserve(2, 32).ok);
    expect_ledger(c, 0, 0, 8);
    c.release(2);
    expect_ledger(c, 8, 0, 0);
  }
}

TEST(KvCore, ReserveCoversTheRequestedPositionsAndNeverShrinks) {
  kv_core c(cfg(8, 4));
  c.begin(1, iota_tokens(1, 0));
  ASSERT_TRUE(c.reserve(1, 1).ok);
  EXPECT_EQ(c.block_table(1).size(), 1u);
  ASSERT_TRUE(c.reserve(1, 4).ok);
  EXPECT_EQ(c.block_table(1).size(), 1u);
  ASSERT_TRUE(c.reserve(1, 5).ok);
  EXPECT_EQ(c.block_table(1).size(), 2u);
  ASSERT_TRUE(c.reserve(1, 2).ok);
  EXPECT_EQ(c.block_table(1).size(), 2u);
  ASSERT_TRUE(c.reserve(1, 0).ok);
  EXPECT_EQ(c.block_table(1).size(), 2u);
  expect_ledger(c, 6, 0, 2);
}

TEST(KvCore, NoRoomIsAllOrNothing) {
  kv_core c(cfg(4, 4));
  c.begin(1, iota_tokens(12, 0));
  ASSERT_TRUE(c.reserve(1, 12).ok);  // 3 of 4 blocks
  c.begin(2, iota_tokens(5, 50));
  const reserve_result r = c.reserve(2, 5);  // needs 2, 1 is free
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(r.copies.empty());
  EXPECT_TRUE(c.block_table(2).empty()) << "a failed reserve must not keep the one block it could get";
  expect_ledger(c, 1, 0, 3);
  ASSERT_TRUE(c.reserve(2, 4).ok);  // one block fits
  expect_ledger(c, 0, 0, 4);
  EXPECT_FALSE(c.reserve(1, 13).ok);
  EXPECT_EQ(c.block_table(1).size(), 3u);
}

TEST(KvCore, CommittedFullBlocksStayCachedAfterRelease) {
  kv_core c(cfg(8, 4));
  const auto t = compute(c, 1, iota_tokens(10, 0));  // two full blocks, one partial
  expect_ledger(c, 5, 0, 3);
  c.release(1);
  expect_ledger(c, 6, 2, 0);  // the partial block's KV cannot be reused: it is free
  EXPECT_EQ(c.begin(2, iota_tokens(12, 0)), 8);
  EXPECT_EQ(table_of(c, 2), (std::vector<block_id>{t[0], t[1]}));
  expect_ledger(c, 6, 0, 2);  // cached blocks with no references are in use again
}

TEST(KvCore, FreeBlocksAreUsedBeforeCachedOnes) {
  kv_core c(cfg(4, 4));
  compute(c, 1, iota_tokens(4, 0));
  c.release(1);
  expect_ledger(c, 3, 1, 0);
  c.begin(2, iota_tokens(1, 77));
  ASSERT_TRUE(c.reserve(2, 12).ok);
  expect_ledger(c, 0, 1, 3);
  EXPECT_EQ(c.stats().evictions, 0);
  EXPECT_EQ(c.begin(3, iota_tokens(5, 0)), 4) << "the cached block survived while free ones were left";
}

TEST(KvCore, EvictsTheLeastRecentlyUsedCachedBlockFirst) {
  kv_core c(cfg(3, 4));
  const auto a = iota_tokens(4, 0), b = iota_tokens(4, 10), d = iota_tokens(4, 20);
  const block_id block_a = compute(c, 1, a)[0];
  const block_id block_b = compute(c, 2, b)[0];
  const block_id block_d = compute(c, 3, d)[0];
  c.release(1);
  c.release(2);
  c.release(3);
  expect_ledger(c, 0, 3, 0);  // LRU order: a, b, d

  // Reusing b's block makes it the most recent: the order becomes a, d, b.
  EXPECT_EQ(c.begin(4, testing::concat(b, {99})), 4);
  c.release(4);

  c.begin(5, iota_tokens(1, 500));
  ASSERT_TRUE(c.reserve(5, 8).ok);  // evicts two
  EXPECT_EQ(table_of(c, 5), (std::vector<block_id>{block_a, block_d}));
  EXPECT_EQ(c.stats().evictions, 2);
  expect_ledger(c, 0, 1, 2);
  EXPECT_EQ(c.begin(6, testing::concat(a, {99})), 0) << "evicted blocks must leave the prefix index";
  EXPECT_EQ(c.begin(7, testing::concat(d, {99})), 0);
  EXPECT_EQ(c.begin(8, testing::concat(b, {99})), 4);
  EXPECT_EQ(table_of(c, 8), (std::vector<block_id>{block_b}));
}

TEST(KvCore, ReleaseQueuesAPrefixsLastBlockForEvictionFirst) {
  kv_core c(cfg(3, 4));
  const auto prompt = iota_tokens(8, 0);
  const auto t = compute(c, 1, prompt);
  c.release(1);
  c.begin(2, iota_tokens(1, 500));
  ASSERT_TRUE(c.reserve(2, 8).ok);  // one free block, then one eviction
  EXPECT_EQ(table_of(c, 2)[1], t[1]) << "the second block goes first: evicting the first strands the second";
  EXPECT_EQ(c.begin(3, testing::concat(prompt, {1})), 4);
}

TEST(KvCore, PrefixCachingOffNeverSharesOrCaches) {
  kv_core c(cfg(8, 4, false));
  const auto prompt = iota_tokens(9, 0);
  compute(c, 1, prompt);
  EXPECT_EQ(c.begin(2, prompt), 0);
  ASSERT_TRUE(c.reserve(2, 9).ok);
  expect_ledger(c, 2, 0, 6);
  c.release(1);
  expect_ledger(c, 5, 0, 3);
  c.release(2);
  expect_ledger(c, 8, 0, 0);
  EXPECT_EQ(c.stats().prefix_queries, 0);
}

TEST(KvCore, CallerBugsThrowLogicErrorAndChangeNothing) {
  kv_core c(cfg(4, 4));
  compute(c, 1, iota_tokens(6, 0));
  const ledger before = c.ledger();
  const std::vector<std::int32_t> seven = iota_tokens(7, 0), five = iota_tokens(5, 0), nine = iota_tokens(9, 0);
  EXPECT_THROW(c.begin(1, seven), std::logic_error);
  EXPECT_THROW((void)c.reserve(9, 4), std::logic_error);
  EXPECT_THROW((void)c.reserve(1, -1), std::logic_error);
  EXPECT_THROW(c.commit(9, seven), std::logic_error);
  EXPECT_THROW(c.commit(1, nine), std::logic_error) << "committing past the reserved positions";
  EXPECT_THROW(c.commit(1, five), std::logic_error) << "committing fewer tokens than already computed";
  EXPECT_THROW(c.release(9), std::logic_error);
  EXPECT_THROW(c.fork(1, 1), std::logic_error);
  EXPECT_THROW(c.fork(2, 9), std::logic_error);
  c.fork(3, 1);
  EXPECT_THROW(c.commit(3, seven), std::logic_error) << "a fork must reserve before it commits";
  c.release(3);
  EXPECT_THROW((void)c.block_table(9), std::logic_error);
  EXPECT_FALSE(c.live(2));
  EXPECT_EQ(c.computed(1), 6);
  const ledger after = c.ledger();
  EXPECT_EQ(after.free, before.free);
  EXPECT_EQ(after.cached, before.cached);
  EXPECT_EQ(after.in_use, before.in_use);
  EXPECT_EQ(c.check(), "");
}

TEST(KvCore, RejectsConfigsItCannotRun) {
  EXPECT_THROW(kv_core(cfg(0, 16)), std::invalid_argument);
  EXPECT_THROW(kv_core(cfg(8, 0)), std::invalid_argument);
  EXPECT_THROW(kv_core(cfg(std::int64_t{std::numeric_limits<std::int32_t>::max()} + 1, 16)), std::invalid_argument);
}

}  // namespace
}  // namespace anvil::kv
