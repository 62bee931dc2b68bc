// Quantized GEMV for decode batches: y[t, o] = sum_i W[o, i] * x[t, i] (+ bias[o]) for 1..8
// tokens, with W a GGUF weight uploaded verbatim (matmul_params, kernels/matmul.h; the CPU
// reference is matmul_ref). One kernel reads each weight byte once for every token of the batch:
// warps own rows, lanes own slices of a row. For quantized weights (Q8_0, Q4_0, Q4_K, Q5_K,
// Q6_K) the activations are first quantized to 8 bits (32-element blocks, as llama.cpp's Q8_1)
// into the caller's workspace and the weights are dotted with them in integers
// (kernels/gpu_quant_dot.h): the result is exact for the rounded activations, whose rounding
// (half a step of max|x| / 127 per block) is the only difference from matmul_ref. F32, F16 and
// BF16 weights use f32 activations (exact but for summation order) and need no workspace.
// gemv_activations::f32 asks for the float path for the quantized types too: each weight is
// decoded to the float model::dequantize_row gives and multiplied with x as it is, so the result
// is matmul_ref's but for summation order (what conformance runs use; no workspace needed).
// Larger batches go to launch_gemm (kernels/gemm.h). Nothing here allocates.
#pragma once

#include <cstddef>

#include "kernels/matmul.h"

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {

inline constexpr std::int64_t gemv_max_tokens = 8;

// How the quantized types meet the activations: rounded to 8 bits and dotted in integers, or
// as f32 against the decoded weights (F32/F16/BF16 weights always take the f32 path).
enum class gemv_activations { int8, f32 };

// True when launch_gemv decodes `t` (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K).
bool gemv_supports(model::ggml_type t);

// Scratch bytes launch_gemv needs for this weight type, row length and up to max_tokens tokens
// (0 for F32, F16 and BF16).
std::size_t gemv_workspace_bytes(model::ggml_type w_type, std::int64_t in, std::int64_t max_tokens);

// Enqueues the GEMV on `stream`. Preconditions, checked (hipErrorInvalidValue, nothing launched):
// 0 <= n_tokens <= gemv_max_tokens (0 launches nothing), out >= 0, in > 0 and a multiple of 8
// (F32, F16, BF16), 32 (Q8_0, Q4_0) or 256 (K-quants), w and x 16-byte aligned, a supported type,
// and for quantized types a 16-byte aligned workspace of at least
// gemv_workspace_bytes(w_type, in, n_tokens) bytes (it may be null for F32, F16 and BF16; it is
// overwritten, so one workspace serves GEMVs on one stream in turn). bias may be null; y must
// not alias x, w or the workspace.
// With gemv_activations::f32 the workspace is not used (it may be null).
hipError_t launch_gemv(const matmul_params& p, void* workspace, std::size_t workspace_bytes, hipStream_t stream,
                       gemv_activations activations = gemv_activations::int8);

}  // namespace anvil::kernels
#endif
