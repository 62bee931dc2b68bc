// The Prometheus text for GET /metrics, from hand-made engine stats: every series is announced
// by # HELP and # TYPE, histograms are cumulative and in seconds, and ratios survive empty pools.
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "proto/metrics_text.h"
#include "tests/proto/prometheus_samples.h"

namespace {

using namespace anvil;

const auto samples = anvil::testing::prometheus_samples;

TEST(MetricsText, WritesGaugesCountersAndCumulativeHistogramsInSeconds) {
  engine_stats s;
  s.sched.running = 3;
  s.sched.waiting = 2;
  s.sched.preemptions = 7;
  s.kv.counts = {.free = 4, .cached = 2, .in_use = 10, .total = 16};
  s.kv.prefix_queries = 100;
  s.kv.prefix_hits = 25;
  s.sched.steps = 40;
  s.sched.steps_ahead = 30;
  s.sched.timed_gaps = 20;
  s.sched.device_idle_us = 250.0;
  s.sched.device_busy_us = 2.5e6;
  s.kv.window_counts = {.free = 7, .cached = 0, .in_use = 5, .total = 12};
  s.kv.state_counts = {.free = 1, .cached = 2, .in_use = 3, .total = 6};
  s.kv.state_snapshots = 9;
  s.kv.prefix_state_misses = 48;
  s.requests.finished_stop = 5;
  s.requests.finished_length = 6;
  s.requests.finished_cancelled = 1;
  s.requests.rejected = 9;
  s.requests.prompt_tokens = 1234;
  s.requests.completion_tokens = 567;
  for (double ms : {0.5, 3.0, 3.0, 90.0, 1e9}) s.requests.ttft_ms.observe(ms);

  const std::string text = proto::metrics_text(s);
  const auto m = samples(text);
  EXPECT_EQ(m.at("anvil_requests_running"), 3);
  EXPECT_EQ(m.at("anvil_requests_waiting"), 2);
  EXPECT_EQ(m.at("anvil_kv_blocks_total"), 16);
  EXPECT_EQ(m.at("anvil_kv_blocks_used"), 10);
  EXPECT_EQ(m.at("anvil_kv_blocks_cached"), 2);
  EXPECT_DOUBLE_EQ(m.at("anvil_kv_usage_ratio"), 10.0 / 16.0);
  EXPECT_EQ(m.at("anvil_kv_window_blocks_total"), 12);
  EXPECT_EQ(m.at("anvil_kv_window_blocks_used"), 5);
  EXPECT_EQ(m.at("anvil_kv_state_slots_total"), 6);
  EXPECT_EQ(m.at("anvil_kv_state_slots_used"), 3);
  EXPECT_EQ(m.at("anvil_kv_state_slots_cached"), 2);
  EXPECT_EQ(m.at("anvil_prefix_cache_state_snapshots_total"), 9);
  EXPECT_EQ(m.at("anvil_prefix_cache_state_misses_total"), 48);
  EXPECT_EQ(m.at("anvil_preemptions_total"), 7);
  EXPECT_EQ(m.at("anvil_steps_total"), 40);
  EXPECT_EQ(m.at("anvil_steps_ahead_total"), 30);
  EXPECT_EQ(m.at("anvil_device_idle_gaps_total"), 20);
  EXPECT_DOUBLE_EQ(m.at("anvil_device_idle_seconds_total"), 250e-6);
  EXPECT_DOUBLE_EQ(m.at("anvil_device_busy_seconds_total"), 2.5);
  EXPECT_DOUBLE_EQ(m.at("anvil_prefix_cache_hit_rate"), 0.25);
  EXPECT_EQ(m.at("anvil_requests_total{finish_reason=\"stop\"}"), 5);
  EXPECT_EQ(m.at("anvil_requests_total{finish_reason=\"length\"}"), 6);
  EXPECT_EQ(m.at("anvil_requests_total{finish_reason=\"cancelled\"}"), 1);
  EXPECT_EQ(m.at("anvil_requests_total{finish_reason=\"error\"}"), 0);
  EXPECT_EQ(m.at("anvil_requests_rejected_total"), 9);
  EXPECT_EQ(m.at("anvil_prompt_tokens_total"), 1234);
  EXPECT_EQ(m.at("anvil_generation_tokens_total"), 567);
  EXPECT_EQ(m.at("anvil_healthy"), 1);
  EXPECT_EQ(m.at("anvil_kv_blocks_free"), 4);
  EXPECT_EQ(m.at("anvil_requests_live"), 0);
  EXPECT_EQ(m.count("anvil_connections{protocol=\"http\"}"), 0u);  // only when a server says

  s.live_requests = 6;
  const auto with_conns = samples(proto::metrics_text(s, {{"http", 3}, {"line", 0}}));
  EXPECT_EQ(with_conns.at("anvil_requests_live"), 6);
  EXPECT_EQ(with_conns.at("anvil_connections{protocol=\"http\"}"), 3);
  EXPECT_EQ(with_conns.at("anvil_connections{protocol=\"line\"}"), 0);

  // 1 ms → le="0.001": one observation (0.5 ms); 5 ms: three; 160 ms: four; +Inf: five.
  EXPECT_EQ(m.at("anvil_time_to_first_token_seconds_bucket{le=\"0.001\"}"), 1);
  EXPECT_EQ(m.at("anvil_time_to_first_token_seconds_bucket{le=\"0.005\"}"), 3);
  EXPECT_EQ(m.at("anvil_time_to_first_token_seconds_bucket{le=\"0.16\"}"), 4);
  EXPECT_EQ(m.at("anvil_time_to_first_token_seconds_bucket{le=\"160\"}"), 4);
  EXPECT_EQ(m.at("anvil_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), 5);
  EXPECT_EQ(m.at("anvil_time_to_first_token_seconds_count"), 5);
  EXPECT_NEAR(m.at("anvil_time_to_first_token_seconds_sum"), (0.5 + 3 + 3 + 90 + 1e9) / 1000.0, 1e-3);
  EXPECT_EQ(m.at("anvil_queue_time_seconds_count"), 0);

  for (const char* name : {"anvil_requests_running", "anvil_kv_usage_ratio", "anvil_requests_total",
                           "anvil_inter_token_latency_seconds", "anvil_e2e_request_latency_seconds"}) {
    EXPECT_NE(text.find(std::string("# HELP ") + name + " "), std::string::npos) << name;
    EXPECT_NE(text.find(std::string("# TYPE ") + name + " "), std::string::npos) << name;
  }
  EXPECT_NE(text.find("# TYPE anvil_e2e_request_latency_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE anvil_preemptions_total counter\n"), std::string::npos);
}

TEST(MetricsText, EmptyPoolAndNoQueriesGiveZeroRatios) {
  engine_stats s;
  s.healthy = false;
  const auto m = samples(proto::metrics_text(s));
  EXPECT_EQ(m.at("anvil_kv_usage_ratio"), 0);
  EXPECT_EQ(m.at("anvil_prefix_cache_hit_rate"), 0);
  EXPECT_EQ(m.at("anvil_healthy"), 0);
}

}  // namespace
