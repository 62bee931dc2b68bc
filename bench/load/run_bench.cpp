// The driver of one run (see run_bench.h). Everything runs on one io_context on this thread:
// the client's sockets, the arrival timer and the --max-duration timer; completions arrive as
// posted callbacks, so the scheduling state below needs no locks.
#include "bench/load/run_bench.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include <boost/asio.hpp>
#include <boost/json.hpp>

#include "bench/load/arrivals.h"
#include "bench/load/bench_report.h"
#include "bench/load/client.h"
#include "bench/load/progress.h"
#include "bench/load/prompts.h"

namespace anvil::bench {
namespace {

namespace asio = boost::asio;
using steady = std::chrono::steady_clock;

steady::duration to_duration(double s) {
  return std::chrono::duration_cast<steady::duration>(std::chrono::duration<double>(s));
}

// Sends the run's requests on schedule and collects their results.
class request_scheduler {
 public:
  request_scheduler(asio::io_context& io, bench_client& client, const bench_options& o, const std::vector<bench_prompt>& prompts)
      : io_(io), client_(client), prompts_(prompts), offsets_(arrival_offsets(o.num_prompts, effective_rate(o), o.burstiness, o.seed)),
        cap_(in_flight_cap(o)), max_duration_s_(o.max_duration_s), results_(prompts.size()), progress_(o.progress),
        arrival_timer_(io), deadline_timer_(io) {}

  // Runs every request to its end; returns the duration (first send -> last answer) in seconds.
  double run() {
    start_ = steady::now();
    last_done_ = start_;
    progress_.update(0, results_.size(), 0);
    if (max_duration_s_ > 0) {
      deadline_timer_.expires_at(start_ + to_duration(max_duration_s_));
      deadline_timer_.async_wait([this](boost::system::error_code ec) {
        if (!ec) stop_at_deadline();
      });
    }
    launch_due();
    while (finished_ < results_.size() && io_.run_one()) {
    }
    deadline_timer_.cancel();
    arrival_timer_.cancel();
    return std::chrono::duration<double>(last_done_ - start_).count();
  }

  const std::vector<request_result>& results() const { return results_; }

 private:
  bool slot_free() const { return cap_ <= 0 || in_flight_ < std::size_t(cap_); }

  // Sends every request whose time has come while there is room; then waits for the next one.
  void launch_due() {
    if (stopped_) return;
    const auto now = steady::now();
    while (next_ < results_.size() && slot_free() && start_ + to_duration(offsets_[next_]) <= now) launch(next_++);
    if (next_ < results_.size() && slot_free()) {
      arrival_timer_.expires_at(start_ + to_duration(offsets_[next_]));
      arrival_timer_.async_wait([this](boost::system::error_code ec) {
        if (!ec) launch_due();
      });
    }
  }

  void launch(std::size_t i) {
    ++in_flight_;
    const auto& p = prompts_[i];
    client_.send(p, p.output_len, [this, i](request_result r) {
      --in_flight_;
      record(i, std::move(r));
      launch_due();
    });
  }

  void record(std::size_t i, request_result r) {
    if (!r.ok) ++failed_;
    results_[i] = std::move(r);
    ++finished_;
    last_done_ = steady::now();
    progress_.update(finished_, results_.size(), failed_);
  }

  // --max-duration passed: what was not sent fails as not sent, what is in flight is failed by the client.
  void stop_at_deadline() {
    stopped_ = true;
    arrival_timer_.cancel();
    const std::string why = "--max-duration of " + format_seconds(max_duration_s_) + " reached";
    while (next_ < results_.size()) {
      request_result r;
      r.error = "not sent: " + why;
      r.prompt_tokens = prompts_[next_].estimated_input_len;
      record(next_++, std::move(r));
    }
    client_.shutdown(why);
  }

