// Mixture-of-experts ops (Mixtral, Qwen2-MoE, Qwen3-MoE), all on the device so that a step with
// experts needs no host round trip and still fits a captured graph:
//   0. router:  logits[t, e] = router_e . x[t] (+ bias_e), the router (F32, as GGUF files keep it) in f32 at
//               every step size: an f16 rounding of the scores could change a token's experts.
//   1. route:   each token's router logits -> softmax over every expert -> its k most probable
//               (the lower id first on a tie), their probabilities renormalised where the model
//               says so; then the (token, rank) pairs grouped by expert: offsets[e] .. offsets[e+1]
//               of `sorted` are the pairs expert e serves (in no particular order), and `active`
//               lists the experts with pairs, so that the matmuls' grids walk only those.
//   2. matmul:  for each expert with pairs, y[p] = W_e x(p) (+ b_e) for each of its pairs p: the expert's
//               rows are read once per group of pairs, not once per pair. x(p) is the token's row
//               (the gate/up projections' input) or the pair's own row (the down projection's).
//               Steps of many pairs: kernels/gemm_quant.h's experts form, on tensor cores. A
//               step of one token: each pair on its own, its expert read from the route's ids
//               (the route then makes no grouping).
//   3. combine: out[t] = sum over ranks j of weight[t, j] * y[t * k + j], plus the shared expert's
//               output scaled by sigmoid(x[t] . shared_gate) where the model has one.
// Pair p = t * k + j is token t's j-th choice. The references are the definition; the CPU forward
// pass routes through moe_route_ref.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/quant/quant.h"

namespace anvil::kernels {

// Experts and choices the kernels take (the loader's limits are the same).
inline constexpr std::int64_t moe_max_experts = 1024;
inline constexpr std::int64_t moe_max_used = 64;

struct moe_route_params {
  const float* logits = nullptr;    // [n_tokens, n_expert] router outputs
  std::int64_t n_tokens = 0;
  std::int64_t n_expert = 0;        // 1..moe_max_experts
  std::int64_t k = 0;               // experts per token, 1..min(n_expert, moe_max_used)
  bool normalize = true;            // the k weights divided by their sum
  const float* expert_scale = nullptr;  // [n_expert] or null (gemma4): each chosen weight, after the
                                        // division, times its expert's scale
  std::int32_t* ids = nullptr;      // [n_tokens, k] out: chosen experts, most probable first
  float* weights = nullptr;         // [n_tokens, k] out: their probabilities (renormalised)
  std::int32_t* offsets = nullptr;  // [n_expert + 1] out (GPU): where each expert's pairs start in sorted
  std::int32_t* sorted = nullptr;   // [n_tokens * k] out (GPU): pair indices grouped by expert
  std::int32_t* active = nullptr;   // [n_expert + 1] out (GPU): the count of experts with pairs,
                                    // then their ids in ascending order
                                    // (GPU) offsets, sorted and active all null: no grouping made,
                                    // for matmuls that take the pairs by moe_matmul_params::pair_experts
};

struct moe_router_params {
  const float* w = nullptr;         // [n_expert, in] F32
  const float* x = nullptr;         // [n_tokens, in]
  float* logits = nullptr;          // [n_tokens, n_expert]
  std::int64_t in = 0, n_expert = 0, n_tokens = 0;
  const float* bias = nullptr;      // [n_expert] or null (gpt-oss)
};

// CPU reference: ids and weights (offsets and sorted are the GPU's grouping; the reference
// ignores them). `logits` is read only.
void moe_route_ref(const moe_route_params& p);

struct moe_matmul_params {
  // Up to two stacked weights sharing type, shape, x and the grouping (gate and up): w[m] is
  // n_expert matrices of `out` rows of `in`, `stride` bytes apart; y[m] gets [n_pairs, out].
  const void* w[2] = {};
  float* y[2] = {};
  const float* bias[2] = {};        // [n_expert, out] per matrix, added to its y, or null (gpt-oss)
  int n_mats = 1;
  model::ggml_type w_type = model::ggml_type::F32;
  std::int64_t in = 0, out = 0;
  std::size_t stride = 0;
  const float* x = nullptr;         // pair p reads row p / x_div: [n_pairs / x_div, in]
  std::int64_t x_div = 1;           // k: one row per token; 1: one row per pair
  // Optional (GPU): the same rows rounded to 8 bits in the quantized GEMV's form (kernels/gemv.h,
  // gemv_x8_view of [n_pairs / x_div, in]). With a type moe_matmul_int8 takes, the kernel dots
  // the weights' integers with them (the GEMV's integer path) and x is not read.
  const std::int8_t* xq = nullptr;
  const float* x_scales = nullptr;
  std::int64_t n_pairs = 0;
  std::int64_t n_expert = 0;
  // Optional (GPU): no expert has more pairs than this (the step's tokens: a token's k experts are
  // distinct); 0: n_pairs. Only the kernel's choice depends on it (one token: the lightest one).
  std::int64_t max_expert_pairs = 0;
  const std::int32_t* offsets = nullptr;  // from moe_route
  const std::int32_t* sorted = nullptr;
  const std::int32_t* active = nullptr;
  // Optional (GPU, the integer path; meant for a step of one token, whose pairs share no expert):
  // pair_experts[p] is pair p's expert (moe_route's ids), and each pair is computed on its own
  // instead of grouped by expert, so offsets, sorted and active are neither needed nor read. Each
  // pair's output is the grouped launch's, bit for bit.
  const std::int32_t* pair_experts = nullptr;
};

struct moe_combine_params {
  const float* y = nullptr;          // [n_tokens * k, cols] the experts' outputs, by pair
  const float* weights = nullptr;    // [n_tokens, k]
  std::int64_t n_tokens = 0, k = 0, cols = 0;
  const float* shared = nullptr;     // [n_tokens, cols] the shared expert's output, or null
  const float* shared_gate = nullptr;  // [cols]: shared scaled by sigmoid(x[t] . shared_gate); null: by 1
  const float* x = nullptr;          // [n_tokens, cols] the layer input the gate reads
  float* out = nullptr;              // [n_tokens, cols]; must not alias the inputs
};

void moe_combine_ref(const moe_combine_params& p);

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// Whether launch_moe_matmul takes stacked experts of this type, row length and stride.
bool moe_matmul_supports(model::ggml_type t, std::int64_t in, std::size_t stride);
// Whether it takes 8-bit activations (xq) for this type: the types of the GEMV's integer path.
bool moe_matmul_int8(model::ggml_type t);
// in a multiple of 4, w and x 16-byte aligned; else hipErrorInvalidValue, nothing launched.
hipError_t launch_moe_router(const moe_router_params& p, hipStream_t stream);
// hipErrorInvalidValue (nothing launched) for sizes outside the limits above or null outputs.
hipError_t launch_moe_route(const moe_route_params& p, hipStream_t stream);
// Any type the GEMV takes (kernels/gemv.h), float or 8-bit activations (xq and x_scales 16-byte
// aligned, in a multiple of 32); w and x 16-byte aligned, in a
// multiple of the type's block and of 8, stride a multiple of the alignment a block keeps in an
// aligned matrix (16 bytes, or less for blocks of 18, 20, 22, 24, 34, 84, 110, 136 or 210 bytes;
// any stride for MXFP4's 17). Else hipErrorInvalidValue, nothing launched.
hipError_t launch_moe_matmul(const moe_matmul_params& p, hipStream_t stream);
hipError_t launch_moe_combine(const moe_combine_params& p, hipStream_t stream);
}  // namespace anvil::kernels
#endif
