// The 8-bit GEMM for steps of many tokens: y[t, o] = sum_i W[o, i] * x[t, i] (+ bias) on the
// tensor cores' FP8 rate (twice the f16 rate on Hopper), for the GPU worker's `--gemm-dtype fp8`.
//
// W is not read as GGUF stores it: the worker makes an 8-bit copy of each weight once, at
// start-up (launch_make_fp8_matrix: the weight dequantized to f16, then quantized), and keeps it
// beside the original, which the GEMV and the quantized GEMM go on reading for small steps. x is
// quantized on every call, once per projection group. The products run in the vendor BLAS
// (cuBLASLt, blas::lt_gemm), which applies both scales to the f32 sums.
//
// Format: FP8 E4M3 codes with ONE f32 scale per matrix (cuBLASLt's only FP8 scaling on Hopper:
// its per-row "outer vector" mode was measured refused there, bench/GPU_NOTES.md), scale = amax /
// 448 over the matrix's finite values, codes round to nearest even and saturate
// (kv_quant.h's fp8_e4m3_encode). W's scale is fixed at start-up; x's is taken from the step's
// own largest magnitude on every call. A non-finite value of x stays in its token: NaN stays NaN
// and infinities saturate, and neither moves the step's scale, so one token's overflow does not
// spill into the other tokens' results. Error: each operand carries E4M3's 3 mantissa bits
// (relative rounding error up to 2^-4 per element) with 15 binades of range below the matrix's
// largest value, products summed in f32 (bench/GPU_NOTES.md: measured against the f16 GEMM and
// in perplexity) — far more than the f16 paths' rounding, so the path is an opt-in
// (gpu_worker_config::gemm_dtype), never the default.
//
// Nothing here allocates: the copies live where the worker planned them, the workspace is the
// caller's (gemm_fp8_workspace_bytes), the BLAS object was created at start-up.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/kv_quant.h"
#include "kernels/matmul.h"

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/blas_runtime.h"
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {

// A weight's 8-bit copy on the device: out rows of `in` codes, then its scale.
struct fp8_matrix {
  const std::uint8_t* codes = nullptr;  // [out][in], 16-byte aligned
  const float* scale = nullptr;         // one value
  std::int64_t in = 0, out = 0;
};

// Whether this build runs the path on `device`: NVIDIA compute capability 8.9+ (FP8 tensor cores)
// with cuBLASLt. A weight also needs `in` a multiple of 16 (gemm_fp8_shape_ok).
bool gemm_fp8_supported(int device);
constexpr bool gemm_fp8_shape_ok(std::int64_t in, std::int64_t out) {
  return in > 0 && in % 16 == 0 && in < (std::int64_t(1) << 31) && out > 0 && out < (std::int64_t(1) << 31);
}

// Bytes of a copy (codes, then the scale at a 256-byte aligned offset, then room for the row
// maxima its making needs), and the copy laid at `at`.
std::size_t fp8_matrix_bytes(std::int64_t in, std::int64_t out);
fp8_matrix fp8_matrix_at(void* at, std::int64_t in, std::int64_t out);

// The host reference of the format: codes of n values and the scale (what the kernels give, bit
// for bit).
inline float fp8_quantize_tensor_ref(const float* x, std::int64_t n, std::uint8_t* codes) {
  float amax = 0.f;
  for (std::int64_t i = 0; i < n; ++i) {
    if (std::isfinite(x[i])) amax = std::fmax(amax, std::fabs(x[i]));
  }
  const float scale = amax / 448.f, inv = scale > 0.f ? 1.f / scale : 0.f;
  for (std::int64_t i = 0; i < n; ++i) codes[i] = fp8_e4m3_encode(x[i] * inv);
  return scale;
}

// Makes the copy of a GGUF weight w (any type launch_dequantize takes; F16 read as it is) at
// `dst` (fp8_matrix_bytes of room, 16-byte aligned): non-F16 weights are dequantized into
// `scratch` (out x in halves, 16-byte aligned) first. Start-up only; enqueued on `stream`. The
// one-part case of launch_make_fp8_stacked below.
hipError_t launch_make_fp8_matrix(model::ggml_type type, const void* w, std::int64_t in, std::int64_t out,
                                  void* scratch, std::size_t scratch_bytes, void* dst, hipStream_t stream);

// One weight of a stacked copy: `out` rows of the copy's `in` values, as GGUF stores them.
struct fp8_stack_part {
  model::ggml_type type = model::ggml_type::F16;
  const void* w = nullptr;
  std::int64_t out = 0;
};
// The copy of several weights with the same `in`, stacked row-wise into one matrix with one scale
// (q, k and v as one projection: one GEMM where there were three): the row
// maxima of every part, then each part encoded against all of them, at `dst`
// (fp8_matrix_bytes(in, sum of the outs)). A part not in F16 is dequantized into `scratch` (its
// out x in halves, 16-byte aligned) on each of the two passes. Start-up only.
hipError_t launch_make_fp8_stacked(std::span<const fp8_stack_part> parts, std::int64_t in, void* scratch,
                                   std::size_t scratch_bytes, void* dst, hipStream_t stream);

// Quantizes `rows` x `cols` f32 values (cols a multiple of 4, x 16-byte aligned, codes 4-byte
// aligned) into E4M3 codes [rows][cols] and the one scale, in the format above; row_max is
// scratch for `rows` floats. The per-step quantization of x, exposed for its op test.
hipError_t launch_quantize_fp8(const float* x, std::int64_t rows, std::int64_t cols, std::uint8_t* codes, float* scale,
                               float* row_max, hipStream_t stream);

// The second half of launch_quantize_fp8 alone, for x whose row maxima a producer kernel already
// wrote (row_max[r]: the largest finite magnitude of row r, as launch_quantize_fp8 computes it).
// gpu_roofline prices it beside the whole quantization; no producer writes the maxima yet.
hipError_t launch_encode_fp8(const float* x, std::int64_t rows, std::int64_t cols, const float* row_max,
                             std::uint8_t* codes, float* scale, hipStream_t stream);

// Workspace bytes for x of up to max_tokens tokens of `in` values (its codes, scale, row maxima).
std::size_t gemm_fp8_workspace_bytes(std::int64_t in, std::int64_t max_tokens);

// Steps of at least this many tokens take the path (gpu_roofline --fp8-gemm, H200, Q4_K's path
// against this one with x's quantization, us): 14336x4096 at 16 / 32 / 64 tokens 24.0 / 29.9 /
// 42.9 against 22.1 / 22.7 / 24.8; 4096x14336 26.9 / 34.2 / 44.2 against 27.6 / 28.2 / 30.5;
// 4096x4096 11.9 / 15.0 / 19.9 against 11.3 / 11.5 / 12.0. From 32 it wins on every shape.
inline constexpr std::int64_t gemm_fp8_min_tokens = 32;

// Accumulation in cuBLASLt: false keeps its default for FP8 (partial sums promoted to f32 at
// intervals), true the tensor cores' own accumulator throughout. Measured (gpu_roofline --fp8-gemm,
// H200, against the f16 GEMM on uniform values): the same time within 3%, but a normalized error
// of 8e-3 to 3.2e-2 on 4096x14336 against 2.9e-4 promoted. So: promoted.
inline constexpr bool gemm_fp8_fast_accum = false;

struct gemm_fp8_projection {
  const fp8_matrix* w = nullptr;
  const float* bias = nullptr;  // [w->out] or null
  float* y = nullptr;           // [n_tokens][w->out]; must not alias x
};

struct gemm_fp8_context {
  blas::lt_gemm* blas = nullptr;  // created at start-up
  void* workspace = nullptr;       // >= gemm_fp8_workspace_bytes, 256-byte aligned
  std::size_t workspace_bytes = 0;
  void* blas_workspace = nullptr;  // the BLAS's own scratch
  std::size_t blas_workspace_bytes = 0;
};

// Several GEMMs on the same x [n_tokens][in] (f32, 16-byte aligned): x quantized once, then one
// BLAS call per projection, then its bias. Every w with the same `in`. hipErrorInvalidValue and
// nothing launched for a bad shape or workspace; hipErrorNotSupported when the BLAS refuses.
hipError_t launch_gemm_fp8_group(std::span<const gemm_fp8_projection> ps, const float* x, std::int64_t n_tokens,
                                 const gemm_fp8_context& ctx, hipStream_t stream);

}  // namespace anvil::kernels
#endif
