// Quantized GEMV for decode batches: y[t, o] = sum_i W[o, i] * x[t, i] (+ bias[o]) for 1..8
// tokens, with W a GGUF weight uploaded verbatim (matmul_params, kernels/matmul.h; the CPU
// reference is matmul_ref). One kernel reads each weight byte once for every token of the batch:
// warps own rows, lanes own chunks of a row and dequantize them in registers
// (kernels/gpu_quant.h), activations stay f32. Larger batches go to launch_gemm (kernels/gemm.h).
#pragma once

#include "kernels/matmul.h"

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {

inline constexpr std::int64_t gemv_max_tokens = 8;

// True when launch_gemv decodes `t` (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K).
bool gemv_supports(model::ggml_type t);

// Enqueues the GEMV on `stream`. Preconditions, checked (hipErrorInvalidValue, nothing launched):
// 0 <= n_tokens <= gemv_max_tokens (0 launches nothing), out >= 0, in > 0 and a multiple of 8
// (F32, F16, BF16), 32 (Q8_0, Q4_0) or 256 (K-quants), w and x 16-byte aligned, a supported type.
// bias may be null; y must not alias x or w.
hipError_t launch_gemv(const matmul_params& p, hipStream_t stream);

}  // namespace anvil::kernels
#endif
