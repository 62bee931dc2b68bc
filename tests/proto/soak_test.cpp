// The soak (label soak): a real `anvil serve` on a tiny model under mixed traffic for
// ANVIL_SOAK_SECONDS (default 75) — clients on both protocols, streamed and not, chat, cancels,
// abrupt disconnects mid-stream, malformed lines and requests mixed in. Throughout, the KV ledger
// from /metrics must balance (free + cached + used == total). At the end: nothing live, no KV
// block in use, no connection open, the server's open file descriptors back to where they were
// before the traffic, its resident memory flat (VmRSS after warm-up vs at the end, within
// ANVIL_SOAK_RSS_TOLERANCE_MIB, default 8), and a clean exit on SIGTERM (under ASan, with no leak).
// Prints a summary: requests by outcome, RSS and fds at start and end.
#include <dirent.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "model/arch/synth.h"
#include "tests/proto/child_process.h"
#include "tests/proto/line_client.h"
#include "tests/proto/raw_http.h"
#include "tests/scratch_dir.h"

namespace {

using namespace anvil::testing;
namespace json = boost::json;
using clock_type = std::chrono::steady_clock;

double env_number(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtod(v, nullptr) : fallback;
}

std::string soak_model() {
  const auto& dir = anvil::testing::scratch_dir();
  anvil::model::synth_options opt;
  opt.shape = *anvil::model::find_synth_shape("tiny");
  opt.mix = anvil::model::synth_mix::f32;
  opt.chat_template =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
      "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  const std::string p = (dir / "tiny-chatml.gguf").string();
  anvil::model::write_synth_model(opt, p);
  return p;
}

std::size_t rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoul(line.substr(6));
  }
  return 0;
}

// The process's open file descriptors and what each is ("socket:[123]", "anon_inode:[eventfd]"),
// less the sanitizer runtimes' transient pipes in those builds.
std::map<int, std::string> open_fds(pid_t pid) {
  std::map<int, std::string> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[256] = {};
    const ssize_t n = ::readlink((dir + "/" + e->d_name).c_str(), target, sizeof target - 1);
    out[std::atoi(e->d_name)] = n > 0 ? std::string(target, std::size_t(n)) : "?";
  }
  ::closedir(d);
#if defined(ANVIL_SANITIZED)
  // The sanitizer runtimes open and close a pipe pair of their own at any moment (to probe whether
  // memory is readable), so a snapshot may hold one: pipes are left out of the comparison there.
  std::erase_if(out, [](const auto& fd) { return fd.second.starts_with("pipe:"); });
#endif
  return out;
}

std::string fd_diff(const std::map<int, std::string>& before, const std::map<int, std::string>& after) {
  std::string out;
  for (const auto& [fd, what] : after) {
    if (!before.contains(fd) || before.at(fd) != what) out += " +" + std::to_string(fd) + "=" + what;
  }
  for (const auto& [fd, what] : before) {
    if (!after.contains(fd)) out += " -" + std::to_string(fd) + "=" + what;
  }
  return out;
}

// The metrics the soak watches, from one GET /metrics (empty when there was no answer).
std::map<std::string, double> metrics(std::uint16_t port) {
  std::map<std::string, double> out;
  const auto r = http_exchange(port, http_request_bytes("GET", "/metrics", "", {"Connection: close"}), 30s);
  if (!r || r->status != 200) return out;
  std::size_t at = 0;
  while (at < r->body.size()) {
    std::size_t end = r->body.find('\n', at);
    if (end == std::string::npos) end = r->body.size();
    const std::string line = r->body.substr(at, end - at);
    at = end + 1;
    if (line.empty() || line[0] == '#') continue;
    const std::size_t sp = line.rfind(' ');
    if (sp != std::string::npos) out[line.substr(0, sp)] = std::strtod(line.c_str() + sp + 1, nullptr);
  }
  return out;
}

