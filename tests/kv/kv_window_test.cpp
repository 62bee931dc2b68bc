// The window pool (kv_config::window): sliding-window layers' blocks in a pool of their own, given
// back once every position they hold lies before the next query's window; reserve is all or
// nothing over both pools, a fork shares window blocks and copies them on write, and check()
// notices a window table out of step.
#include <stdexcept>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kv/kv_core.h"
#include "tests/kv/kv_test_util.h"

namespace anvil::kv {
namespace {

using testing::iota_tokens;
using ::testing::HasSubstr;

kv_config window_cfg(std::int64_t n_blocks, std::int64_t n_window_blocks, std::int64_t window) {
  return {.n_blocks = n_blocks, .block_size = 4, .prefix_caching = false, .window = window,
          .n_window_blocks = n_window_blocks};
}

std::vector<block_id> window_of(const kv_core& c, std::uint64_t id) {
  const auto t = c.window_table(id);
  return {t.begin(), t.end()};
}

TEST(KvWindow, GivesBackTheBlocksBeforeTheNextQuerysWindow) {
  kv_core c(window_cfg(16, 16, 8));
  const auto tokens = iota_tokens(20, 0);
  c.begin(1, tokens);
  ASSERT_TRUE(c.reserve(1, 20).ok);
  EXPECT_EQ(window_of(c, 1), (std::vector<block_id>{0, 1, 2, 3, 4}));
  c.commit(1, std::span(tokens).first(12));
  // The next query, at position 12, sees [5, 12]: block 0 (positions 0-3) is behind it.
  EXPECT_EQ(window_of(c, 1), (std::vector<block_id>{no_block, 1, 2, 3, 4}));
  c.commit(1, tokens);
  // At 20 it sees [13, 20]: blocks 0-2 (positions 0-11) are behind; block 3 holds 12-15.
  EXPECT_EQ(window_of(c, 1), (std::vector<block_id>{no_block, no_block, no_block, 3, 4}));
  EXPECT_EQ(c.block_table(1).size(), 5u) << "the main table keeps everything";
  const ledger w = c.window_ledger();
  EXPECT_EQ(w.in_use, 2);
  EXPECT_EQ(w.free, 14);
  EXPECT_EQ(w.cached, 0);
  EXPECT_EQ(w.total, 16);
  EXPECT_EQ(c.check(), "");
  // Growing reserves only new blocks in both pools; the given-back entries stay -1.
  ASSERT_TRUE(c.reserve(1, 24).ok);
  EXPECT_EQ(window_of(c, 1), (std::vector<block_id>{no_block, no_block, no_block, 3, 4, 2}));
  c.release(1);
  EXPECT_EQ(c.window_ledger().free, 16);
  EXPECT_EQ(c.ledger().free, 16);
  EXPECT_EQ(c.check(), "");
}

TEST(KvWindow, AWindowOfOneKeepsOnlyTheBlockOfTheNextPosition) {
  kv_core c(window_cfg(8, 8, 1));
  const auto tokens = iota_tokens(9, 0);
  c.begin(1, tokens);
  ASSERT_TRUE(c.reserve(1, 9).ok);
  c.commit(1, std::span(tokens).first(8));  // the next query, at 8, sees only itself: block 2
  EXPECT_EQ(window_of(c, 1), (std::vector<block_id>{no_block, no_block, 2}));
  EXPECT_EQ(c.check(), "");
}

TEST(KvWindow, NoRoomInEitherPoolChangesNothing) {
  kv_core c(window_cfg(16, 3, 64));
  c.begin(1, iota_tokens(8, 0));
  ASSERT_TRUE(c.reserve(1, 8).ok);  // 2 of 3 window blocks
  c.begin(2, iota_tokens(8, 100));
  const ledger main_before = c.ledger(), window_before = c.window_ledger();
  EXPECT_FALSE(c.reserve(2, 8).ok) << "the window pool has one block left";
  EXPECT_EQ(c.ledger().in_use, main_before.in_use);
  EXPECT_EQ(c.window_ledger().in_use, window_before.in_use);
  EXPECT_TRUE(c.block_table(2).empty());
  EXPECT_TRUE(c.window_table(2).empty());
  EXPECT_EQ(c.check(), "");
}

TEST(KvWindow, AForkSharesWindowBlocksAndCopiesThemOnWrite) {
  kv_core c(window_cfg(16, 16, 6));
  const auto tokens = iota_tokens(10, 0);
  c.begin(1, tokens);
  ASSERT_TRUE(c.reserve(1, 10).ok);
  c.commit(1, tokens);  // the next query, at 10, sees [5, 10]: block 0 is given back
  const auto source = window_of(c, 1);
  ASSERT_EQ(source, (std::vector<block_id>{no_block, 1, 2}));
  c.fork(2, 1);
  EXPECT_EQ(window_of(c, 2), source);
  EXPECT_EQ(c.check(), "");
  // Seq 2 writes position 10, in the shared partial block 2: a copy in the window pool (and one
  // in the main pool, whose block 2 is shared too).
  const reserve_result r = c.reserve(2, 11);
  ASSERT_TRUE(r.ok);
  int window_copies = 0, main_copies = 0;
  for (const gpu_worker::block_copy& cp : r.copies) {
    if (cp.window) {
      ++window_copies;
      EXPECT_EQ(cp.src, 2);
      EXPECT_EQ(cp.dst, window_of(c, 2)[2]);
    } else {
      ++main_copies;
    }
  }
  EXPECT_EQ(window_copies, 1);
  EXPECT_EQ(main_copies, 1);
  EXPECT_NE(window_of(c, 2)[2], 2);
  EXPECT_EQ(window_of(c, 2)[1], 1) << "block 1 is only read: still shared";
  c.release(1);
  c.release(2);
  EXPECT_EQ(c.window_ledger().free, 16);
  EXPECT_EQ(c.check(), "");
}

TEST(KvWindow, TheBatchResultCarriesBothTablesAndLedgers) {
  kv_core c(window_cfg(8, 6, 4));
  kv_batch b;
  b.ops.push_back(testing::op_begin(1, iota_tokens(6, 0)));
  b.ops.push_back(testing::op_reserve(1, 6));
  const kv_batch_result r = c.apply(b);
  EXPECT_EQ(r.results[1].block_table, (std::vector<std::int32_t>{0, 1}));
  EXPECT_EQ(r.results[1].window_table, (std::vector<std::int32_t>{0, 1}));
  EXPECT_EQ(r.window_counts.in_use, 2);
  EXPECT_EQ(r.window_counts.total, 6);
  EXPECT_EQ(c.stats().window_counts.in_use, 2);
}

TEST(KvWindow, CheckNoticesAWindowTableOutOfStep) {
  kv_core c(window_cfg(8, 8, 4));
  const auto tokens = iota_tokens(10, 0);
  c.begin(1, tokens);
  ASSERT_TRUE(c.reserve(1, 10).ok);
  c.commit(1, tokens);  // sees [7, 10]: block 0 given back
  ASSERT_EQ(c.check(), "");
  kv_core_test_access::trimmed(c, 1) = 0;  // claims to hold block 0's entry again
  EXPECT_THAT(c.check(), HasSubstr("given back up to 0, the window needs 1"));
  kv_core_test_access::trimmed(c, 1) = 1;
  kv_core_test_access::window(c, 1).push_back(5);
  EXPECT_THAT(c.check(), HasSubstr("window blocks for"));
  kv_core_test_access::window(c, 1).pop_back();
  kv_core_test_access::window(c, 1)[2] = kv_core_test_access::window(c, 1)[1];
  EXPECT_THAT(c.check(), HasSubstr("twice"));
}

TEST(KvWindow, RejectsAWindowPoolItCannotRun) {
  EXPECT_THROW(kv_core(kv_config{.n_blocks = 8, .block_size = 4, .prefix_caching = true, .window = 4, .n_window_blocks = 8}),
               std::invalid_argument);
  EXPECT_THROW(kv_core(window_cfg(8, 0, 4)), std::invalid_argument);
  EXPECT_THROW(kv_core(window_cfg(8, 8, -1)), std::invalid_argument);
}

}  // namespace
}  // namespace anvil::kv
