// Gated DeltaNet, the linear-attention layers of Qwen3.5 / 3.6 (`qwen35`): the two ops of their
// recurrent part, each sequence continuing from the state its slot holds (the recurrent-state pool,
// kv_config::n_state_slots) and leaving it there for its next step.
//
// conv1d_silu: the causal depthwise convolution over the channels of the q/k/v projection, then SiLU.
// A slot keeps the sequence's last kernel - 1 inputs, so for token t of a step
//   y[t, c] = silu(sum_j taps[c, j] * x[t - (kernel - 1) + j, c])
// with the inputs before the step taken from the slot (zeros before position 0); tap kernel - 1
// meets the token itself.
//
// delta_rule: per value head j (key head j % k_heads: the tiled order GGUF files store, which the
// converter makes from HF's grouped one) and per token in order, with S the head's head_k x head_v
// state:
//   q, k   = the key head's q / |q|, k / |k| (|x| = sqrt(sum x^2 + 1e-6)), then q / sqrt(head_k)
//   beta   = sigmoid(b[j]),  g = a[j] * softplus(alpha[j] + dt_bias[j])   (a = -exp(A_log) < 0)
//   S      = exp(g) S;   S += k (beta (v - S^T k))^T;   o = S^T q
//   y[j]   = o / sqrt(mean(o^2) + eps) * norm * silu(z[j])                 (the gated RMSNorm)
// The chunked form (the GPU's prompt chunks) is an exact rearrangement of the same recurrence: for a
// chunk of C tokens from state S0, with G_t the chunk's running sum of g up to t and u_t the
// update d of token t above,
//   u_t = beta_t (v_t - e^{G_t} S0^T k_t) - sum_{i<t} beta_t e^{G_t - G_i} (k_t . k_i) u_i
//   o_t = e^{G_t} S0^T q_t + sum_{i<=t} e^{G_t - G_i} (q_t . k_i) u_i
//   S_C = e^{G_C} S0 + sum_i e^{G_C - G_i} k_i u_i^T
// (u by forward substitution in the unit lower-triangular system): whole-chunk products in place
// of one token after another.
//
// The *_ref functions are the ops' definitions (CPU, double accumulation; the state in float).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace anvil::kernels {

// One sequence's tokens in a step: rows [first, first + n_tokens) of the step's activations.
struct recurrent_seq {
  std::int64_t first = 0;
  std::int64_t n_tokens = 0;
  std::int32_t slot = 0;  // its state slot
  bool fresh = false;     // its first token is position 0: the slot's state is zeroed first
};

inline constexpr std::int64_t conv1d_max_taps = 16;  // the loader refuses longer kernels

struct conv1d_silu_params {
  float* x = nullptr;              // [n_tokens, channels]: the projection in, the activations out (in place)
  std::int64_t channels = 0;
  std::int64_t kernel = 0;         // taps per channel, 2 to conv1d_max_taps
  const float* taps = nullptr;     // [channels, kernel]
  float* state = nullptr;          // [n_slots, kernel - 1, channels]: each slot's last inputs, oldest first
  std::int64_t n_slots = 0;
  std::span<const recurrent_seq> seqs;
  // The GPU: seqs[chunked_from, end) (a step's prompt chunks) take a kernel that spreads each
  // sequence's tokens over the threads of a block, those before it (decode: a token each) a thread
  // per channel and sequence; the default, all of them the latter. The CPU reference ignores it.
  std::size_t chunked_from = SIZE_MAX;
};

struct delta_rule_params {
  const float* qkv = nullptr;      // [n_tokens, 2 * k_heads * head_k + v_heads * head_v]: conv1d_silu's output
  const float* b = nullptr;        // [n_tokens, v_heads]: beta before the sigmoid
  const float* alpha = nullptr;    // [n_tokens, v_heads]
  const float* a = nullptr;        // [v_heads]: -exp(A_log)
  const float* dt_bias = nullptr;  // [v_heads]
  const float* z = nullptr;        // [n_tokens, v_heads * head_v]: the output gate
  const float* norm = nullptr;     // [head_v]: the gated norm's weight
  float eps = 1e-6f;
  float* y = nullptr;              // [n_tokens, v_heads * head_v]
  float* state = nullptr;          // [n_slots, v_heads, head_k, head_v]
  std::int64_t n_slots = 0;
  std::int64_t k_heads = 0, v_heads = 0;  // v_heads a multiple of k_heads
  std::int64_t head_k = 0, head_v = 0;
  std::span<const recurrent_seq> seqs;
  // The GPU: seqs[chunked_from, end) (a step's prompt chunks) take the chunked form, those before
  // it (decode: a token each) the recurrent one; the default, all recurrent. The CPU reference
  // ignores it (the same function either way).
  std::size_t chunked_from = SIZE_MAX;
  // The GPU's chunked form takes its products on tensor cores where the device has them (NVIDIA
  // compute capability 8.0 and up); true keeps the CUDA-core kernel (tests and benchmarks compare
  // the two).
  bool cuda_cores_only = false;
};

void conv1d_silu_ref(const conv1d_silu_params& p);
void delta_rule_ref(const delta_rule_params& p);

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// The GPU kernels (kernels/delta_net.hip): every pointer, seqs' elements included, in device
// memory (seqs.size() is read on the host). Reject (hipErrorInvalidValue) a kernel of more than
// 16 taps, head_k other than 16, 32, 64 or 128, head_v above 128, more than 65535 sequences,
// chunked_from past the end but not SIZE_MAX.
hipError_t launch_conv1d_silu(const conv1d_silu_params& p, hipStream_t stream);
hipError_t launch_delta_rule(const delta_rule_params& p, hipStream_t stream);
}  // namespace anvil::kernels
#endif
