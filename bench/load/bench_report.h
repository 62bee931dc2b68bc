// bench_report: the run's results as vLLM's benchmark_serving reports them — the printed table
// and the JSON result file with vLLM's key names — so existing scripts and habits carry over.
//
// JSON keys: duration, completed, failed, total_input_tokens, total_output_tokens,
// request_throughput, request_goodput (null without --goodput), output_throughput,
// total_token_throughput; for each of ttft, tpot, itl, e2el: mean_X_ms, median_X_ms, std_X_ms
// and pNN_X_ms per percentile; per-request arrays input_lens, output_lens (0 for failed
// requests), ttfts and itls (seconds, as vLLM), errors ("" when ok); and a config object.
#pragma once

#include <string>
#include <vector>

#include <boost/json/object.hpp>

#include "bench/load/bench_options.h"
#include "bench/load/bench_stats.h"

namespace anvil::bench {

// The percentiles the JSON carries: the requested ones, plus 90 and 99 always.
std::vector<double> json_percentiles(const std::vector<double>& requested);

// "99" for 99, "99.9" for 99.9 (vLLM's spelling in pNN_ keys and table rows).
std::string percentile_word(double p);

// `metrics` must be computed over json_percentiles(o.percentiles); `model` is what the requests
// named ("" for the line protocol).
boost::json::object result_json(const bench_metrics& metrics, const std::vector<request_result>& results,
                                const bench_options& o, const std::string& model);

// The table printed at the end; rows for the percentiles in `shown`.
std::string result_table(const bench_metrics& metrics, const std::vector<double>& shown);

}  // namespace anvil::bench
