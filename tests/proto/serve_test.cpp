// `anvil serve` as a user runs it: the real executable on a tiny model, both ports, a status
// line, requests over TCP and HTTP, and a graceful stop on SIGTERM that lets an accepted request
// finish. (The servers themselves are tested in depth in line_server_test / http tests.)
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/model/fixtures.h"
#include "tests/proto/child_process.h"
#include "tests/proto/line_client.h"
#include "tests/scratch_dir.h"

namespace {

namespace json = boost::json;
using anvil::testing::child;
using anvil::testing::line_client;

std::string http_get(std::uint16_t port, const std::string& path) {
  line_client c(port);  // a raw socket is all HTTP/1.1 needs
  c.send("GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  std::string all;
  while (auto l = c.read_line(std::chrono::seconds(30))) all += *l + "\n";
  return all;
}

TEST(Serve, ServesBothProtocolsAndStopsGracefullyOnSigterm) {
  const std::string model = anvil::model::testing::synth_fixture("tiny", anvil::model::synth_mix::f32);
  child srv({ANVIL_EXE, "serve", "-m", model, "--port", "0", "--line-port", "0", "--status-interval", "0.2",
             "--kv-cache-mib", "16", "--ctx", "256"});
  const std::smatch ready = srv.wait_for(std::regex(R"(ready: model .*http://127\.0\.0\.1:(\d+), line protocol on tcp://127\.0\.0\.1:(\d+))"));
  ASSERT_FALSE(ready.empty()) << srv.output();
  const auto http_port = std::uint16_t(std::stoi(ready[1]));
  const auto line_port = std::uint16_t(std::stoi(ready[2]));

  EXPECT_NE(http_get(http_port, "/health").find("200 OK"), std::string::npos);
  EXPECT_FALSE(srv.wait_for(std::regex(R"(running \d+, waiting \d+, KV [0-9.]+%)")).empty()) << srv.output();

  line_client c(line_port);
  c.send_line(R"({"id":1,"prompt":"Hello","max_tokens":4,"ignore_eos":true,"stream":false})");
  const json::object first = c.read_json();
  EXPECT_EQ(first.at("finish_reason"), "length") << json::serialize(first);

  // A long request in flight when SIGTERM arrives still completes; new ones are refused.
  c.send_line(R"({"id":2,"prompt":"Hello","max_tokens":200,"ignore_eos":true})");
  ASSERT_TRUE(c.read_line());
  srv.signal(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  c.send_line(R"({"id":3,"prompt":"Hello","max_tokens":2})");
  bool finished = false, refused = false;
  std::string seen;
  while (auto line = c.read_line(std::chrono::seconds(60))) {
    seen += *line + "\n";
    const json::object o = json::parse(*line).as_object();
    if (o.at("id") == 2 && o.contains("done")) finished = o.at("finish_reason") == "length";
    if (o.at("id") == 3 && o.contains("error")) refused = o.at("error").at("code") == "stopped";
    if (finished && refused) break;
  }
  EXPECT_TRUE(finished) << seen;
  EXPECT_TRUE(refused) << seen;
  EXPECT_EQ(srv.wait_exit(std::chrono::seconds(60)), 0) << srv.output();
}

// anvil-bench against a live server, over both protocols: every key of the result file is there
// and the counts add up.
TEST(Serve, AnvilBenchMeasuresALiveServerOverBothProtocols) {
  const std::string model = anvil::model::testing::synth_fixture("tiny", anvil::model::synth_mix::f32);
  child srv({ANVIL_EXE, "serve", "-m", model, "--port", "0", "--line-port", "0", "--status-interval", "0",
             "--kv-cache-mib", "16", "--ctx", "256"});
  const std::smatch ready = srv.wait_for(std::regex(R"(http://127\.0\.0\.1:(\d+), line protocol on tcp://127\.0\.0\.1:(\d+))"));
  ASSERT_FALSE(ready.empty()) << srv.output();
  const std::string http_url = "http://127.0.0.1:" + ready[1].str();
  const std::string tcp_url = "tcp://127.0.0.1:" + ready[2].str();
  const auto& dir = anvil::testing::scratch_dir();

  for (const std::string& url : {tcp_url, http_url}) {
    const std::string result = (dir / "result.json").string();
    std::filesystem::remove(result);
    child bench({ANVIL_BENCH_EXE, "--url", url, "--num-prompts", "24", "--concurrency", "6", "--random-token-ids",
                 "--input-len", "24", "--output-len", "12", "--seed", "3", "--max-duration", "120", "--no-progress",
                 "--result-file", result, "--goodput", "ttft:60000"});
    ASSERT_EQ(bench.wait_exit(std::chrono::seconds(180)), 0) << url;
    std::ifstream in(result);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const json::object r = json::parse(text).as_object();
    for (const char* key : {"duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                            "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                            "input_lens", "output_lens", "ttfts", "itls", "errors"}) {
      EXPECT_TRUE(r.contains(key)) << url << " lacks " << key;
    }
    for (const char* metric : {"ttft", "tpot", "itl", "e2el"}) {
      for (const char* stat : {"mean_", "median_", "std_", "p90_", "p99_"}) {
        EXPECT_TRUE(r.contains(std::string(stat) + metric + "_ms")) << url << " lacks " << stat << metric << "_ms";
      }
    }
    EXPECT_EQ(r.at("completed").as_int64(), 24) << url << " " << text.substr(0, 2000);
    EXPECT_EQ(r.at("failed").as_int64(), 0) << url;
    EXPECT_EQ(r.at("total_output_tokens").as_int64(), 24 * 12) << url;
    EXPECT_EQ(r.at("total_input_tokens").as_int64(), 24 * 24) << url;
    std::int64_t out_sum = 0;
    for (const auto& v : r.at("output_lens").as_array()) out_sum += v.as_int64();
    EXPECT_EQ(out_sum, r.at("total_output_tokens").as_int64());
    EXPECT_EQ(r.at("input_lens").as_array().size(), 24u);
    EXPECT_GT(r.at("output_throughput").to_number<double>(), 0.0);
    EXPECT_GT(r.at("mean_ttft_ms").to_number<double>(), 0.0);
  }
  srv.signal(SIGTERM);
  EXPECT_EQ(srv.wait_exit(std::chrono::seconds(60)), 0) << srv.output();
  std::filesystem::remove_all(dir);
}

TEST(Serve, RefusesAMissingModelWithAClearError) {
  child srv({ANVIL_EXE, "serve", "-m", "/nonexistent/model.gguf", "--port", "0", "--line-port", "0"});
  EXPECT_EQ(srv.wait_exit(std::chrono::seconds(30)), 1);
  srv.wait_for(std::regex("$^"), std::chrono::seconds(1));
  EXPECT_NE(srv.output().find("anvil: "), std::string::npos) << srv.output();
}

// Not in the sanitizer builds: their runtimes need descriptors of their own while they check (a
// pipe to probe memory, /proc files), so a process out of descriptors gets false reports there
// (UBSan's vptr check: "object has invalid vptr ... memory cannot be printed") and is stopped.
#if !defined(ANVIL_SANITIZED)

// The process's CPU time so far (user + system), from /proc.
double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));  // after "pid (comm) "
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);
  }
  return ticks / double(::sysconf(_SC_CLK_TCK));
}

