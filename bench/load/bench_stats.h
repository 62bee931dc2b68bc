// bench_stats: what one request measured, and the run's figures computed from all of them the
// way vLLM's benchmark_serving computes them (so numbers compare across tools):
//   TTFT  send -> first chunk carrying text or tokens
//   ITL   the gaps between consecutive chunks, per chunk
//   TPOT  (E2EL - TTFT) / (output tokens - 1), for requests with more than one output token
//   E2EL  send -> the final line / [DONE]
// Percentiles interpolate linearly between order statistics (numpy's default); std is the
// population standard deviation (numpy's default).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bench/load/bench_options.h"

namespace anvil::bench {

// One request's outcome. Times in seconds (as vLLM stores them).
struct request_result {
  bool ok = false;                // completed without an error
  std::string error;              // why it failed; "" when ok
  std::int64_t prompt_tokens = 0;  // input length: as the server reported it, else the client's estimate
  std::int64_t output_tokens = 0;  // generated tokens: the server's usage, else counted from chunks
  double ttft_s = 0;              // send -> first chunk with text/tokens (0 if none arrived)
  std::vector<double> itls_s;     // gaps between consecutive chunks after the first
  double e2el_s = 0;              // send -> end of the answer
};

// Mean, median, standard deviation and the requested percentiles of one latency, in ms.
struct latency_summary {
  double mean_ms = 0;                                 // arithmetic mean (0 for no samples)
  double median_ms = 0;                               // 50th percentile
  double std_ms = 0;                                  // population standard deviation
  std::vector<std::pair<double, double>> percentiles;  // (percentile, value in ms), in the order asked
};

// The run's figures.
struct bench_metrics {
  int completed = 0;                  // requests that finished without error
  int failed = 0;                     // requests that failed (error line, HTTP status, timeout, ...)
  std::int64_t total_input = 0;       // prompt tokens of completed requests
  std::int64_t total_output = 0;      // output tokens of completed requests
  double duration_s = 0;              // first send -> last answer
  double request_throughput = 0;      // completed / duration
  double output_throughput = 0;       // total_output / duration
  double total_token_throughput = 0;  // (total_input + total_output) / duration
  bool has_goodput = false;           // SLOs were given
  double request_goodput = 0;         // requests meeting every SLO / duration
  latency_summary ttft;               // time to first token
  latency_summary tpot;               // time per output token, first excluded
  latency_summary itl;                // inter-token (inter-chunk) latency
  latency_summary e2el;               // end-to-end latency
};

// The p-th percentile (0 <= p <= 100) of `values` by linear interpolation (numpy's default);
// 0 for an empty sample. Takes a copy to sort.
double percentile(std::vector<double> values, double p);

// Summary of samples given in seconds, reported in ms.
latency_summary summarize_ms(const std::vector<double>& seconds, const std::vector<double>& percentiles);

// TPOT of one completed request in seconds, or 0 when it has at most one output token.
double request_tpot_s(const request_result& r);

bench_metrics compute_metrics(const std::vector<request_result>& results, double duration_s, const slo_spec& slo,
                              const std::vector<double>& percentiles);

}  // namespace anvil::bench
