#include "bench/load/bench_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <string_view>

#include <boost/json.hpp>

namespace anvil::bench {
namespace json = boost::json;
namespace {

// Concatenation by append (GCC 12 warns falsely about -Wrestrict on chains of operator+).
std::string cat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (auto p : parts) out.append(p);
  return out;
}

// Python's "{:c^50}".format(s): centred, the odd pad character on the right.
std::string centred(const std::string& s, char c, std::size_t width = 50) {
  if (s.size() >= width) return s;
  const std::size_t pad = width - s.size(), left = pad / 2;
  return std::string(left, c) + s + std::string(pad - left, c);
}

std::string row(const std::string& label, const std::string& value) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%-40s %s\n", label.c_str(), value.c_str());
  return buf;
}

std::string fixed2(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

void add_latency(json::object& o, const std::string& name, const latency_summary& s) {
  o[cat({"mean_", name, "_ms"})] = s.mean_ms;
  o[cat({"median_", name, "_ms"})] = s.median_ms;
  o[cat({"std_", name, "_ms"})] = s.std_ms;
  for (const auto& [p, v] : s.percentiles) o[cat({"p", percentile_word(p), "_", name, "_ms"})] = v;
}

std::string latency_rows(const std::string& header, const std::string& name, const latency_summary& s,
                         const std::vector<double>& shown) {
  std::string out = centred(header, '-') + "\n";
  out += row(cat({"Mean ", name, " (ms):"}), fixed2(s.mean_ms));
  out += row(cat({"Median ", name, " (ms):"}), fixed2(s.median_ms));
  for (const auto& [p, v] : s.percentiles)
    if (std::find(shown.begin(), shown.end(), p) != shown.end()) out += row(cat({"P", percentile_word(p), " ", name, " (ms):"}), fixed2(v));
  return out;
}

json::value rate_value(double r) { return std::isfinite(r) ? json::value(r) : json::value("inf"); }

json::object config_json(const bench_options& o, const std::string& model) {
  json::object c;
  c["url"] = o.url;
  c["endpoint"] = o.endpoint;
  c["model"] = model;
  c["concurrency"] = o.concurrency;
  c["request_rate"] = rate_value(effective_rate(o));
  c["burstiness"] = o.burstiness;
  c["max_concurrency"] = in_flight_cap(o) > 0 ? json::value(in_flight_cap(o)) : json::value(nullptr);
  c["num_prompts"] = o.num_prompts;
  c["input_len"] = o.input_len;
  c["output_len"] = o.output_len;
  c["random_token_ids"] = o.random_token_ids;
  c["dataset"] = o.dataset;
  c["seed"] = static_cast<std::int64_t>(o.seed);  // an integer, as vLLM writes it
  c["timeout"] = o.timeout_s;
  c["max_duration"] = o.max_duration_s;
  return c;
}

}  // namespace

std::vector<double> json_percentiles(const std::vector<double>& requested) {
  std::vector<double> out = requested;
  for (double p : {90.0, 99.0})
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  return out;
}

std::string percentile_word(double p) {
  if (p == std::floor(p)) return std::to_string(static_cast<long long>(p));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", p);
  return buf;
}

json::object result_json(const bench_metrics& m, const std::vector<request_result>& results, const bench_options& o,
                         const std::string& model) {
  json::object r;
  r["duration"] = m.duration_s;
  r["completed"] = m.completed;
  r["failed"] = m.failed;
  r["total_input_tokens"] = m.total_input;
  r["total_output_tokens"] = m.total_output;
  r["request_throughput"] = m.request_throughput;
  r["request_goodput"] = m.has_goodput ? json::value(m.request_goodput) : json::value(nullptr);
  r["output_throughput"] = m.output_throughput;
  r["total_token_throughput"] = m.total_token_throughput;
  add_latency(r, "ttft", m.ttft);
  add_latency(r, "tpot", m.tpot);
  add_latency(r, "itl", m.itl);
  add_latency(r, "e2el", m.e2el);
  json::array input_lens, output_lens, ttfts, itls, errors;
  for (const auto& q : results) {
    input_lens.emplace_back(q.prompt_tokens);
    output_lens.emplace_back(q.ok ? q.output_tokens : 0);
    ttfts.emplace_back(q.ok ? q.ttft_s : 0.0);
    json::array gaps;
    if (q.ok)
      for (double g : q.itls_s) gaps.emplace_back(g);
    itls.emplace_back(std::move(gaps));
    errors.emplace_back(q.ok ? std::string() : q.error);
  }
  r["input_lens"] = std::move(input_lens);
  r["output_lens"] = std::move(output_lens);
  r["ttfts"] = std::move(ttfts);
  r["itls"] = std::move(itls);
  r["errors"] = std::move(errors);
  r["config"] = config_json(o, model);
  return r;
}

std::string result_table(const bench_metrics& m, const std::vector<double>& shown) {
  std::string out = centred(" Serving Benchmark Result ", '=') + "\n";
  out += row("Successful requests:", std::to_string(m.completed));
  out += row("Failed requests:", std::to_string(m.failed));
  out += row("Benchmark duration (s):", fixed2(m.duration_s));
  out += row("Total input tokens:", std::to_string(m.total_input));
  out += row("Total generated tokens:", std::to_string(m.total_output));
  out += row("Request throughput (req/s):", fixed2(m.request_throughput));
  if (m.has_goodput) out += row("Request goodput (req/s):", fixed2(m.request_goodput));
  out += row("Output token throughput (tok/s):", fixed2(m.output_throughput));
  out += row("Total Token throughput (tok/s):", fixed2(m.total_token_throughput));
  out += latency_rows("Time to First Token", "TTFT", m.ttft, shown);
  out += latency_rows("Time per Output Token (excl. 1st token)", "TPOT", m.tpot, shown);
  out += latency_rows("Inter-token Latency", "ITL", m.itl, shown);
  out += latency_rows("End-to-end Latency", "E2EL", m.e2el, shown);
  out += std::string(50, '=') + "\n";
  return out;
}

}  // namespace anvil::bench
