// The residual add fused with the next RMSNorm, as every transformer layer chains them:
//   h[r, :] += delta[r, :];  y[r, :] = rms_norm(h[r, :]) * weight
// (Gemma 3 norms each block's output before the add: with delta_weight, h[r, :] +=
// rms_norm(delta[r, :]) * delta_weight, the same eps. Gemma 4 then scales the sum: h_scale.)
// One pass writes both the updated residual stream h and the normalised y (the input of the next
// projection). With delta null it is the plain RMSNorm of h (h left alone). After a mixture of
// experts without a shared expert, delta[r] is the weighted sum of row r's k experts' outputs,
// summed here as kernels/moe.h's combine would (pair_weights), which saves that launch. Q/K norm (qwen3: a
// RMSNorm per head over head_dim, on the q and k rows) is launch_rms_norm (kernels/rms_norm.h)
// with rows = tokens * heads and cols = head_dim, in place; it has a warp-per-row path for such
// short rows.
#pragma once

#include <cstdint>

namespace anvil::kernels {

struct rms_norm_residual_params {
  float* h = nullptr;             // [rows, cols] residual stream; h += delta in place
  const float* delta = nullptr;   // [rows, cols] added to h first, or null (no add)
  const float* weight = nullptr;  // [cols] per-channel gain; a constant (read before the wait: gpu_runtime.h)
  float* y = nullptr;             // [rows, cols] normalised output; must not alias h or delta
  std::int64_t rows = 0;
  std::int64_t cols = 0;          // > 0
  float eps = 1e-6f;
  // Optional: delta holds k rows per row, the experts' outputs by pair ([rows * k, cols], row r's
  // j-th choice at r * k + j), and the delta added is sum over j of pair_weights[r, j] times them,
  // in j order from 0 (moe_combine_ref's sum without a shared expert).
  const float* pair_weights = nullptr;  // [rows, k]
  std::int64_t k = 0;                   // with pair_weights: 1..64
  // Optional: delta normed before the add, with this per-channel gain [cols] (not with
  // pair_weights); a constant, like weight.
  const float* delta_weight = nullptr;
  // Optional (gemma4's layer_output_scale): with delta, the updated h multiplied by this after the
  // add, h[r, :] = (h[r, :] + delta[r, :]) * h_scale, before it is stored and normed.
  float h_scale = 1.f;
  // Optional (GPU only): y also rounded to 8 bits in the form the quantized GEMV reads
  // (kernels/gemv.h, gemv_x8_rows), so the projections that follow need not quantize it
  // themselves: yq [rows, cols], yq_scales [rows, cols / 16] pairs. Needs cols % 32 == 0 and the
  // 16-byte aligned path. The CPU reference ignores them.
  std::int8_t* yq = nullptr;
  float* yq_scales = nullptr;
};

// The widest row the 8-bit output (yq) takes: the register path's 1024 threads x 4 float4s.
inline constexpr std::int64_t rms_norm_residual_max_x8_cols = 16384;

// CPU reference: the float add (as model/arch/cpu_forward.cpp does it), then rms_norm_ref.
void rms_norm_residual_ref(const rms_norm_residual_params& p);

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// Rejects (hipErrorInvalidValue) rows < 0, cols <= 0, pair_weights without delta or with k
// outside 1..64, delta_weight without delta or with pair_weights, and yq without its conditions (above) or with more than
// rms_norm_residual_max_x8_cols columns.
hipError_t launch_rms_norm_residual(const rms_norm_residual_params& p, hipStream_t stream);
}  // namespace anvil::kernels
#endif
