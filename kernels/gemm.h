// GEMM for prefill and batches above gemv_max_tokens: y[t, o] = sum_i W[o, i] * x[t, i] (+ bias),
// the op of matmul_params (kernels/matmul.h; reference matmul_ref), W a GGUF weight on the device.
//
// Three algorithms:
//   quantized (NVIDIA sm_80+ with a BLAS; the default there): where gemm_quant_preferred (Q4_K,
//     Q5_K, Q6_K weights, steps small for the weight's size), tensor cores straight from the
//     quantized blocks (kernels/gemm_quant.h); everything else as vendor_blas. Error: as
//     vendor_blas.
//   vendor_blas (NVIDIA): W is dequantized into an f16 scratch (F16 and BF16 weights are used as
//     they are), x is converted to f16 (bf16 for BF16 weights) into scratch, and cuBLAS multiplies
//     with f32 accumulation into y; a small kernel adds the bias. Error: f16 rounding of W and x.
//   tiled (any backend; the AMD path, as Debian has no hipBLAS): W is dequantized into an f16 or
//     f32 scratch and a shared-memory tiled kernel multiplies it with x (f32), f32 accumulation.
//     tiled_f32 is exact up to summation order, which makes it the reference-grade path.
// Every buffer is the caller's: gemm_workspace_bytes() says how much scratch a shape needs, the
// BLAS handle and its workspace are created by the GPU worker at start-up (kernels/blas_runtime.h).
// Nothing here allocates.
#pragma once

#include <cstddef>

#include "kernels/matmul.h"

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/blas_runtime.h"
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {

enum class gemm_algo { quantized, vendor_blas, tiled_f16, tiled_f32 };

// The best algorithm this build has: quantized where ANVIL_GPU_HAVE_BLAS, else tiled_f16.
gemm_algo default_gemm_algo();

// Whether the algorithm calls the vendor BLAS (and so needs gemm_context::blas).
constexpr bool gemm_uses_blas(gemm_algo a) { return a == gemm_algo::quantized || a == gemm_algo::vendor_blas; }

struct gemm_context {
  gemm_algo algo = gemm_algo::tiled_f16;
  void* workspace = nullptr;           // >= gemm_workspace_bytes(...) bytes, 256-byte aligned
  std::size_t workspace_bytes = 0;
  blas::handle_t blas = nullptr;       // gemm_uses_blas: created at start-up by the caller
  void* blas_workspace = nullptr;      // gemm_uses_blas: bound to `blas` on every call, or given to `lt`'s
  std::size_t blas_workspace_bytes = 0;
  // gemm_uses_blas: when set, the products run through cuBLASLt with plans kept per shape (a call
  // costs the host microseconds where cublasGemmEx spends up to milliseconds on every shape it has
  // not seen lately: bench/GPU_NOTES.md, session 34) and `blas` is not used.
  blas::lt_gemm* lt = nullptr;
};

// Whether the vendor path turns weights of this type into f16 in its workspace on every call (every
// type but F16 and BF16, which it multiplies as stored): what an f16 copy (matmul_params::w16) saves.
constexpr bool gemm_dequantizes(model::ggml_type t) { return t != model::ggml_type::F16 && t != model::ggml_type::BF16; }

// Scratch bytes launch_gemm needs for this weight and up to max_tokens tokens (0 if it needs none);
// f16_copy: the calls pass the weight's f16 copy (matmul_params::w16), which the vendor path
// multiplies as it is.
std::size_t gemm_workspace_bytes(gemm_algo algo, model::ggml_type w_type, std::int64_t in, std::int64_t out,
                                 std::int64_t max_tokens, bool f16_copy = false);

// Enqueues the GEMM on `stream`. Preconditions as launch_gemv's (any n_tokens >= 0, in < 2^31,
// out < 2^31), plus a large enough workspace; hipErrorInvalidValue and nothing launched when
// violated, hipErrorNotSupported when the algorithm is not in this build or the BLAS call fails.
hipError_t launch_gemm(const matmul_params& p, const gemm_context& ctx, hipStream_t stream);

// y[t, o] += bias[o] for n_tokens rows of `out` values (the GEMM paths' bias epilogue).
hipError_t launch_add_bias(float* y, const float* bias, std::int64_t out, std::int64_t n_tokens, hipStream_t stream);

// Dequantizes rows x cols of a GGUF weight (the types launch_gemv supports, cols a multiple of
// their block, src 16-byte aligned) into a row-major f16 (IEEE half bits) or f32 matrix (dst
// 16-byte aligned). Values are dequantize_row's, rounded to nearest even for f16.
hipError_t launch_dequantize(model::ggml_type type, const void* src, std::uint16_t* dst_f16, std::int64_t rows,
                             std::int64_t cols, hipStream_t stream);
hipError_t launch_dequantize_f32(model::ggml_type type, const void* src, float* dst, std::int64_t rows,
                                 std::int64_t cols, hipStream_t stream);

}  // namespace anvil::kernels
#endif