// Outcomes by name, from every client thread.
class tally {
 public:
  void add(const std::string& outcome) {
    std::lock_guard lock(mu_);
    ++counts_[outcome];
  }
  void unexpected(const std::string& what) {
    std::lock_guard lock(mu_);
    ++counts_["UNEXPECTED"];
    if (examples_.size() < 10) examples_.push_back(what);
  }
  std::map<std::string, int> counts() {
    std::lock_guard lock(mu_);
    return counts_;
  }
  std::vector<std::string> examples() {
    std::lock_guard lock(mu_);
    return examples_;
  }

 private:
  std::mutex mu_;
  std::map<std::string, int> counts_;
  std::vector<std::string> examples_;
};

// One client's loop: picks a kind of exchange at random until the deadline.
class soak_client {
 public:
  soak_client(std::uint16_t line_port, std::uint16_t http_port, std::uint64_t seed, tally& t)
      : line_port_(line_port), http_port_(http_port), rng_(seed), t_(t) {}

  void run(clock_type::time_point until) {
    while (clock_type::now() < until) {
      try {
        switch (pick(10)) {
          case 0: line_stream(false); break;
          case 1: line_stream(true); break;
          case 2: line_cancel(); break;
          case 3: line_gone_mid_stream(); break;
          case 4: line_malformed(); break;
          case 5: http_completion(false); break;
          case 6: http_completion(true); break;
          case 7: http_chat(); break;
          case 8: http_gone_mid_stream(); break;
          default: http_malformed(); break;
        }
      } catch (const std::exception& e) {
        t_.unexpected(std::string("exception: ") + e.what());
      }
    }
  }

 private:
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  json::array prompt() {
    json::array p;
    for (int i = 0, n = 1 + pick(60); i < n; ++i) p.push_back(1 + pick(300));
    return p;
  }

  line_client& line() {
    if (!line_) line_ = std::make_unique<line_client>(line_port_);
    return *line_;
  }

  // Reads request `id`'s lines to its final one; returns it (an "error" line when the server
  // refused it) after checking the streamed tokens add up.
  json::object line_until_end(line_client& c, const json::value& id, std::size_t* chunks = nullptr) {
    std::size_t tokens = 0, n = 0;
    for (;;) {
      json::object o = c.read_json(120s);
      if (o.at("id") != id) throw std::runtime_error("a line for another id: " + json::serialize(o));
      if (o.contains("error") || o.contains("done")) {
        if (o.contains("done") && o.at("finish_reason") != "cancelled" && !o.contains("text") &&
            std::size_t(o.at("usage").at("completion_tokens").as_int64()) != tokens) {
          t_.unexpected("streamed tokens do not add up: " + json::serialize(o));
        }
        if (chunks) *chunks = n;
        return o;
      }
      tokens += o.at("tokens").as_array().size();
      ++n;
    }
  }

  void count_final(const json::object& o, const char* kind) {
    if (const json::value* e = o.if_contains("error")) {
      if (e->at("code") == "overloaded") return t_.add("overloaded");
      return t_.unexpected(std::string(kind) + ": " + json::serialize(o));
    }
    const std::string reason(o.at("finish_reason").as_string());
    t_.add(std::string(kind) + " " + reason);
  }

  void line_stream(bool stream) {
    const json::value id = ++serial_;
    json::object req{{"id", id}, {"prompt", prompt()}, {"max_tokens", 1 + pick(48)}, {"stream", stream}};
    if (pick(2)) {
      req["temperature"] = 0.8;
      req["seed"] = pick(1000);
    }
    if (pick(3) == 0) req["stop"] = json::array{"ab", "\n"};
    line().send_line(json::serialize(req));
    count_final(line_until_end(line(), id), stream ? "line stream" : "line whole");
  }

  void line_cancel() {
    const json::value id = ++serial_;
    line().send_line(json::serialize(json::object{{"id", id}, {"prompt", prompt()}, {"max_tokens", 200}, {"ignore_eos", true}}));
    const json::object first = line().read_json(120s);
    if (first.contains("error")) return count_final(first, "line cancel");
    line().send_line(json::serialize(json::object{{"cancel", id}}));
    const json::object end = line_until_end(line(), id);
    if (end.at("finish_reason") != "cancelled" && end.at("finish_reason") != "length") {
      return t_.unexpected("cancel: " + json::serialize(end));
    }
    t_.add("line cancel " + std::string(end.at("finish_reason").as_string()));
    // A request that finished before its cancel arrived may get an unknown_id answer to it as
    // well: a probe (answered after it, in order) tells where this exchange ends.
    line().send_line(R"({"cancel":"probe"})");
    for (;;) {
      const json::object o = line().read_json(60s);
      if (o.at("id") == "probe") break;
      if (o.at("id") != id || o.at("error").at("code") != "unknown_id") return t_.unexpected("after cancel: " + json::serialize(o));
    }
  }

