#include "bench/load/bench_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace anvil::bench {

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * double(values.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(rank));
  const auto hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (rank - double(lo)) * (values[hi] - values[lo]);
}

latency_summary summarize_ms(const std::vector<double>& seconds, const std::vector<double>& percentiles) {
  latency_summary s;
  std::vector<double> ms(seconds.size());
  std::transform(seconds.begin(), seconds.end(), ms.begin(), [](double v) { return v * 1000.0; });
  if (!ms.empty()) {
    s.mean_ms = std::accumulate(ms.begin(), ms.end(), 0.0) / double(ms.size());
    double sq = 0;
    for (double v : ms) sq += (v - s.mean_ms) * (v - s.mean_ms);
    s.std_ms = std::sqrt(sq / double(ms.size()));
  }
  s.median_ms = percentile(ms, 50);
  for (double p : percentiles) s.percentiles.emplace_back(p, percentile(ms, p));
  return s;
}

double request_tpot_s(const request_result& r) {
  if (r.output_tokens <= 1) return 0;
  return (r.e2el_s - r.ttft_s) / double(r.output_tokens - 1);
}

bench_metrics compute_metrics(const std::vector<request_result>& results, double duration_s, const slo_spec& slo,
                              const std::vector<double>& percentiles) {
  bench_metrics m;
  m.duration_s = duration_s;
  m.has_goodput = slo.any();
  std::vector<double> ttfts, tpots, itls, e2els;
  int good = 0;
  for (const auto& r : results) {
    if (!r.ok) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    m.total_input += r.prompt_tokens;
    m.total_output += r.output_tokens;
    const double tpot = request_tpot_s(r);
    if (r.output_tokens > 1) tpots.push_back(tpot);
    ttfts.push_back(r.ttft_s);
    e2els.push_back(r.e2el_s);
    itls.insert(itls.end(), r.itls_s.begin(), r.itls_s.end());
    const bool meets = (!slo.ttft_ms || r.ttft_s * 1000.0 <= *slo.ttft_ms) &&
                       (!slo.tpot_ms || tpot * 1000.0 <= *slo.tpot_ms) &&
                       (!slo.e2el_ms || r.e2el_s * 1000.0 <= *slo.e2el_ms);
    if (meets) ++good;
  }
  if (duration_s > 0) {
    m.request_throughput = m.completed / duration_s;
    m.output_throughput = double(m.total_output) / duration_s;
    m.total_token_throughput = double(m.total_input + m.total_output) / duration_s;
    if (m.has_goodput) m.request_goodput = good / duration_s;
  }
  m.ttft = summarize_ms(ttfts, percentiles);
  m.tpot = summarize_ms(tpots, percentiles);
  m.itl = summarize_ms(itls, percentiles);
  m.e2el = summarize_ms(e2els, percentiles);
  return m;
}

}  // namespace anvil::bench
