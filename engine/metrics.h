// Request metrics the engine keeps for every client (in-process, TCP, HTTP): latency histograms
// and counters. Plain values; the engine updates them on its streams strand and hands out copies.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace anvil {

// A histogram with fixed upper bounds, as Prometheus exposes them: counts[i] holds observations
// <= bounds[i] and above bounds[i-1]; counts.back() those above every bound (+Inf).
struct histogram {
  std::vector<double> bounds;         // ascending upper bounds
  std::vector<std::uint64_t> counts;  // bounds.size() + 1 buckets, not cumulative
  double sum = 0;                     // of every observation
  std::uint64_t count = 0;            // observations

  histogram() = default;
  explicit histogram(std::span<const double> upper_bounds);
  void observe(double v);
};

// Bounds in milliseconds for time to first token, inter-token gaps and whole requests.
std::span<const double> latency_buckets_ms();

struct request_metrics {
  std::uint64_t submitted = 0;           // requests accepted by submit
  std::uint64_t rejected = 0;            // requests submit refused (invalid, overloaded, context)
  std::uint64_t finished_stop = 0;       // ended by EOS or a stop string
  std::uint64_t finished_length = 0;     // ended by max_tokens or the context
  std::uint64_t finished_cancelled = 0;  // cancelled by the client (or its disconnect)
  std::uint64_t finished_error = 0;      // failed by the engine
  std::uint64_t prompt_tokens = 0;       // of finished requests
  std::uint64_t completion_tokens = 0;   // generated, of finished requests
  histogram queue_ms{latency_buckets_ms()};  // submit to the first step that fed the request
  histogram ttft_ms{latency_buckets_ms()};   // submit to the first generated token
  histogram itl_ms{latency_buckets_ms()};    // between consecutive tokens of a request
  histogram e2e_ms{latency_buckets_ms()};    // submit to the end
};

}  // namespace anvil
