// Percentiles, summaries and the run's metrics on known data.
#include "bench/load/bench_stats.h"

#include <gtest/gtest.h>

namespace anvil::bench {
namespace {

TEST(BenchStats, PercentileInterpolatesLikeNumpy) {
  const std::vector<double> v{10, 1, 9, 2, 8, 3, 7, 4, 6, 5};  // 1..10, shuffled
  EXPECT_DOUBLE_EQ(percentile(v, 50), 5.5);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 9.1);
  EXPECT_DOUBLE_EQ(percentile(v, 99), 9.91);
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 10);
  EXPECT_DOUBLE_EQ(percentile({4}, 99), 4);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
}

TEST(BenchStats, SummaryInMillisecondsWithPopulationStd) {
  const auto s = summarize_ms({0.001, 0.002, 0.003, 0.004}, {50, 75});
  EXPECT_DOUBLE_EQ(s.mean_ms, 2.5);
  EXPECT_DOUBLE_EQ(s.median_ms, 2.5);
  EXPECT_NEAR(s.std_ms, 1.118033988749895, 1e-12);
  ASSERT_EQ(s.percentiles.size(), 2u);
  EXPECT_DOUBLE_EQ(s.percentiles[1].first, 75);
  EXPECT_DOUBLE_EQ(s.percentiles[1].second, 3.25);
}

request_result ok(std::int64_t in, std::int64_t out, double ttft, double e2el, std::vector<double> itls) {
  request_result r;
  r.ok = true;
  r.prompt_tokens = in;
  r.output_tokens = out;
  r.ttft_s = ttft;
  r.e2el_s = e2el;
  r.itls_s = std::move(itls);
  return r;
}

TEST(BenchStats, MetricsCountOnlyCompletedRequests) {
  request_result bad;
  bad.error = "boom";
  bad.prompt_tokens = 99;
  const std::vector<request_result> rs{ok(10, 5, 0.1, 0.5, {0.1, 0.1, 0.1, 0.1}), ok(20, 1, 0.2, 0.2, {}), bad};
  const auto m = compute_metrics(rs, 2.0, {}, {50, 99});
  EXPECT_EQ(m.completed, 2);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 30);
  EXPECT_EQ(m.total_output, 6);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(m.output_throughput, 3.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 18.0);
  EXPECT_FALSE(m.has_goodput);
  // TPOT only for the request with more than one token: (0.5 - 0.1) / 4 = 100 ms.
  EXPECT_DOUBLE_EQ(m.tpot.mean_ms, 100.0);
  EXPECT_NEAR(m.ttft.mean_ms, 150.0, 1e-9);
  EXPECT_NEAR(m.itl.mean_ms, 100.0, 1e-9);
  EXPECT_NEAR(m.e2el.median_ms, 350.0, 1e-9);
}

TEST(BenchStats, GoodputCountsRequestsMeetingEverySlo) {
  const std::vector<request_result> rs{ok(1, 11, 0.05, 1.05, {}),   // ttft 50, tpot 100, e2el 1050
                                       ok(1, 11, 0.30, 0.80, {}),   // ttft 300: misses ttft
                                       ok(1, 11, 0.05, 3.05, {})};  // tpot 300: misses tpot
  slo_spec slo;
  slo.ttft_ms = 200;
  slo.tpot_ms = 150;
  const auto m = compute_metrics(rs, 2.0, slo, {99});
  EXPECT_TRUE(m.has_goodput);
  EXPECT_DOUBLE_EQ(m.request_goodput, 0.5);
  slo.tpot_ms.reset();
  slo.e2el_ms = 5000;
  EXPECT_DOUBLE_EQ(compute_metrics(rs, 2.0, slo, {99}).request_goodput, 1.0);
}

TEST(BenchStats, NoSamplesGiveZeros) {
  const auto m = compute_metrics({}, 0.0, {}, {99});
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.ttft.mean_ms, 0);
  EXPECT_EQ(m.request_throughput, 0);
}

}  // namespace
}  // namespace anvil::bench
