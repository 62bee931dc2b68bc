// kernels/blas_runtime.h — the only place vendor BLAS names appear (as gpu_runtime.h is for the
// device runtime). NVIDIA: cuBLAS (cublasGemmEx, f16/bf16 inputs, f32 accumulate and output) and
// cuBLASLt (the FP8 GEMM, blas::fp8_gemm).
// AMD: Debian ships no hipBLAS/rocBLAS, so ANVIL_GPU_HAVE_BLAS is 0 there and every call answers
// blas::not_supported; GEMM then runs the portable tiled kernel (kernels/gemm.h).
//
// The handle is created once by the GPU worker at start-up (blas::create allocates), and its
// workspace is memory the worker allocated: launch_gemm re-binds stream and workspace on every
// call (cublasSetStream resets a user workspace), so no call allocates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

#include "kernels/gpu_runtime.h"

#if defined(ANVIL_GPU_CUDA)
#include <cublasLt.h>
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

// The 8-bit GEMM (cuBLASLt, FP8 E4M3 operands, f32 accumulation; NVIDIA sm_89+): column-major
// D[m, n] (f32) = a_scale b_scale A^T B for E4M3 A [k, m] and B [k, n], both k-contiguous (ld = k,
// a multiple of 16; A, B and D 16-byte aligned), each scale one device f32 (cuBLASLt's per-row
// "outer vector" scaling was measured refused on sm_90). fast_accum: the tensor cores' own
// accumulation throughout (faster), else the partial sums are promoted to f32 at intervals
// (cuBLASLt's default for FP8).
// One object per worker, created at start-up; the matmul descriptors and the algorithm chosen for
// each shape are host objects kept for the next call of that shape (host memory only). Not
// thread-safe: the worker's thread alone calls it.
class fp8_gemm {
 public:
  fp8_gemm() = default;
  fp8_gemm(const fp8_gemm&) = delete;
  fp8_gemm& operator=(const fp8_gemm&) = delete;
  ~fp8_gemm() {
    for (auto& entry : plans_) release(entry.second);
    if (lt_) cublasLtDestroy(lt_);
  }

  status_t create() { return lt_ ? ok : cublasLtCreate(&lt_); }
  bool created() const { return lt_ != nullptr; }

  status_t run(int m, int n, int k, const void* a, const float* a_scale, const void* b, const float* b_scale, float* d,
               bool fast_accum, void* workspace, std::size_t workspace_bytes, hipStream_t stream) {
    if (!lt_) return not_supported;
    plan* p = nullptr;
    if (const status_t s = plan_for(m, n, k, fast_accum, workspace_bytes, &p); s != ok) return s;
    const void* pa = a_scale;
    const void* pb = b_scale;
    status_t s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pa, sizeof pa);
    if (s == ok) s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pb, sizeof pb);
    if (s != ok) return s;
    const float alpha = 1.f, beta = 0.f;
    return cublasLtMatmul(lt_, p->desc, &alpha, a, p->a, b, p->b, &beta, d, p->d, d, p->d, &p->algo, workspace,
                          workspace_bytes, stream);
  }

 private:
  struct plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    status_t status = not_supported;
  };
  using plan_key = std::tuple<int, int, int, bool, std::size_t>;

  static void release(plan& p) {
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.d) cublasLtMatrixLayoutDestroy(p.d);
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    p = {};
  }

  // The shape's plan, made on its first call; a shape cuBLASLt refused stays refused.
  status_t plan_for(int m, int n, int k, bool fast_accum, std::size_t ws, plan** out) {
    const plan_key kk{m, n, k, fast_accum, ws};
    if (auto it = plans_.find(kk); it != plans_.end()) {
      *out = &it->second;
      return it->second.status;
    }
    plan& p = plans_[kk];
    *out = &p;
    p.status = make(p, m, n, k, fast_accum, ws);
    if (p.status != ok) release(p), p.status = not_supported;
    return p.status;
  }

  status_t make(plan& p, int m, int n, int k, bool fast_accum, std::size_t ws) {
    status_t s = cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const std::int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    const std::int8_t fast = fast_accum ? 1 : 0;
    if (s == ok) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (s == ok) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (s == ok) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode);
    if (s == ok) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode);
    if (s == ok) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast);
    if (s == ok) s = cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, std::uint64_t(k), std::uint64_t(m), k);
    if (s == ok) s = cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, std::uint64_t(k), std::uint64_t(n), k);
    if (s == ok) s = cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, std::uint64_t(m), std::uint64_t(n), m);
    if (s != ok) return s;
    cublasLtMatmulPreference_t pref = nullptr;
    s = cublasLtMatmulPreferenceCreate(&pref);
    if (s == ok) {
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (s == ok) s = cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (s != ok) return s;
    if (found < 1) return not_supported;
    p.algo = result.algo;
    return ok;
  }

  cublasLtHandle_t lt_ = nullptr;
  std::map<plan_key, plan> plans_;
};

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

class fp8_gemm {
 public:
  status_t create() { return not_supported; }
  bool created() const { return false; }
  status_t run(int, int, int, const void*, const float*, const void*, const float*, float*, bool, void*, std::size_t,
               hipStream_t) {
    return not_supported;
  }
};

}  // namespace anvil::blas
#endif
