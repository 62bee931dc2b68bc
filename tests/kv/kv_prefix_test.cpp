// The prefix cache: full blocks of identical prefixes are computed once and shared; a hit never
// covers the last prompt token; a hash collision can never hand out another prefix's KV.
#include <gtest/gtest.h>

#include "kv/kv_core.h"
#include "tests/kv/kv_test_util.h"

namespace anvil::kv {
namespace {

using testing::concat;
using testing::fake_kv_pool;
using testing::iota_tokens;
using testing::table_of;

// A sequence driven the way the scheduler and the worker drive it, over a fake physical pool.
struct driver {
  kv_core core;
  fake_kv_pool kv;
  explicit driver(kv_config c, block_hasher h = default_block_hash) : core(c, h), kv(c.n_blocks, c.block_size) {}

  // begin + one step computing the whole of `tokens`; returns cached_tokens of the begin.
  std::int64_t run(std::uint64_t id, const std::vector<std::int32_t>& tokens) {
    const std::int64_t cached = core.begin(id, tokens);
    EXPECT_EQ(kv.verify(core.block_table(id), tokens, cached), "") << "seq " << id << " got wrong cached KV";
    step(id, tokens);
    return cached;
  }
  // One step: computes tokens[computed, size) and commits.
  void step(std::uint64_t id, const std::vector<std::int32_t>& tokens) {
    const reserve_result r = core.reserve(id, static_cast<std::int64_t>(tokens.size()));
    ASSERT_TRUE(r.ok);
    kv.copy(r.copies);
    kv.write(core.block_table(id), core.computed(id), tokens);
    core.commit(id, tokens);
    EXPECT_EQ(kv.verify(core.block_table(id), tokens, core.computed(id)), "");
    EXPECT_EQ(core.check(), "");
  }
};

TEST(KvPrefix, SharedSystemPromptIsComputedOnce) {
  driver d({16, 4, true});
  const auto system = iota_tokens(8, 1000);  // two full blocks
  const auto a = concat(system, iota_tokens(3, 1)), b = concat(system, iota_tokens(3, 2));
  EXPECT_EQ(d.run(1, a), 0);
  EXPECT_EQ(d.run(2, b), 8) << "the second request finds the system prompt's KV";
  const auto t1 = table_of(d.core, 1), t2 = table_of(d.core, 2);
  EXPECT_EQ(t1[0], t2[0]);
  EXPECT_EQ(t1[1], t2[1]);
  EXPECT_NE(t1[2], t2[2]);
  EXPECT_EQ(d.core.ledger().in_use, 4) << "3 blocks for the first, 1 new block for the second";
  const kv_stats s = d.core.stats();
  EXPECT_EQ(s.prefix_queries, 22);
  EXPECT_EQ(s.prefix_hits, 8);
}

TEST(KvPrefix, PrefixHitSkipsFullCachedBlocksOnly) {
  driver d({16, 4, true});
  const auto first = iota_tokens(10, 0);  // blocks [0,4) [4,8) full, [8,10) partial
  d.run(1, first);
  EXPECT_EQ(d.run(2, concat(first, iota_tokens(5, 50))), 8) << "the partial third block is never shared";
  EXPECT_NE(table_of(d.core, 1)[2], table_of(d.core, 2)[2]);
}

TEST(KvPrefix, HitCapKeepsTheLastPromptTokenUncached) {
  driver d({16, 4, true});
  const auto prompt = iota_tokens(8, 0);
  d.run(1, concat(prompt, {77}));  // prompt plus one generated token: blocks [0,4) [4,8) cached
  EXPECT_EQ(d.run(2, prompt), 4) << "an 8-token prompt must compute token 8 itself, so its second block is not a hit";
  EXPECT_EQ(d.run(3, concat(prompt, {5})), 8);
  EXPECT_EQ(d.core.begin(4, iota_tokens(1, 0)), 0);
  EXPECT_EQ(d.core.begin(5, {}), 0);
  EXPECT_EQ(d.core.begin(6, iota_tokens(4, 0)), 0);
  EXPECT_EQ(d.core.begin(7, iota_tokens(5, 0)), 4);
}

TEST(KvPrefix, DivergingPromptsShareOnlyTheCommonFullBlocks) {
  driver d({16, 4, true});
  const auto common = iota_tokens(6, 0);
  d.run(1, concat(common, iota_tokens(6, 100)));
  EXPECT_EQ(d.run(2, concat(common, iota_tokens(6, 200))), 4);
}

TEST(KvPrefix, ChunkedPrefillSharesBlocksAsSoonAsTheyAreCommitted) {
  driver d({16, 4, true});
  const auto prompt = iota_tokens(14, 0);
  d.core.begin(1, prompt);
  d.step(1, {prompt.begin(), prompt.begin() + 9});  // first chunk: blocks 0 and 1 full
  EXPECT_EQ(d.run(2, prompt), 8) << "the first request is still running; its committed blocks are shared";
  d.step(1, prompt);
  EXPECT_EQ(d.run(3, prompt), 12);
}

TEST(KvPrefix, IdenticalBlockAlreadyIndexedKeepsTheExistingOne) {
  driver d({16, 4, true});
  const auto prompt = iota_tokens(8, 0), longer = concat(prompt, iota_tokens(5, 100));
  d.core.begin(1, prompt);
  d.core.begin(2, longer);  // both miss: neither has computed anything yet
  d.step(1, prompt);
  d.step(2, longer);  // blocks 0, 1 identical to seq 1's (already indexed), block 2 new
  const auto t1 = table_of(d.core, 1), t2 = table_of(d.core, 2);
  EXPECT_NE(t1[0], t2[0]) << "the sequence keeps its own blocks";
  d.core.release(2);
  EXPECT_EQ(d.core.ledger().cached, 1) << "only seq 2's third block is indexed; its duplicates go free";
  EXPECT_EQ(d.core.ledger().free, 16 - 2 - 1);
  EXPECT_EQ(d.run(3, concat(longer, {1})), 12) << "hits seq 1's blocks, then seq 2's third block chained after them";
  const auto t3 = table_of(d.core, 3);
  EXPECT_EQ(t3[0], t1[0]);
  EXPECT_EQ(t3[1], t1[1]);
  EXPECT_EQ(t3[2], t2[2]);
}

// Every block gets the same hash: each lookup finds *a* block, and only the token comparison
// keeps the wrong one out.
std::uint64_t constant_hash(std::uint64_t, std::span<const std::int32_t>) { return 42; }

TEST(KvPrefix, HashCollisionNeverHandsOutAnotherPrefixsKv) {
  driver d({16, 4, true}, constant_hash);
  const auto p1 = iota_tokens(13, 0), p2 = iota_tokens(13, 500);
  d.run(1, p1);  // block 0 indexed; block 1 collides with it and stays out, so do those after it
  EXPECT_EQ(d.core.stats().counts.in_use, 4);
  EXPECT_EQ(d.run(2, p2), 0) << "same hash, different tokens: not a hit";
  EXPECT_EQ(d.run(3, p1), 4) << "block 0 is a true hit; block 1 was never indexed";
  d.core.release(1);
  d.core.release(2);
  d.core.release(3);
  EXPECT_EQ(d.core.ledger().cached, 1);
  EXPECT_EQ(d.core.check(), "");
}

// The hash ignores the chain: a block's key depends on its own tokens only, so the same block
// of tokens after different prefixes collides. The parent check must tell them apart.
std::uint64_t chainless_hash(std::uint64_t, std::span<const std::int32_t> tokens) {
  return default_block_hash(root_hash, tokens);
}

TEST(KvPrefix, HitNeedsTheSamePrefixNotJustTheSameBlock) {
  driver d({16, 4, true}, chainless_hash);
  const auto x = iota_tokens(4, 0), y = iota_tokens(4, 10), z = iota_tokens(4, 20);
  d.run(1, concat(concat(x, y), {7}));  // x, then y after x: both indexed
  EXPECT_EQ(d.run(2, concat(concat(z, y), {7})), 0);
  // z is indexed now. y-after-z has y-after-x's key and tokens, but x's KV in front of it.
  EXPECT_EQ(d.run(3, concat(concat(z, y), {7})), 4) << "y computed after x must not serve a prefix z";
  EXPECT_EQ(d.run(4, concat(concat(x, y), {7})), 8);
}

}  // namespace
}  // namespace anvil::kv
