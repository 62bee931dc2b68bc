// Helpers for the engine-level reliability suites (faults, KV exhaustion, determinism): the tiny
// random-weight model, prompts, a reference greedy run, and waits that turn a hang into a failure.
#pragma once

#include <chrono>
#include <future>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "model/arch/cpu_forward.h"
#include "tests/engine/requests.h"
#include "tests/model/fixtures.h"
#include "tests/model/reference_greedy.h"

namespace anvil::testing {

// Generous: only a hang should ever reach it (sanitizer builds are slow, machines are shared;
// under ASan on a loaded 2-core machine a KV-starved request has taken over 90 s).
inline constexpr std::chrono::seconds hang_limit{240};

inline std::string tiny_model() { return model::testing::synth_fixture("tiny", model::synth_mix::f32); }

inline engine_config tiny_engine_config(std::size_t kv_bytes = 8u << 20) {
  engine_config c;
  c.model_path = tiny_model();
  c.kv_budget_bytes = kv_bytes;
  c.max_batch_tokens = 256;
  c.max_seqs = 32;
  c.max_prefill_chunk = 64;
  c.max_model_len = 512;
  return c;
}

// The KV budget that holds exactly `blocks` blocks of 16 tokens of the tiny model.
inline std::size_t kv_bytes_for_blocks(std::int64_t blocks) {
  static const model::hparams hp = model::read_hparams(model::gguf_file::open(tiny_model()));
  return model::kv_cache_storage::bytes_per_block(hp, 16) * std::size_t(blocks);
}

// The future's value, or a test failure (and a default value) when it does not come in time.
template <class T>
T get_within(std::future<T>& f, const char* what, std::chrono::seconds limit = hang_limit) {
  if (f.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << what << " did not complete within " << limit.count() << " s";
    return T{};
  }
  return f.get();
}

// One streamed request's events, collected; done() is the last one (bounded wait).
struct stream_log {
  std::mutex mu;
  std::vector<stream_event> events;
  std::promise<stream_event> last;

  engine::event_handler handler() {
    return [this](const stream_event& e) {
      {
        std::lock_guard lock(mu);
        events.push_back(e);
      }
      if (e.done) last.set_value(e);
    };
  }
  std::future<stream_event> done_future() { return last.get_future(); }
  std::vector<std::int32_t> tokens() {
    std::lock_guard lock(mu);
    std::vector<std::int32_t> out;
    for (const auto& e : events) out.insert(out.end(), e.tokens.begin(), e.tokens.end());
    return out;
  }
  std::string text() {
    std::lock_guard lock(mu);
    std::string out;
    for (const auto& e : events) out += e.text;
    return out;
  }
};

// Stats once the engine has gone quiet (the last releases are applied a step after the last
// tokens are delivered); gives up after a few seconds and returns what it saw.
inline engine_stats settled_stats(engine& eng) {
  engine_stats s = eng.stats();
  for (int i = 0; i < 1000 && (s.kv.counts.in_use != 0 || s.sched.running + s.sched.waiting != 0 || s.live_requests != 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s = eng.stats();
  }
  return s;
}

// The engine stops within the hang limit.
inline void stop_within_limit(engine& eng) {
  auto f = eng.async_stop(boost::asio::use_future);
  ASSERT_EQ(f.wait_for(hang_limit), std::future_status::ready) << "async_stop hung";
  f.get();
}

// The same request run alone on the reference forward pass, greedily.
inline std::vector<std::int32_t> reference_greedy(const std::vector<std::int32_t>& prompt, std::int64_t n) {
  static const model::llm m = model::load_llm(model::gguf_file::open(tiny_model()));
  return model::testing::reference_greedy(m, prompt, n);
}

}  // namespace anvil::testing