  asio::io_context& io_;                      // the run's io_context
  bench_client& client_;                      // sends requests
  const std::vector<bench_prompt>& prompts_;  // one per request
  std::vector<double> offsets_;               // send offsets (s) from start_
  int cap_;                                   // most requests in flight; 0: no cap
  double max_duration_s_;                     // 0: no limit
  std::vector<request_result> results_;       // one per request
  request_progress progress_;                 // the bar on stderr
  asio::steady_timer arrival_timer_;          // wakes for the next arrival
  asio::steady_timer deadline_timer_;         // --max-duration
  steady::time_point start_;                  // the first send
  steady::time_point last_done_;              // the latest answer
  std::size_t next_ = 0;                      // the next request to send
  std::size_t in_flight_ = 0;                 // sent, not answered
  std::size_t finished_ = 0;                  // answered (or failed)
  std::size_t failed_ = 0;                    // of those, failed
  bool stopped_ = false;                      // the deadline passed
};

// The one short request before the run; its error, or "" when it succeeded.
std::string warm_up(asio::io_context& io, bench_client& client, bench_prompt prompt, int output_len) {
  prompt.output_len = output_len;
  std::optional<request_result> result;
  client.send(prompt, output_len, [&](request_result r) { result = std::move(r); });
  while (!result && io.run_one()) {
  }
  if (!result) return "the warm-up request got no answer";
  return result->ok ? "" : result->error;
}

void print_failures(const std::vector<request_result>& results) {
  std::map<std::string, int> counts;
  for (const auto& r : results)
    if (!r.ok) ++counts[r.error];
  int shown = 0;
  for (const auto& [msg, n] : counts) {
    if (++shown > 5) {
      std::fprintf(stderr, "anvil-bench: ... and %zu other errors\n", counts.size() - 5);
      break;
    }
    std::fprintf(stderr, "anvil-bench: %d request(s) failed: %s\n", n, msg.c_str());
  }
}

}  // namespace

int run_bench(const bench_options& o) {
  if (const std::string err = validate_options(o); !err.empty()) {
    std::fprintf(stderr, "anvil-bench: %s\n", err.c_str());
    return 2;
  }
  std::string err;
  const bench_target target = *parse_target(o.url, err);
  const bool http = target.proto == bench_target::protocol::http;
  auto prompts = make_prompts(o, err);
  if (!prompts) {
    std::fprintf(stderr, "anvil-bench: %s\n", err.c_str());
    return 2;
  }
  if (http && !is_chat_endpoint(o.endpoint))
    for (const auto& p : *prompts)
      if (!p.messages.empty()) {
        std::fprintf(stderr, "anvil-bench: the dataset has messages; use --endpoint /v1/chat/completions\n");
        return 2;
      }

  asio::io_context io;
  client_config cfg;
  cfg.target = target;
  cfg.endpoint = o.endpoint;
  cfg.api_key = o.api_key;
  cfg.timeout_s = o.timeout_s;
  const int cap = in_flight_cap(o) > 0 ? in_flight_cap(o) : o.num_prompts;
  cfg.connections = std::clamp((cap + 63) / 64, 1, 8);
  if (http) cfg.model = o.model.empty() ? discover_model(io, cfg) : o.model;
  auto client = http ? make_http_client(io, cfg) : make_line_client(io, cfg);

  if (const std::string warm = warm_up(io, *client, prompts->front(), std::min(o.warmup_output_len, o.output_len)); !warm.empty()) {
    std::fprintf(stderr, "anvil-bench: the warm-up request to %s failed: %s\n", o.url.c_str(), warm.c_str());
    client->shutdown("warm-up failed");
    io.restart();
    io.poll();
    return 1;
  }

  io.restart();
  request_scheduler scheduler(io, *client, o, *prompts);
  const double duration = scheduler.run();
  client->shutdown("the run is over");
  io.restart();
  io.poll();

  const auto& results = scheduler.results();
  const bench_metrics m = compute_metrics(results, duration, o.goodput, json_percentiles(o.percentiles));
  if (o.print_table) {
    std::fputs(result_table(m, o.percentiles).c_str(), stdout);
    std::fflush(stdout);
  }
  print_failures(results);
  if (!o.result_file.empty()) {
    std::ofstream out(o.result_file);
    out << boost::json::serialize(result_json(m, results, o, http ? cfg.model : std::string())) << "\n";
    if (!out.good()) {
      std::fprintf(stderr, "anvil-bench: cannot write the result file '%s'\n", o.result_file.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace anvil::bench