  void line_gone_mid_stream() {
    line_client c(line_port_);
    for (int i = 0; i < 1 + pick(4); ++i) {
      c.send_line(json::serialize(json::object{{"id", i}, {"prompt", prompt()}, {"max_tokens", 300}, {"ignore_eos", true}}));
    }
    if (!c.read_line(120s)) return t_.unexpected("line: nothing before the disconnect");
    t_.add("line disconnect mid-stream");
  }  // closed with requests in flight

  void line_malformed() {
    static const char* bad[] = {"{\"id\":1,\"prompt\":", "not json", "{\"id\":2,\"prompt\":[1],\"top_p\":7}",
                                "{\"id\":3,\"prompt\":\"\\ud800\"}", "[1,2,3]", "{\"id\":4,\"prompt\":[99999999]}",
                                "{\"cancel\":\"nobody\"}"};
    line().send_line(bad[pick(7)]);
    const json::object o = line().read_json(60s);
    if (!o.contains("error")) return t_.unexpected("malformed line answered: " + json::serialize(o));
    t_.add("line malformed");
  }

  void http_completion(bool stream) {
    json::object req{{"prompt", prompt()}, {"max_tokens", 1 + pick(48)}, {"stream", stream}};
    if (pick(2)) req["n"] = 1 + pick(3);
    if (stream && pick(2)) req["stream_options"] = json::object{{"include_usage", true}};
    if (!web_) web_ = std::make_unique<line_client>(http_port_);  // keep-alive
    web_->send(http_request_bytes("POST", "/v1/completions", json::serialize(req)));
    const auto r = read_http_reply(*web_, 120s);
    if (!r) {
      web_.reset();
      return t_.unexpected("http: no answer");
    }
    if (r->status == 429) return t_.add("overloaded");
    if (r->status != 200) return t_.unexpected("http " + std::to_string(r->status) + ": " + r->body);
    if (stream && r->body.rfind("data: [DONE]\n\n") != r->body.size() - 14) return t_.unexpected("no [DONE]: " + r->body);
    if (!stream && !r->json().as_object().contains("usage")) return t_.unexpected("no usage: " + r->body);
    t_.add(stream ? "http stream" : "http whole");
  }

  void http_chat() {
    json::object req{{"messages", json::array{json::object{{"role", "user"}, {"content", "Hello number " + std::to_string(pick(100))}}}},
                     {"max_tokens", 1 + pick(32)}, {"stream", pick(2) == 0}};
    const auto r = http_exchange(http_port_, http_request_bytes("POST", "/v1/chat/completions", json::serialize(req)), 120s);
    if (!r) return t_.unexpected("chat: no answer");
    if (r->status == 429) return t_.add("overloaded");
    if (r->status != 200) return t_.unexpected("chat " + std::to_string(r->status) + ": " + r->body);
    t_.add("http chat");
  }

  void http_gone_mid_stream() {
    line_client c(http_port_);
    const json::object req{{"prompt", prompt()}, {"max_tokens", 300}, {"ignore_eos", true}, {"stream", true}, {"n", 1 + pick(2)}};
    c.send(http_request_bytes("POST", "/v1/completions", json::serialize(req)));
    if (!c.read_until("data: ", 120s)) return t_.unexpected("http: nothing before the disconnect");
    t_.add("http disconnect mid-stream");
  }

