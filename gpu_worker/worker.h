// The worker interface the scheduler drives: execute one step_plan, answer one step_result.
// Mockable in the Boost.Asio manner: the public template async_execute forwards to the private
// virtual do_execute with a type-erased handler, so a GoogleMock worker can complete handlers in
// any order, or with errors, from the test. Implementations: cpu_worker (the reference forward
// pass) here; the GPU worker later, behind the same interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/async_result.hpp>

#include "actors/error.h"
#include "kernels/gemm_dtype.h"
#include "kernels/kv_quant.h"
#include "messages/step.h"

namespace anvil::gpu_worker {

// What the worker allocated at start-up and what the step limits are. The KV pool's block count
// is what the KV manager may hand out.
struct memory_plan {
  std::string device;                   // "cpu" or the GPU's name
  std::int64_t n_blocks = 0;            // KV pool blocks
  std::int64_t n_window_blocks = 0;     // the sliding-window layers' pool (kv_plan.h); 0: none
  std::int64_t window = 0;              // their window in positions, with a window pool
  std::int64_t n_state_slots = 0;       // recurrent layers' state slots (kv_plan.h), one per sequence; 0: none
  std::size_t state_bytes = 0;          // those slots, every recurrent layer's state
  std::int64_t block_size = 0;          // tokens per block
  std::int64_t max_batch_tokens = 0;    // tokens one step may feed
  std::int64_t max_seqs = 0;            // sequences one step may hold
  std::int64_t n_vocab = 0;
  std::size_t weight_bytes = 0;
  std::size_t token_weight_bytes = 0;   // what one token reads (model::llm::token_weight_bytes)
  std::size_t kv_bytes = 0;             // the KV pool, all layers, K and V
  kernels::kv_dtype kv_cache_dtype = kernels::kv_dtype::f16;  // its elements (kernels/kv_quant.h)
  std::size_t scratch_bytes = 0;        // activations and logits for a full step
  kernels::gemm_dtype gemm_dtype = kernels::gemm_dtype::f16;  // the math of steps of many tokens (GPU)
  std::size_t fp8_weight_bytes = 0;     // the layer weights' FP8 copies (GPU, gemm_dtype fp8)
  std::int64_t fp8_stacked_layers = 0;  // layers whose q, k and v share one stacked FP8 copy
  std::size_t f16_weight_bytes = 0;     // the quantized weights' f16 copies (GPU, f16_weight_copies)
  std::int64_t decode_graphs = 0;       // decode batch sizes replayed from a graph (GPU)
};

// " (N MB per token)" where a token reads only part of the weights (experts), else "": for the
// memory-plan lines, whose readers (bench/gpu-figures.sh) take it as the decode limit's bytes.
inline std::string token_weights(const memory_plan& m) {
  if (m.token_weight_bytes == 0 || m.token_weight_bytes == m.weight_bytes) return {};
  char buf[48];
  std::snprintf(buf, sizeof buf, " (%.1f MB per token)", double(m.token_weight_bytes) / 1e6);
  return buf;
}

// " and N blocks for the sliding layers' window of W" where the memory plan has a window pool
// (kv_plan.h), else "": for the memory-plan lines.
inline std::string window_pool_text(const memory_plan& m) {
  if (m.n_window_blocks == 0) return {};
  char buf[96];
  std::snprintf(buf, sizeof buf, " and %lld blocks for the sliding layers' window of %lld",
                static_cast<long long>(m.n_window_blocks), static_cast<long long>(m.window));
  return buf;
}

// ", N recurrent-state slots (M MB)" where the model has recurrent layers, else "".
inline std::string state_pool_text(const memory_plan& m) {
  if (m.n_state_slots == 0) return {};
  char buf[96];
  std::snprintf(buf, sizeof buf, ", %lld recurrent-state slots (%.1f MB)", static_cast<long long>(m.n_state_slots),
                double(m.state_bytes) / 1e6);
  return buf;
}

class worker {
 public:
  using execute_signature = void(error_code, step_result);

  virtual ~worker() = default;

  // Completes with the step's result, or an error (errc::invalid_argument for a plan that breaks
  // the contract, errc::device_fault when execution failed).
  template <class Token>
  auto async_execute(step_plan plan, Token&& token) {
    return boost::asio::async_initiate<Token, execute_signature>(
        [this](auto handler, step_plan p) { do_execute(std::move(p), std::move(handler)); }, token, std::move(plan));
  }

  // The masks of a step sent with seq_step::mask_deferred (messages/step.h): that step waits for
  // them to process its logits, and they must come before the next plan. No reply: the step's own
  // answer fails (errc::invalid_argument) when its masks are malformed or do not come in time.
  void send_masks(step_masks masks) { do_masks(std::move(masks)); }

  virtual const memory_plan& plan() const = 0;
  // Device (arena) allocations since construction. Fixed once start-up is over: the one rule.
  virtual std::uint64_t device_allocations() const = 0;

 private:
  virtual void do_execute(step_plan plan, boost::asio::any_completion_handler<execute_signature> handler) = 0;
  virtual void do_masks(step_masks masks) = 0;
};

}  // namespace anvil::gpu_worker
