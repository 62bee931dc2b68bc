// The result JSON carries every vLLM key and its counts add up; the table has vLLM's shape.
#include "bench/load/bench_report.h"

#include <boost/json.hpp>
#include <gtest/gtest.h>

namespace anvil::bench {
namespace {
namespace json = boost::json;

std::vector<request_result> sample_results() {
  std::vector<request_result> rs(5);
  for (int i = 0; i < 5; ++i) {
    auto& r = rs[std::size_t(i)];
    r.prompt_tokens = 10 + i;
    if (i == 2) {
      r.error = "invalid_request: boom";
      r.output_tokens = 3;  // partial output of a failed request does not count
      continue;
    }
    r.ok = true;
    r.output_tokens = 4;
    r.ttft_s = 0.01 * (i + 1);
    r.itls_s = {0.005, 0.005, 0.006};
    r.e2el_s = r.ttft_s + 0.016;
  }
  return rs;
}

TEST(BenchReport, JsonHasEveryKeyAndCountsAddUp) {
  bench_options o;
  o.url = "tcp://127.0.0.1:9";
  o.num_prompts = 5;
  o.percentiles = {50, 99.9};
  o.goodput.ttft_ms = 30;
  const auto rs = sample_results();
  const auto pcts = json_percentiles(o.percentiles);
  EXPECT_EQ(pcts, (std::vector<double>{50, 99.9, 90, 99}));
  const auto m = compute_metrics(rs, 1.0, o.goodput, pcts);
  const json::object r = result_json(m, rs, o, "");
  for (const char* key : {"duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                          "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                          "input_lens", "output_lens", "ttfts", "itls", "errors", "config"})
    EXPECT_TRUE(r.contains(key)) << key;
  for (const char* metric : {"ttft", "tpot", "itl", "e2el"})
    for (const char* stat : {"mean", "median", "std", "p50", "p90", "p99", "p99.9"})
      EXPECT_TRUE(r.contains(std::string(stat) + "_" + metric + "_ms")) << stat << "_" << metric;

  EXPECT_EQ(r.at("completed").as_int64() + r.at("failed").as_int64(), o.num_prompts);
  EXPECT_EQ(r.at("failed").as_int64(), 1);
  for (const char* arr : {"input_lens", "output_lens", "ttfts", "itls", "errors"})
    EXPECT_EQ(r.at(arr).as_array().size(), std::size_t(o.num_prompts)) << arr;
  std::int64_t out = 0;
  for (const auto& v : r.at("output_lens").as_array()) out += v.as_int64();
  EXPECT_EQ(out, r.at("total_output_tokens").as_int64());
  EXPECT_EQ(r.at("total_output_tokens").as_int64(), 16);
  EXPECT_EQ(r.at("errors").as_array()[2].as_string(), "invalid_request: boom");
  EXPECT_EQ(r.at("errors").as_array()[0].as_string(), "");
  EXPECT_DOUBLE_EQ(r.at("request_goodput").as_double(), 2.0);  // ttfts 10, 20, 40, 50 ms: two within 30
  EXPECT_EQ(r.at("config").as_object().at("request_rate").as_string(), "inf");
  EXPECT_EQ(r.at("config").as_object().at("num_prompts").as_int64(), 5);
  // Round-trips through text (what the result file holds).
  EXPECT_EQ(json::parse(json::serialize(r)).as_object().size(), r.size());
}

TEST(BenchReport, GoodputIsNullWithoutSlos) {
  bench_options o;
  o.url = "tcp://127.0.0.1:9";
  const auto rs = sample_results();
  const auto m = compute_metrics(rs, 1.0, o.goodput, json_percentiles(o.percentiles));
  EXPECT_TRUE(result_json(m, rs, o, "").at("request_goodput").is_null());
  EXPECT_EQ(result_table(m, o.percentiles).find("goodput"), std::string::npos);
}

TEST(BenchReport, TableLooksLikeVllms) {
  const auto rs = sample_results();
  slo_spec slo;
  slo.e2el_ms = 1000;
  const auto m = compute_metrics(rs, 2.0, slo, json_percentiles({50, 90, 99}));
  const std::string t = result_table(m, {50, 90, 99});
  EXPECT_EQ(t.substr(0, 51), "============ Serving Benchmark Result ============\n");
  EXPECT_NE(t.find("Successful requests:                     4\n"), std::string::npos) << t;
  EXPECT_NE(t.find("Failed requests:                         1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("Request goodput (req/s):                 2.00\n"), std::string::npos) << t;
  EXPECT_NE(t.find("---------------Time to First Token----------------\n"), std::string::npos) << t;
  EXPECT_NE(t.find("-----Time per Output Token (excl. 1st token)------\n"), std::string::npos) << t;
  EXPECT_NE(t.find("P99 ITL (ms):"), std::string::npos) << t;
  EXPECT_NE(t.find("Median E2EL (ms):"), std::string::npos) << t;
  EXPECT_EQ(t.substr(t.size() - 51), std::string(50, '=') + "\n");
}

TEST(BenchReport, PercentileWords) {
  EXPECT_EQ(percentile_word(99), "99");
  EXPECT_EQ(percentile_word(99.9), "99.9");
  EXPECT_EQ(percentile_word(50), "50");
}

}  // namespace
}  // namespace anvil::bench