  void http_malformed() {
    static const char* bad[] = {"GARBAGE\r\n\r\n", "POST /v1/completions HTTP/1.1\r\nContent-Length: x\r\n\r\n",
                                "POST /v1/completions HTTP/1.1\r\nContent-Length: 9\r\n\r\n{not json",
                                "GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n", "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"};
    const int k = pick(5);
    const auto r = http_exchange(http_port_, bad[k], 60s);
    const unsigned want = k == 3 ? 404 : 400;
    if (!r || r->status != want) return t_.unexpected("malformed http: " + (r ? std::to_string(r->status) : std::string("no answer")));
    t_.add("http malformed");
  }

  std::uint16_t line_port_, http_port_;
  std::mt19937_64 rng_;
  tally& t_;
  std::unique_ptr<line_client> line_, web_;
  std::int64_t serial_ = 0;
};

TEST(Soak, MixedTrafficLeavesNoTraceAndTheLedgerBalancesThroughout) {
  const double seconds = env_number("ANVIL_SOAK_SECONDS", 75);
  const double tolerance_mib = env_number("ANVIL_SOAK_RSS_TOLERANCE_MIB", 8);
  const int n_clients = int(env_number("ANVIL_SOAK_CLIENTS", 6));
  const std::string model = soak_model();
  // A small ASan quarantine, so freed memory is reused instead of held: RSS then means something.
  // One OpenMP thread: the soak is about the servers, and spinning kernel threads on a busy CI
  // machine would only slow the traffic down.
  child srv({ANVIL_EXE, "serve", "-m", model, "--port", "0", "--line-port", "0", "--status-interval", "0", "--ctx", "512",
             "--kv-cache-mib", "4", "--max-seqs", "16", "--max-queue", "48", "--max-prefill-chunk", "32"},
            {"ASAN_OPTIONS=quarantine_size_mb=4:thread_local_quarantine_size_kb=64:malloc_context_size=5", "OMP_NUM_THREADS=1"});
  const std::smatch ready = srv.wait_for(std::regex(R"(http://127\.0\.0\.1:(\d+), line protocol on tcp://127\.0\.0\.1:(\d+))"));
  ASSERT_FALSE(ready.empty()) << srv.output();
  const auto http_port = std::uint16_t(std::stoi(ready[1]));
  const auto line_port = std::uint16_t(std::stoi(ready[2]));
  const pid_t pid = srv.pid();

  const auto fds_before = open_fds(pid);
  const std::size_t rss_start = rss_kib(pid);
  ASSERT_FALSE(fds_before.empty());
  const auto m0 = metrics(http_port);
  ASSERT_FALSE(m0.empty());
  ASSERT_EQ(m0.at("anvil_kv_blocks_used"), 0);

  tally t;
  const auto start = clock_type::now();
  const auto until = start + std::chrono::milliseconds(std::int64_t(seconds * 1000));
  const auto warm = start + std::chrono::milliseconds(std::int64_t(seconds * 1000 * 0.25));
  std::vector<std::thread> clients;
  for (int i = 0; i < n_clients; ++i) {
    clients.emplace_back([&, i] { soak_client(line_port, http_port, 1000 + std::uint64_t(i), t).run(until); });
  }

  // The ledger, checked every half second while the traffic runs; RSS sampled after warm-up.
  int ledger_checks = 0, ledger_breaks = 0;
  std::size_t rss_warm = 0, rss_peak = 0;
  std::string ledger_example;
  while (clock_type::now() < until) {
    std::this_thread::sleep_for(500ms);
    const auto m = metrics(http_port);
    if (m.empty()) {
      ledger_example = "no /metrics answer";
      ++ledger_breaks;
      continue;
    }
    ++ledger_checks;
    const double total = m.at("anvil_kv_blocks_total"), used = m.at("anvil_kv_blocks_used"),
                 cached = m.at("anvil_kv_blocks_cached"), free = m.at("anvil_kv_blocks_free");
    if (used + cached + free != total || used < 0 || total <= 0) {
      ++ledger_breaks;
      ledger_example = "used " + std::to_string(used) + " cached " + std::to_string(cached) + " free " + std::to_string(free) +
                       " total " + std::to_string(total);
    }
    const std::size_t rss = rss_kib(pid);
    rss_peak = std::max(rss_peak, rss);
    if (rss_warm == 0 && clock_type::now() >= warm) rss_warm = rss;
  }
  for (auto& c : clients) c.join();

  // Quiet: nothing live, no block in use, no connection but this one.
  std::map<std::string, double> end;
  for (int i = 0; i < 600; ++i) {
    end = metrics(http_port);
    if (!end.empty() && end.at("anvil_requests_live") == 0 && end.at("anvil_kv_blocks_used") == 0 &&
        end.at("anvil_requests_running") == 0 && end.at("anvil_requests_waiting") == 0 &&
        end.at("anvil_connections{protocol=\"line\"}") == 0 && end.at("anvil_connections{protocol=\"http\"}") == 1) {
      break;
    }
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_FALSE(end.empty());
  EXPECT_EQ(end.at("anvil_requests_live"), 0);
  EXPECT_EQ(end.at("anvil_kv_blocks_used"), 0);
  EXPECT_EQ(end.at("anvil_requests_running") + end.at("anvil_requests_waiting"), 0);
  EXPECT_EQ(end.at("anvil_connections{protocol=\"line\"}"), 0);
  EXPECT_EQ(end.at("anvil_connections{protocol=\"http\"}"), 1);  // the /metrics request itself
  EXPECT_EQ(end.at("anvil_kv_blocks_used") + end.at("anvil_kv_blocks_cached") + end.at("anvil_kv_blocks_free"),
            end.at("anvil_kv_blocks_total"));
  auto fds_after = open_fds(pid);
  for (int i = 0; i < 300 && fds_after.size() != fds_before.size(); ++i) {  // the last /metrics connection closing
    std::this_thread::sleep_for(100ms);
    fds_after = open_fds(pid);
  }
  const std::size_t rss_end = rss_kib(pid);

  const auto counts = t.counts();
  int total = 0;
  std::printf("soak: %.0f s, %d clients\n", seconds, n_clients);
  for (const auto& [outcome, n] : counts) {
    std::printf("  %-32s %d\n", outcome.c_str(), n);
    total += n;
  }
  const double finished = end.at("anvil_requests_total{finish_reason=\"stop\"}") + end.at("anvil_requests_total{finish_reason=\"length\"}");
  std::printf("  %-32s %d\n", "exchanges", total);
  std::printf("  engine: %.0f finished, %.0f cancelled, %.0f errors, %.0f rejected\n", finished,
              end.at("anvil_requests_total{finish_reason=\"cancelled\"}"), end.at("anvil_requests_total{finish_reason=\"error\"}"),
              end.at("anvil_requests_rejected_total"));
  std::printf("  ledger: %d checks, %d broken\n", ledger_checks, ledger_breaks);
  std::printf("  RSS: start %.1f MiB, after warm-up %.1f MiB, peak %.1f MiB, end %.1f MiB (tolerance %.0f MiB)\n",
              double(rss_start) / 1024, double(rss_warm) / 1024, double(rss_peak) / 1024, double(rss_end) / 1024, tolerance_mib);
  std::printf("  fds: start %zu, end %zu\n", fds_before.size(), fds_after.size());

  EXPECT_EQ(counts.count("UNEXPECTED"), 0u);
  for (const std::string& e : t.examples()) ADD_FAILURE() << e;
  EXPECT_GT(total, 30);
  EXPECT_GT(ledger_checks, 10);
  EXPECT_EQ(ledger_breaks, 0) << ledger_example;
  EXPECT_EQ(end.at("anvil_requests_total{finish_reason=\"error\"}"), 0);
  EXPECT_GT(end.at("anvil_requests_total{finish_reason=\"cancelled\"}"), 0);
  EXPECT_EQ(fds_after.size(), fds_before.size()) << "open descriptors changed:" << fd_diff(fds_before, fds_after);
  ASSERT_GT(rss_warm, 0u);
  EXPECT_LE(double(rss_end), double(rss_warm) + tolerance_mib * 1024) << "resident memory grew after warm-up";

  srv.signal(SIGTERM);
  EXPECT_EQ(srv.wait_exit(std::chrono::seconds(120)), 0) << srv.output();
  std::filesystem::remove_all(std::filesystem::path(model).parent_path());
}

}  // namespace
