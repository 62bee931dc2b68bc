// The kv_manager actor shell: batches, stats and the audit through completion tokens, a caller
// bug answered as an error value, and batches from several threads applied one at a time.
#include "kv/kv_manager.h"

#include <future>
#include <thread>

#include <boost/asio/use_future.hpp>
#include <boost/system/errc.hpp>
#include <boost/system/system_error.hpp>
#include <gtest/gtest.h>

#include "actors/executor_pool.h"
#include "tests/kv/kv_test_util.h"
#include "tests/actors/future_error.h"

namespace anvil::kv {
namespace {

namespace asio = boost::asio;
using actors::executor_pool;
using namespace testing;

using anvil::test_support::error_of;

TEST(KvManager, AppliesBatchesAndAnswersStatsAndCheckThroughFutures) {
  executor_pool pool("kv-test", 2);
  kv_manager kv(pool.get_executor(), kv_config{8, 4, true});
  const auto prompt = iota_tokens(9, 0);

  kv_batch first;
  first.step = 1;
  first.ops = {op_begin(1, prompt), op_reserve(1, 9), op_commit(1, prompt)};
  const kv_batch_result r1 = kv.async_apply(first, asio::use_future).get();
  ASSERT_EQ(r1.results.size(), 3u);
  EXPECT_EQ(r1.results[1].block_table.size(), 3u);
  EXPECT_EQ(r1.counts.in_use, 3);

  kv_batch second;
  second.step = 2;
  second.ops = {op_begin(2, prompt), op_release(1)};
  const kv_batch_result r2 = kv.async_apply(second, asio::use_future).get();
  EXPECT_EQ(r2.results[0].cached_tokens, 8);

  const kv_stats s = kv.async_stats(asio::use_future).get();
  EXPECT_EQ(s.counts.in_use, 2);
  EXPECT_EQ(s.counts.free + s.counts.cached + s.counts.in_use, 8);
  EXPECT_EQ(s.prefix_hits, 8);
  EXPECT_EQ(kv.async_check(asio::use_future).get(), "");
  kv.async_stop(asio::use_future).get();
}

TEST(KvManager, CallerBugAnswersInvalidArgumentAndTheActorGoesOn) {
  executor_pool pool("kv-test", 2);
  kv_manager kv(pool.get_executor(), kv_config{8, 4, true});
  kv_batch bad;
  bad.ops = {op_reserve(7, 4)};  // seq 7 was never begun
  EXPECT_EQ(error_of(kv.async_apply(bad, asio::use_future)),
            boost::system::errc::make_error_code(boost::system::errc::invalid_argument));
  kv_batch good;
  good.ops = {op_begin(7, iota_tokens(3, 0)), op_reserve(7, 4)};
  EXPECT_TRUE(kv.async_apply(good, asio::use_future).get().results[1].ok);
  EXPECT_EQ(kv.async_check(asio::use_future).get(), "");
  kv.async_stop(asio::use_future).get();
}

TEST(KvManager, BatchesFromSeveralThreadsApplyOneAtATime) {
  executor_pool pool("kv-test", 4);
  kv_manager kv(pool.get_executor(), kv_config{256, 4, true});
  constexpr int threads = 4, per_thread = 50;
  std::vector<std::thread> callers;
  for (int t = 0; t < threads; ++t) {
    callers.emplace_back([&kv, t] {
      for (int i = 0; i < per_thread; ++i) {
        const std::uint64_t id = static_cast<std::uint64_t>(t * per_thread + i + 1);
        const auto prompt = iota_tokens(6, t);  // each thread's prompts share one block
        kv_batch b;
        b.ops = {op_begin(id, prompt), op_reserve(id, 6), op_commit(id, prompt)};
        if (i % 2) b.ops.push_back(op_release(id));
        const kv_batch_result r = kv.async_apply(std::move(b), asio::use_future).get();
        EXPECT_TRUE(r.results[1].ok);
      }
    });
  }
  for (auto& c : callers) c.join();
  const kv_stats s = kv.async_stats(asio::use_future).get();
  EXPECT_EQ(s.counts.free + s.counts.cached + s.counts.in_use, 256);
  EXPECT_EQ(s.prefix_hits, (per_thread - 1) * threads * 4) << "all but each thread's first request hit";
  EXPECT_EQ(kv.async_check(asio::use_future).get(), "");
  kv.async_stop(asio::use_future).get();
}

}  // namespace
}  // namespace anvil::kv
