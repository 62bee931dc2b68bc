// kernels/blas_runtime.h — the only place vendor BLAS names appear (as gpu_runtime.h is for the
// device runtime). NVIDIA: cuBLAS (cublasGemmEx, f16/bf16 inputs, f32 accumulate and output) and
// cuBLASLt (blas::lt_gemm: the FP8 GEMM, and the f16/bf16 one with plans kept per shape).
// AMD: Debian ships no hipBLAS/rocBLAS, so ANVIL_GPU_HAVE_BLAS is 0 there and every call answers
// blas::not_supported; GEMM then runs the portable tiled kernel (kernels/gemm.h).
//
// The handles are created once by the GPU worker at start-up (blas::create allocates), and the
// workspace is memory the worker allocated: bound to the cuBLAS handle with the stream
// (cublasSetStream resets a user workspace), given to every cuBLASLt call, so no call allocates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

#include "kernels/gpu_runtime.h"

namespace anvil::blas {
// The bucket of token counts lt_gemm keeps one plan for, named by its largest count: multiples of
// 16 to 64, of 64 to 256, of 256 beyond.
inline int plan_bucket(int n) {
  const int step = n <= 64 ? 16 : n <= 256 ? 64 : 256;
  return (n + step - 1) / step * step;
}
}  // namespace anvil::blas

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

// The GEMMs through cuBLASLt, each with a plan (descriptors and algorithm) kept per shape, so
// that a call costs the host microseconds. A step's token count n changes from step to step, and
// cublasGemmEx chooses again for shapes it has not seen lately: over calls with n drawn from
// 9..2048 on the H200 it took 153-443 us of the host's time per call on average (p99 up to 4.5
// ms), these plans 13-45 us (bench/GPU_NOTES.md, session 34). Plans are per bucket of n
// (plan_bucket): the algorithm chosen for the bucket's largest n runs every n in it (a count
// cuBLASLt refuses that way gets a plan of its own n).
// One object per worker, created at start-up; plans are host objects. Not thread-safe: the
// worker's thread alone calls it.
class lt_gemm {
 public:
  lt_gemm() = default;
  lt_gemm(const lt_gemm&) = delete;
  lt_gemm& operator=(const lt_gemm&) = delete;
  ~lt_gemm() {
    for (auto& entry : plans_) release(entry.second);
    if (lt_) cublasLtDestroy(lt_);
  }

  status_t create() { return lt_ ? ok : cublasLtCreate(&lt_); }
  bool created() const { return lt_ != nullptr; }

