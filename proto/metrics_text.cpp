#include "proto/metrics_text.h"

#include <spdlog/fmt/fmt.h>

namespace anvil::proto {

namespace {

// Shortest round-trip form; Prometheus reads plain decimal and exponent notation alike.
std::string num(double v) { return fmt::format("{}", v); }

void header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void gauge(std::string& out, std::string_view name, double v, std::string_view help) {
  header(out, name, "gauge", help);
  fmt::format_to(std::back_inserter(out), "{} {}\n", name, num(v));
}

void counter(std::string& out, std::string_view name, double v, std::string_view help) {
  header(out, name, "counter", help);
  fmt::format_to(std::back_inserter(out), "{} {}\n", name, num(v));
}

// A histogram kept in milliseconds, written in seconds with cumulative buckets.
void seconds_histogram(std::string& out, std::string_view name, const histogram& h, std::string_view help) {
  header(out, name, "histogram", help);
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += i < h.counts.size() ? h.counts[i] : 0;
    fmt::format_to(std::back_inserter(out), "{}_bucket{{le=\"{}\"}} {}\n", name, num(h.bounds[i] / 1000.0), cumulative);
  }
  if (h.counts.size() > h.bounds.size()) cumulative += h.counts.back();
  fmt::format_to(std::back_inserter(out), "{}_bucket{{le=\"+Inf\"}} {}\n", name, cumulative);
  fmt::format_to(std::back_inserter(out), "{}_sum {}\n{}_count {}\n", name, num(h.sum / 1000.0), name, cumulative);
}

}  // namespace

std::string metrics_text(const engine_stats& s, const connection_counts& connections) {
  std::string out;
  out.reserve(8192);
  const kv::ledger& kv = s.kv.counts;
  const request_metrics& r = s.requests;

  gauge(out, "anvil_healthy", s.healthy ? 1 : 0, "1 while the engine serves requests, 0 after a device fault.");
  gauge(out, "anvil_requests_running", double(s.sched.running), "Requests being run (prefill or decode).");
  gauge(out, "anvil_requests_waiting", double(s.sched.waiting), "Requests queued, not yet admitted.");
  gauge(out, "anvil_requests_live", double(s.live_requests), "Requests submitted and not yet ended.");
  gauge(out, "anvil_kv_blocks_total", double(kv.total), "KV-cache blocks in the pool.");
  gauge(out, "anvil_kv_blocks_free", double(kv.free), "KV-cache blocks holding nothing.");
  gauge(out, "anvil_kv_blocks_used", double(kv.in_use), "KV-cache blocks held by live sequences.");
  gauge(out, "anvil_kv_blocks_cached", double(kv.cached), "KV-cache blocks kept only for prefix reuse.");
  gauge(out, "anvil_kv_usage_ratio", kv.total > 0 ? double(kv.in_use) / double(kv.total) : 0.0,
        "Fraction of KV-cache blocks held by live sequences.");
  gauge(out, "anvil_kv_window_blocks_total", double(s.kv.window_counts.total),
        "Blocks of the sliding-window layers' pool (0: every layer in the main pool).");
  gauge(out, "anvil_kv_window_blocks_used", double(s.kv.window_counts.in_use),
        "Blocks of the sliding-window layers' pool held by live sequences (their windows).");
  gauge(out, "anvil_kv_state_slots_total", double(s.kv.state_counts.total),
        "Recurrent-state slots: one per sequence and spares for prefix snapshots (0: the model has no recurrent layers).");
  gauge(out, "anvil_kv_state_slots_used", double(s.kv.state_counts.in_use), "Recurrent-state slots held by live sequences.");
  gauge(out, "anvil_kv_state_slots_cached", double(s.kv.state_counts.cached),
        "Recurrent-state slots holding the state at the end of a cached prefix (a snapshot), evicted LRU.");
  counter(out, "anvil_preemptions_total", double(s.sched.preemptions), "Sequences preempted (sent back to recompute).");
  counter(out, "anvil_steps_total", double(s.sched.steps), "Steps the worker ran.");
  counter(out, "anvil_steps_ahead_total", double(s.sched.steps_ahead),
          "Steps planned while the step before ran on the worker (overlapped step loop).");
  counter(out, "anvil_device_busy_seconds_total", s.sched.device_busy_us / 1e6,
          "Time the device spent on steps, on its own clock (GPU).");
  counter(out, "anvil_device_idle_seconds_total", s.sched.device_idle_us / 1e6,
          "Time the device sat idle between consecutive steps of the step loop (GPU): the host's turn-around.");
  counter(out, "anvil_device_idle_gaps_total", double(s.sched.timed_gaps),
          "Gaps between consecutive steps that anvil_device_idle_seconds_total measured.");
  counter(out, "anvil_prefix_cache_queries_total", double(s.kv.prefix_queries), "Prompt tokens looked up in the prefix cache.");
  counter(out, "anvil_prefix_cache_hits_total", double(s.kv.prefix_hits), "Prompt tokens found in the prefix cache.");
  counter(out, "anvil_prefix_cache_state_misses_total", double(s.kv.prefix_state_misses),
          "Prompt tokens found in the prefix cache but recomputed: no recurrent-state snapshot at their end.");
  counter(out, "anvil_prefix_cache_state_snapshots_total", double(s.kv.state_snapshots),
          "Recurrent states kept at the end of a prompt's cached blocks (prefix snapshots).");
  gauge(out, "anvil_prefix_cache_hit_rate",
        s.kv.prefix_queries > 0 ? double(s.kv.prefix_hits) / double(s.kv.prefix_queries) : 0.0,
        "Prefix-cache hits over queries since start-up.");

  if (!connections.empty()) {
    header(out, "anvil_connections", "gauge", "Open client connections by protocol.");
    for (const auto& [protocol, n] : connections) {
      fmt::format_to(std::back_inserter(out), "anvil_connections{{protocol=\"{}\"}} {}\n", protocol, n);
    }
  }

  header(out, "anvil_requests_total", "counter", "Finished requests by finish reason.");
  const std::pair<const char*, std::uint64_t> reasons[] = {
      {"stop", r.finished_stop}, {"length", r.finished_length}, {"cancelled", r.finished_cancelled}, {"error", r.finished_error}};
  for (const auto& [reason, n] : reasons) {
    fmt::format_to(std::back_inserter(out), "anvil_requests_total{{finish_reason=\"{}\"}} {}\n", reason, n);
  }
  counter(out, "anvil_requests_rejected_total", double(r.rejected), "Requests refused at submission (invalid, overloaded, too long).");
  counter(out, "anvil_prompt_tokens_total", double(r.prompt_tokens), "Prompt tokens of finished requests.");
  counter(out, "anvil_generation_tokens_total", double(r.completion_tokens), "Tokens generated by finished requests.");

  seconds_histogram(out, "anvil_time_to_first_token_seconds", r.ttft_ms, "Submission to the first generated token.");
  seconds_histogram(out, "anvil_inter_token_latency_seconds", r.itl_ms, "Time between consecutive tokens of a request.");
  seconds_histogram(out, "anvil_e2e_request_latency_seconds", r.e2e_ms, "Submission to the end of a request.");
  seconds_histogram(out, "anvil_queue_time_seconds", r.queue_ms, "Submission to the first step that fed the request.");
  return out;
}

}  // namespace anvil::proto