// Out of file descriptors (ulimit -n 64, 60 idle clients, a cap that does not stop them): accept
// fails at once while they are gone, and the accept loop must pause (logging it once) instead of
// retrying at full speed; once clients leave, the waiting connections are served.
TEST(Serve, OutOfDescriptorsPausesTheAcceptLoopAndSaysSo) {
  const std::string model = anvil::model::testing::synth_fixture("tiny", anvil::model::synth_mix::f32);
  child srv({"/bin/sh", "-c",
             "ulimit -n 64 && exec \"$0\" serve -m \"$1\" --port 0 --line-port -1 --status-interval 0 --kv-cache-mib 16 "
             "--ctx 256 --idle-spin-us 0 --net-threads 1 --max-connections 1000",
             ANVIL_EXE, model});
  const std::smatch ready = srv.wait_for(std::regex(R"(ready: model .*http://127\.0\.0\.1:(\d+))"));
  ASSERT_FALSE(ready.empty()) << srv.output();
  const auto port = std::uint16_t(std::stoi(ready[1]));

  std::vector<std::unique_ptr<line_client>> idle;
  for (int i = 0; i < 60; ++i) idle.push_back(std::make_unique<line_client>(port));
  EXPECT_FALSE(srv.wait_for(std::regex("cannot accept connections"), std::chrono::seconds(30)).empty()) << srv.output();
  // A loop retrying at once would keep a core busy; paused, the process is nearly idle. (Only a
  // bound that a spinning loop cannot meet on any machine: a slow one makes it pass, never fail.)
  const double before = cpu_seconds(srv.pid());
  std::this_thread::sleep_for(std::chrono::seconds(3));
  EXPECT_LT(cpu_seconds(srv.pid()) - before, 1.0) << "the accept loop spins while out of descriptors";

  idle.clear();
  EXPECT_NE(http_get(port, "/health").find("200 OK"), std::string::npos);
  srv.signal(SIGTERM);
  EXPECT_EQ(srv.wait_exit(std::chrono::seconds(60)), 0) << srv.output();
}
#endif

}  // namespace
