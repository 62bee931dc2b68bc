// check() is only worth running if it can fail: corrupt the state through the test back door and
// see it named. Also the block index's open addressing against a std::unordered_map.
#include <random>
#include <unordered_map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kv/block_index.h"
#include "kv/kv_core.h"
#include "tests/kv/kv_test_util.h"

namespace anvil::kv {
namespace {

using testing::iota_tokens;
using ::testing::HasSubstr;

// Seq 1: two committed full blocks and a partial one; seq 2 released (its full block is cached).
struct KvCheck : ::testing::Test {
  kv_core core{kv_config{8, 4, true}};
  void SetUp() override {
    for (std::uint64_t id : {1u, 2u}) {
      const auto tokens = iota_tokens(id == 1 ? 10 : 4, static_cast<std::int32_t>(100 * id));
      core.begin(id, tokens);
      ASSERT_TRUE(core.reserve(id, static_cast<std::int64_t>(tokens.size())).ok);
      core.commit(id, tokens);
    }
    core.release(2);
    ASSERT_EQ(core.check(), "");
  }
};

TEST_F(KvCheck, NoticesARefcountThatDriftedFromTheTables) {
  kv_core_test_access::pool(core).ref(core.block_table(1)[0]);
  EXPECT_THAT(core.check(), HasSubstr("refcount 2 but live tables hold it 1 times"));
}

TEST_F(KvCheck, NoticesABlockHeldWhileFree) {
  kv_core_test_access::table(core, 1).push_back(7);  // block 7 is on the free list
  EXPECT_THAT(core.check(), HasSubstr("block 7: refcount 0 but live tables hold it 1 times"));
}

TEST_F(KvCheck, NoticesABlockTwiceInOneTable) {
  auto& t = kv_core_test_access::table(core, 1);
  t.push_back(t[0]);
  EXPECT_THAT(core.check(), HasSubstr("twice"));
}

TEST_F(KvCheck, NoticesComputedBeyondTheTable) {
  kv_core_test_access::computed(core, 1) = 13;
  EXPECT_THAT(core.check(), HasSubstr("outside its 3 blocks"));
}

TEST_F(KvCheck, NoticesALeakedBlock) {
  block_pool& pool = kv_core_test_access::pool(core);
  const block_pool::taken t = pool.take();  // taken, never put in a table
  pool.unref(t.id, false);
  EXPECT_EQ(core.check(), "") << "returned: fine again";
  kv_core_test_access::table(core, 1).pop_back();  // the partial block: referenced by nobody now
  kv_core_test_access::computed(core, 1) = 8;
  kv_core_test_access::reserved(core, 1) = 8;
  EXPECT_THAT(core.check(), HasSubstr("live tables hold it 0 times"));
}

TEST_F(KvCheck, NoticesACachedBlockTheIndexDoesNotKnow) {
  block_pool& pool = kv_core_test_access::pool(core);
  const block_pool::taken t = pool.take();
  pool.unref(t.id, true);  // parked in the LRU without being indexed: nothing could ever hit it
  EXPECT_THAT(core.check(), HasSubstr("cached but not in the prefix index"));
}

TEST(BlockIndex, MatchesAMapUnderRandomInsertsAndErases) {
  constexpr std::int32_t max_entries = 64;
  block_index index(max_entries);
  std::unordered_map<std::uint64_t, block_id> model;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    // A small key space keeps the table near full and probe runs long and wrapping.
    const std::uint64_t key = rng() % 96;
    if (model.contains(key)) {
      index.erase(key);
      model.erase(key);
    } else if (static_cast<std::int32_t>(model.size()) < max_entries) {
      const auto b = static_cast<block_id>(rng() % 1000);
      index.insert(key, b);
      model[key] = b;
    }
    ASSERT_EQ(index.size(), static_cast<std::int64_t>(model.size()));
    for (std::uint64_t k = 0; k < 96; ++k) {
      const auto it = model.find(k);
      ASSERT_EQ(index.find(k), it == model.end() ? no_block : it->second) << "key " << k << " after op " << i;
    }
  }
}

}  // namespace
}  // namespace anvil::kv
