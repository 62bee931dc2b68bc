// kernels/blas_runtime.h — the only place vendor BLAS names appear (as gpu_runtime.h is for the
// device runtime). NVIDIA: cuBLAS (cublasGemmEx, f16/bf16 inputs, f32 accumulate and output).
// AMD: Debian ships no hipBLAS/rocBLAS, so ANVIL_GPU_HAVE_BLAS is 0 there and every call answers
// blas::not_supported; GEMM then runs the portable tiled kernel (kernels/gemm.h).
//
// The handle is created once by the GPU worker at start-up (blas::create allocates), and its
// workspace is memory the worker allocated: launch_gemm re-binds stream and workspace on every
// call (cublasSetStream resets a user workspace), so no call allocates.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/gpu_runtime.h"

#if defined(ANVIL_GPU_CUDA)
#include <cublas_v2.h>
#define ANVIL_GPU_HAVE_BLAS 1

namespace anvil::blas {

using handle_t = cublasHandle_t;
using status_t = cublasStatus_t;
inline constexpr status_t ok = CUBLAS_STATUS_SUCCESS;
inline constexpr status_t not_supported = CUBLAS_STATUS_NOT_SUPPORTED;

// What cuBLAS recommends for Hopper (32 MiB); smaller works, with fewer algorithms.
inline constexpr std::size_t recommended_workspace_bytes = std::size_t(32) << 20;

enum class dtype { f16, bf16, f32 };

inline status_t create(handle_t* h) { return cublasCreate(h); }
inline status_t destroy(handle_t h) { return cublasDestroy(h); }
inline const char* status_string(status_t s) { return cublasGetStatusString(s); }

// Binds the stream, then the caller's workspace (in that order: binding a stream drops it).
inline status_t bind(handle_t h, hipStream_t stream, void* workspace, std::size_t workspace_bytes) {
  status_t s = cublasSetStream(h, stream);
  if (s != ok) return s;
  return cublasSetWorkspace(h, workspace, workspace_bytes);
}

inline cudaDataType_t to_vendor(dtype t) {
  return t == dtype::f16 ? CUDA_R_16F : t == dtype::bf16 ? CUDA_R_16BF : CUDA_R_32F;
}

// Column-major C[m, n] = alpha * op(A) * op(B) + beta * C, f32 accumulation.
inline status_t gemm(handle_t h, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a,
                     dtype a_type, int lda, const void* b, dtype b_type, int ldb, float beta, void* c, dtype c_type,
                     int ldc) {
  return cublasGemmEx(h, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha,
                      a, to_vendor(a_type), lda, b, to_vendor(b_type), ldb, &beta, c, to_vendor(c_type), ldc,
                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

// Column-major C[m, n] (int32) = A^T * B for int8 A [k, m] and B [k, n], int32 accumulation (the
// tensor cores' 8-bit rate; what an int8 weight path would run on). m, k, lda, ldb multiples of 4.
inline status_t gemm_i8(handle_t h, int m, int n, int k, const void* a, int lda, const void* b, int ldb, void* c,
                        int ldc) {
  const std::int32_t alpha = 1, beta = 0;
  return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, a, CUDA_R_8I, lda, b, CUDA_R_8I, ldb, &beta, c,
                      CUDA_R_32I, ldc, CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT);
}

}  // namespace anvil::blas

#else
#define ANVIL_GPU_HAVE_BLAS 0

namespace anvil::blas {

struct no_handle;
using handle_t = no_handle*;
using status_t = int;
inline constexpr status_t ok = 0;
inline constexpr status_t not_supported = 1;
inline constexpr std::size_t recommended_workspace_bytes = 0;

enum class dtype { f16, bf16, f32 };

inline status_t create(handle_t* h) {
  *h = nullptr;
  return not_supported;
}
inline status_t destroy(handle_t) { return ok; }
inline const char* status_string(status_t s) { return s == ok ? "success" : "no vendor BLAS in this build"; }
inline status_t bind(handle_t, hipStream_t, void*, std::size_t) { return not_supported; }
inline status_t gemm(handle_t, bool, bool, int, int, int, float, const void*, dtype, int, const void*, dtype, int, float,
                     void*, dtype, int) {
  return not_supported;
}
inline status_t gemm_i8(handle_t, int, int, int, const void*, int, const void*, int, void*, int) { return not_supported; }

}  // namespace anvil::blas
#endif
