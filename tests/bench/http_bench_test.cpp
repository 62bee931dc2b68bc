// anvil-bench against a fake OpenAI HTTP server: SSE streaming with usage, chat, the chunk-count
// fallback, error statuses and events, keep-alive reuse, the model lookup, the API key, warm-up.
#include <gtest/gtest.h>

#include "bench/load/run_bench.h"
#include "tests/bench/bench_test_util.h"
#include "tests/bench/fake_servers.h"

namespace anvil::bench {
namespace {
using namespace anvil::bench::testing;

TEST(HttpBench, CompletionsStreamWithUsage) {
  fake_http_server server;
  auto o = small_run(server.url());
  o.num_prompts = 10;
  o.concurrency = 3;
  o.input_len = 12;
  o.output_len = 6;
  ASSERT_EQ(run_bench(o), 0);
  const auto r = read_result(o.result_file);
  expect_consistent(r, 10);
  EXPECT_EQ(r.at("completed").as_int64(), 10);
  EXPECT_EQ(r.at("total_output_tokens").as_int64(), 60);   // usage, not the 3 chunks per request
  EXPECT_EQ(r.at("total_input_tokens").as_int64(), 120);   // usage: the fake counts words
  for (const auto& v : r.at("itls").as_array()) EXPECT_EQ(v.as_array().size(), 2u);  // 3 chunks
  EXPECT_GT(r.at("mean_ttft_ms").as_double(), 0.0);
  // No --model: the first id of /v1/models.
  EXPECT_EQ(server.last_model(), "fake-model");
  EXPECT_EQ(r.at("config").as_object().at("model").as_string(), "fake-model");
  const auto body = boost::json::parse(server.last_body()).as_object();
  EXPECT_TRUE(body.at("ignore_eos").as_bool());
  EXPECT_EQ(body.at("max_tokens").as_int64(), 6);
  // Keep-alive: the models call, then at most one connection per request in flight.
  EXPECT_LE(server.connections.load(), 1 + 3);
  EXPECT_LE(server.max_in_flight.load(), 3);
}

TEST(HttpBench, ChatEndpointSendsMessages) {
  fake_http_server server;
  auto o = small_run(server.url());
  o.endpoint = "/v1/chat/completions";
  o.model = "given";
  o.output_len = 5;
  ASSERT_EQ(run_bench(o), 0);
  const auto r = read_result(o.result_file);
  expect_consistent(r, 8);
  EXPECT_EQ(r.at("total_output_tokens").as_int64(), 8 * 5);
  EXPECT_EQ(server.last_model(), "given");
  EXPECT_TRUE(boost::json::parse(server.last_body()).as_object().contains("messages"));
}

TEST(HttpBench, WithoutUsageCountsChunks) {
  fake_http_config cfg;
  cfg.usage = false;
  fake_http_server server(cfg);
  auto o = small_run(server.url());
  o.output_len = 6;
  ASSERT_EQ(run_bench(o), 0);
  const auto r = read_result(o.result_file);
  expect_consistent(r, 8);
  EXPECT_EQ(r.at("total_output_tokens").as_int64(), 8 * 3);  // 3 SSE chunks each
  EXPECT_EQ(r.at("total_input_tokens").as_int64(), 8 * 12);  // the client's estimate
}

TEST(HttpBench, ErrorStatusAndErrorEventsAreFailedRequests) {
  fake_http_server server;
  auto o = small_run(server.url());
  o.dataset = write_dataset({"hello there", "REJECT me", "FAIL midway", "fine"}, 4);
  o.num_prompts = 8;
  o.concurrency = 2;
  ASSERT_EQ(run_bench(o), 0);
  const auto r = read_result(o.result_file);
  expect_consistent(r, 8);
  EXPECT_EQ(r.at("failed").as_int64(), 4);
  const auto& errors = r.at("errors").as_array();
  EXPECT_EQ(errors[1].as_string(), "HTTP 400: prompt rejected by the fake");
  EXPECT_EQ(errors[2].as_string(), "InternalError: injected failure");
  EXPECT_EQ(errors[3].as_string(), "");
}

TEST(HttpBench, ApiKeyIsSentAsBearer) {
  fake_http_server server;
  auto o = small_run(server.url());
  o.api_key = "sekrit";
  o.num_prompts = 2;
  ASSERT_EQ(run_bench(o), 0);
  EXPECT_EQ(server.last_authorization(), "Bearer sekrit");
}

TEST(HttpBench, TimeoutFailsTheRequest) {
  fake_http_config cfg;
  cfg.gap = std::chrono::milliseconds(200);
  fake_http_server server(cfg);
  auto o = small_run(server.url());
  o.num_prompts = 2;
  o.output_len = 1;
  o.timeout_s = 5;
  ASSERT_EQ(run_bench(o), 0);  // the warm-up (1 token) fits in the timeout
  o.output_len = 40;           // 20 chunks x 200 ms: far past 0.5 s
  o.timeout_s = 0.5;
  o.warmup_output_len = 1;
  ASSERT_EQ(run_bench(o), 0);
  const auto r = read_result(o.result_file);
  expect_consistent(r, 2);
  EXPECT_EQ(r.at("failed").as_int64(), 2);
  EXPECT_NE(std::string(r.at("errors").as_array()[0].as_string()).find("timeout"), std::string::npos);
}

TEST(HttpBench, WarmupFailureExitsNonZeroWithTheServersMessage) {
  fake_http_config cfg;
  cfg.status = 500;
  fake_http_server server(cfg);
  std::string err;
  EXPECT_EQ(run_exe("--url " + server.url() + " --num-prompts 4 --no-progress", err), 1);
  EXPECT_NE(err.find("HTTP 500: prompt rejected by the fake"), std::string::npos) << err;
  EXPECT_EQ(server.requests.load(), 1);
}

}  // namespace
}  // namespace anvil::bench