  // The 8-bit GEMM (FP8 E4M3 operands, f32 accumulation; NVIDIA sm_89+): column-major D[m, n]
  // (f32) = a_scale b_scale A^T B for E4M3 A [k, m] and B [k, n], both k-contiguous (ld = k, a
  // multiple of 16; A, B and D 16-byte aligned), each scale one device f32 (cuBLASLt's per-row
  // "outer vector" scaling was measured refused on sm_90). fast_accum: the tensor cores' own
  // accumulation throughout (faster), else the partial sums are promoted to f32 at intervals
  // (cuBLASLt's default for FP8).
  status_t run(int m, int n, int k, const void* a, const float* a_scale, const void* b, const float* b_scale, float* d,
               bool fast_accum, void* workspace, std::size_t workspace_bytes, hipStream_t stream) {
    plan* p = nullptr;
    if (const status_t s = plan_for({.in = CUDA_R_8F_E4M3, .m = m, .k = k, .fast_accum = fast_accum}, n,
                                    workspace_bytes, &p);
        s != ok) {
      return s;
    }
    const void* pa = a_scale;
    const void* pb = b_scale;
    status_t s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pa, sizeof pa);
    if (s == ok) s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pb, sizeof pb);
    if (s != ok) return s;
    return matmul(*p, a, b, d, workspace, workspace_bytes, stream);
  }

  // D[m, n] (f32) = A^T B for f16 or bf16 A [k, m] and B [k, n], both k-contiguous (ld = k), f32
  // accumulation: what blas::gemm(h, true, false, ...) computes.
  status_t run_half(dtype in, int m, int n, int k, const void* a, const void* b, float* d, void* workspace,
                    std::size_t workspace_bytes, hipStream_t stream) {
    plan* p = nullptr;
    if (const status_t s = plan_for({.in = to_vendor(in), .m = m, .k = k}, n, workspace_bytes, &p); s != ok) return s;
    return matmul(*p, a, b, d, workspace, workspace_bytes, stream);
  }

 private:
  struct shape {
    cudaDataType_t in = CUDA_R_16F;
    int m = 0, k = 0;
    bool fast_accum = false;
  };
  struct plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    std::uint64_t n = 0;  // the columns b and d are laid out for now
    std::map<int, bool> checked;  // n -> whether the algorithm runs it (cublasLtMatmulAlgoCheck)
    status_t status = not_supported;
  };
  // (input type, m, k, fast_accum, n: the bucket's, or the call's own after a refusal, as -n, workspace)
  using plan_key = std::tuple<int, int, int, bool, int, std::size_t>;

  static void release(plan& p) {
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.d) cublasLtMatrixLayoutDestroy(p.d);
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    p = {};
  }

  // The plan for n: its bucket's, laid out for n; a bucket whose algorithm cuBLASLt refuses for
  // this n falls back to a plan of n's own. A shape cuBLASLt refused stays refused.
  status_t plan_for(const shape& sh, int n, std::size_t ws, plan** out) {
    if (!lt_ || n < 1) return not_supported;
    plan* p = find_or_make(sh, plan_bucket(n), ws);
    if (p->status == ok && set_cols(*p, n) == ok) {
      const auto [it, first] = p->checked.try_emplace(n, false);
      if (first) it->second = check(*p) == ok;
      if (it->second) {
        *out = p;
        return ok;
      }
    }
    p = find_or_make(sh, -n, ws);
    *out = p;
    return p->status;
  }

  plan* find_or_make(const shape& sh, int n_key, std::size_t ws) {
    const plan_key key{int(sh.in), sh.m, sh.k, sh.fast_accum, n_key, ws};
    if (auto it = plans_.find(key); it != plans_.end()) return &it->second;
    plan& p = plans_[key];
    p.status = make(p, sh, n_key < 0 ? -n_key : n_key, ws);
    if (p.status != ok) release(p), p.status = not_supported;
    return &p;
  }

  static status_t set_cols(plan& p, int n) {
    const auto cols = std::uint64_t(n);
    if (p.n == cols) return ok;
    status_t s = cublasLtMatrixLayoutSetAttribute(p.b, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols);
    if (s == ok) s = cublasLtMatrixLayoutSetAttribute(p.d, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols);
    p.n = s == ok ? cols : 0;
    return s;
  }

  // Whether the plan's algorithm runs the shape as now laid out (host only).
  status_t check(plan& p) {
    cublasLtMatmulHeuristicResult_t r{};
    return cublasLtMatmulAlgoCheck(lt_, p.desc, p.a, p.b, p.d, p.d, &p.algo, &r);
  }

  status_t matmul(plan& p, const void* a, const void* b, float* d, void* workspace, std::size_t workspace_bytes,
                  hipStream_t stream) {
    const float alpha = 1.f, beta = 0.f;
    return cublasLtMatmul(lt_, p.desc, &alpha, a, p.a, b, p.b, &beta, d, p.d, d, p.d, &p.algo, workspace,
                          workspace_bytes, stream);
  }

  status_t make(plan& p, const shape& sh, int n, std::size_t ws) {
    const int m = sh.m, k = sh.k;
    status_t s = cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    if (s == ok) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (s == ok) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (sh.in == CUDA_R_8F_E4M3) {
      const std::int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
      const std::int8_t fast = sh.fast_accum ? 1 : 0;
      if (s == ok) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode);
      if (s == ok) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode);
      if (s == ok) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast);
    }
    if (s == ok) s = cublasLtMatrixLayoutCreate(&p.a, sh.in, std::uint64_t(k), std::uint64_t(m), k);
    if (s == ok) s = cublasLtMatrixLayoutCreate(&p.b, sh.in, std::uint64_t(k), std::uint64_t(n), k);
    if (s == ok) s = cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, std::uint64_t(m), std::uint64_t(n), m);
    if (s != ok) return s;
    p.n = std::uint64_t(n);
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

class lt_gemm {
 public:
  status_t create() { return not_supported; }
  bool created() const { return false; }
  status_t run(int, int, int, const void*, const float*, const void*, const float*, float*, bool, void*, std::size_t,
               hipStream_t) {
    return not_supported;
  }
  status_t run_half(dtype, int, int, int, const void*, const void*, float*, void*, std::size_t, hipStream_t) {
    return not_supported;
  }
};

}  // namespace anvil::blas
#endif
