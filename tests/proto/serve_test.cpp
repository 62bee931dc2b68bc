// `anvil serve` as a user runs it: the real executable on a tiny model, both ports, a status
// line, requests over TCP and HTTP, and a graceful stop on SIGTERM that lets an accepted request
// finish. (The servers themselves are tested in depth in line_server_test / http tests.)
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <thread>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/model/fixtures.h"
#include "tests/proto/line_client.h"

extern char** environ;

namespace {

namespace json = boost::json;
using anvil::testing::line_client;

// A child process with its stdout (and stderr) read through a pipe.
class child {
 public:
  explicit child(std::vector<std::string> args) {
    int out[2];
    if (::pipe(out) != 0) throw std::runtime_error("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) throw std::runtime_error("spawn");
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    fd_ = out[0];
  }
  ~child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  // Reads output until `re` matches a line (returned), or end of output / timeout ("").
  std::smatch wait_for(const std::regex& re, std::chrono::seconds timeout = std::chrono::seconds(60)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      for (std::size_t nl; (nl = buf_.find('\n')) != std::string::npos;) {
        line_ = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        all_ += line_ + "\n";
        std::smatch m;
        if (std::regex_search(line_, m, re)) return m;
      }
      pollfd p{fd_, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || ::poll(&p, 1, int(left.count())) <= 0) return {};
      char tmp[4096];
      const ssize_t n = ::read(fd_, tmp, sizeof tmp);
      if (n <= 0) return {};
      buf_.append(tmp, std::size_t(n));
    }
  }
  void signal(int sig) { ::kill(pid_, sig); }
  // The exit status, or -1 if it did not exit within `timeout`.
  int wait_exit(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
  const std::string& output() const { return all_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string buf_, line_, all_;
};

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
  const auto dir = std::filesystem::temp_directory_path() / ("anvil_bench_live_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);

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

}  // namespace
