// anvil-bench against a fake line-protocol server: counts, failures of every kind, bounds,
// warm-up, auth, and the executable end to end.
#include <chrono>

#include <gtest/gtest.h>

#include "bench/load/run_bench.h"
#include "tests/bench/bench_test_util.h"
#include "tests/bench/fake_servers.h"

namespace anvil::bench {
namespace {
using namespace anvil::bench::testing;

TEST(LineBench, RandomTokenIdsGiveExactCountsThatAddUp) {
  fake_line_server server;
  auto o = small_run(server.url());
  o.num_prompts = 12;
  o.concurrency = 4;
  o.random_token_ids = true;
  o.input_len = 16;
  o.output_len = 5;
  ASSERT_EQ(run_bench(o), 0);
  const auto r = read_result(o.result_file);
  expect_consistent(r, 12);
  EXPECT_EQ(r.at("completed").as_int64(), 12);
  EXPECT_EQ(r.at("total_input_tokens").as_int64(), 12 * 16);
  EXPECT_EQ(r.at("total_output_tokens").as_int64(), 12 * 5);
  for (const auto& v : r.at("input_lens").as_array()) EXPECT_EQ(v.as_int64(), 16);
  for (const auto& v : r.at("itls").as_array()) EXPECT_EQ(v.as_array().size(), 4u);  // 5 chunks
  for (const auto& v : r.at("ttfts").as_array()) EXPECT_GT(v.as_double(), 0.0);
  EXPECT_GT(r.at("mean_tpot_ms").as_double(), 0.0);
  EXPECT_GT(r.at("p99_e2el_ms").as_double(), 0.0);
  EXPECT_LE(server.max_in_flight.load(), 4);
  EXPECT_EQ(server.requests.load(), 13);  // and the warm-up
  EXPECT_EQ(server.connections.load(), 1);  // multiplexed on one connection
}

TEST(LineBench, ErrorLinesAndDroppedConnectionsAreFailedRequests) {
  fake_line_server server;
  auto o = small_run(server.url());
  o.dataset = write_dataset({"hello world", "please FAIL now", "REJECT this", "fine again"}, 3);
  o.num_prompts = 8;
  ASSERT_EQ(run_bench(o), 0);
  const auto r = read_result(o.result_file);
  expect_consistent(r, 8);
  EXPECT_EQ(r.at("failed").as_int64(), 4);
  const auto& errors = r.at("errors").as_array();
  EXPECT_EQ(errors[1].as_string(), "internal: injected failure");
  EXPECT_EQ(errors[2].as_string(), "invalid_request: rejected by the fake");
  EXPECT_EQ(errors[3].as_string(), "");
  EXPECT_EQ(r.at("total_output_tokens").as_int64(), 4 * 3);  // from the dataset's output_len
}

TEST(LineBench, AClosedConnectionFailsWhatItCarried) {
  fake_line_server server;
  auto o = small_run(server.url());
  o.dataset = write_dataset({"hello world", "DROP it"}, 3);
  o.num_prompts = 6;
  o.concurrency = 1;  // one at a time: a drop fails only itself, the next request reconnects
  ASSERT_EQ(run_bench(o), 0);
  const auto r = read_result(o.result_file);
  expect_consistent(r, 6);
  EXPECT_EQ(r.at("failed").as_int64(), 3);
  EXPECT_NE(std::string(r.at("errors").as_array()[1].as_string()).find("connection closed"), std::string::npos);
}

TEST(LineBench, TimeoutFailsTheRequestAndCancelsIt) {
  fake_line_server server;
  auto o = small_run(server.url());
  o.dataset = write_dataset({"quick", "SLOW one"}, 2);
  o.num_prompts = 4;
  o.timeout_s = 0.3;
  ASSERT_EQ(run_bench(o), 0);
  const auto r = read_result(o.result_file);
  expect_consistent(r, 4);
  EXPECT_EQ(r.at("failed").as_int64(), 2);
  EXPECT_NE(std::string(r.at("errors").as_array()[1].as_string()).find("timeout"), std::string::npos);
  for (int i = 0; i < 100 && server.cancels.load() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(server.cancels.load(), 2);
}

TEST(LineBench, MaxDurationBoundsTheRun) {
  fake_line_server server;
  auto o = small_run(server.url());
  o.dataset = write_dataset({"quick", "SLOW one"}, 2);
  o.num_prompts = 40;
  o.request_rate = 10;  // arrivals over about 4 s
  o.max_duration_s = 0.5;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(run_bench(o), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  const auto r = read_result(o.result_file);
  expect_consistent(r, 40);
  EXPECT_GT(r.at("failed").as_int64(), 20);
  EXPECT_LT(r.at("duration").as_double(), 1.5);
  int not_sent = 0, cut = 0;
  for (const auto& e : r.at("errors").as_array()) {
    const std::string s(e.as_string());
    not_sent += s.rfind("not sent", 0) == 0;
    cut += s.rfind("--max-duration", 0) == 0;
  }
  EXPECT_GT(not_sent, 0);
  EXPECT_GT(cut, 0);  // the slow ones in flight
}

TEST(LineBench, RateWithMaxConcurrencyCapsRequestsInFlight) {
  fake_line_config cfg;
  cfg.gap = std::chrono::milliseconds(5);
  fake_line_server server(cfg);
  auto o = small_run(server.url());
  o.num_prompts = 10;
  o.request_rate = 1000;
  o.max_concurrency = 2;
  ASSERT_EQ(run_bench(o), 0);
  expect_consistent(read_result(o.result_file), 10);
  EXPECT_LE(server.max_in_flight.load(), 2);
}

TEST(LineBench, WarmupFailureIsAnErrorExit) {
  fake_line_config cfg;
  cfg.fail_all = true;
  fake_line_server server(cfg);
  auto o = small_run(server.url());
  EXPECT_EQ(run_bench(o), 1);
  EXPECT_EQ(server.requests.load(), 1);  // the run never started

  // Nothing listening: connection refused.
  std::uint16_t closed_port = 0;
  {
    boost::asio::io_context io;
    tcp::acceptor a(io, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
    closed_port = a.local_endpoint().port();
  }
  o.url = "tcp://127.0.0.1:" + std::to_string(closed_port);
  EXPECT_EQ(run_bench(o), 1);
}

TEST(LineBench, AuthLineGoesFirst) {
  fake_line_config cfg;
  cfg.api_key = "sekrit";
  fake_line_server server(cfg);
  auto o = small_run(server.url());
  o.api_key = "sekrit";
  ASSERT_EQ(run_bench(o), 0);
  EXPECT_EQ(read_result(o.result_file).at("completed").as_int64(), 8);
  o.api_key = "wrong";
  EXPECT_EQ(run_bench(o), 1);
  o.api_key = "";
  EXPECT_EQ(run_bench(o), 1);
}

TEST(LineBench, MessagesDataset) {
  fake_line_server server;
  auto o = small_run(server.url());
  o.dataset = temp_path("chat.jsonl");
  {
    std::ofstream out(o.dataset);
    out << R"({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "output_len": 2})" << "\n";
  }
  o.num_prompts = 3;
  ASSERT_EQ(run_bench(o), 0);
  const auto r = read_result(o.result_file);
  expect_consistent(r, 3);
  EXPECT_EQ(r.at("total_input_tokens").as_int64(), 3 * 6);  // the fake counts 3 per message
  EXPECT_EQ(r.at("total_output_tokens").as_int64(), 3 * 2);
}

TEST(LineBench, ExecutableWritesTheResultFile) {
  fake_line_server server;
  const std::string result = temp_path("exe_result.json");
  std::string err;
  const int rc = run_exe("--url " + server.url() +
                             " --num-prompts 6 --concurrency 2 --input-len 8 --output-len 3 --random-token-ids --seed 3"
                             " --goodput ttft:10000 e2el:20000 --percentiles 50,95 --no-progress --result-file " + result,
                         err);
  ASSERT_EQ(rc, 0) << err;
  const auto r = read_result(result);
  expect_consistent(r, 6);
  EXPECT_EQ(r.at("completed").as_int64(), 6);
  EXPECT_GT(r.at("request_goodput").as_double(), 0.0);
  EXPECT_TRUE(r.contains("p95_ttft_ms"));
  EXPECT_EQ(r.at("config").as_object().at("concurrency").as_int64(), 2);
  EXPECT_EQ(r.at("config").as_object().at("seed").as_int64(), 3);

  EXPECT_EQ(run_exe("--url " + server.url() + " --concurrency 2 --request-rate 5", err), 2);
  EXPECT_NE(err.find("not both"), std::string::npos) << err;
}

}  // namespace
}  // namespace anvil::bench
