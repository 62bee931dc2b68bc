// GEMM: the portable tiled kernel, the activation conversion and bias kernels, and the launcher
// that strings dequantize -> (convert ->) multiply -> bias on one stream.
//
// Tiled kernel: a block computes a 64 (outputs) x 64 (tokens) tile of y with 256 threads, each a
// 4 x 4 micro-tile. Per step of 32 along `in`, the block stages the W tile (f16 or f32) and the
// x tile (f32) into shared memory transposed ([k][row], padded against bank conflicts), then
// every thread multiplies 4 W values by 4 x values per k. Bounds are checked on every side, so
// any out, n_tokens and in work. It is the AMD path here and a reference-grade check of the
// BLAS path on NVIDIA, not a tuned kernel (no tensor cores).
#include "kernels/gemm.h"

#include <algorithm>

#include "kernels/gemm_quant.h"
#include "kernels/gpu_quant.h"

namespace anvil::kernels {
namespace {

using namespace gpu_quant;

constexpr int tile_m = 64;  // outputs (rows of W) per block
constexpr int tile_n = 64;  // tokens per block
constexpr int tile_k = 32;
constexpr int tiled_threads = 256;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(std::uint16_t h) { return gpu::half_bits_to_float(h); }

template <class WT>
__global__ void __launch_bounds__(tiled_threads)
    gemm_tiled_kernel(const WT* __restrict__ w, const float* __restrict__ x, const float* __restrict__ bias,
                      float* __restrict__ y, int in, int out, int n_tokens) {
  __shared__ float ws[tile_k][tile_m + 1];
  __shared__ float xs[tile_k][tile_n + 1];
  const int o0 = int(blockIdx.x) * tile_m;
  const int t0 = int(blockIdx.y) * tile_n;
  const int tid = int(threadIdx.x);
  const int to = tid % 16;  // this thread's outputs: o0 + to + 16 * i
  const int tt = tid / 16;  // this thread's tokens:  t0 + tt + 16 * j

  float acc[4][4] = {};
  for (int k0 = 0; k0 < in; k0 += tile_k) {
    // Stage: 64 x 32 elements each, 8 per thread; consecutive threads read consecutive k.
#pragma unroll
    for (int i = 0; i < tile_m * tile_k / tiled_threads; ++i) {
      const int e = tid + i * tiled_threads;
      const int r = e / tile_k, k = e % tile_k;
      const int o = o0 + r, t = t0 + r, kk = k0 + k;
      ws[k][r] = (o < out && kk < in) ? to_float(w[std::size_t(o) * in + kk]) : 0.f;
      xs[k][r] = (t < n_tokens && kk < in) ? x[std::size_t(t) * in + kk] : 0.f;
    }
    __syncthreads();
#pragma unroll 8
    for (int k = 0; k < tile_k; ++k) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = ws[k][to + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = xs[k][tt + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int o = o0 + to + 16 * i;
    if (o >= out) continue;
    const float b = bias ? bias[o] : 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int t = t0 + tt + 16 * j;
      if (t < n_tokens) y[std::size_t(t) * out + o] = acc[i][j] + b;
    }
  }
}

// f32 -> f16 or bf16 (round to nearest even), n elements, n a multiple of 8 (every row length is:
// the smallest format block is 8), src and dst 16-byte aligned: eight per thread and step, two
// 16-byte loads and one 16-byte store.
__device__ __forceinline__ u32 bf16_bits(float f) {
  const u32 u = __float_as_uint(f);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return nan ? ((u >> 16) | 0x40u) : ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
template <bool Bf16>
__device__ __forceinline__ u32 pack2(float a, float b) {
  if constexpr (Bf16) {
    return bf16_bits(a) | (bf16_bits(b) << 16);
  } else {
    return gpu::floats_to_half2_bits(a, b);
  }
}

template <bool Bf16>
__global__ void __launch_bounds__(256) convert_kernel(const float* __restrict__ src, std::uint16_t* __restrict__ dst,
                                                      std::int64_t n) {
  const std::int64_t n8 = n / 8;
  for (std::int64_t i = std::int64_t(blockIdx.x) * 256 + threadIdx.x; i < n8; i += std::int64_t(gridDim.x) * 256) {
    const float4 a = reinterpret_cast<const float4*>(src)[2 * i], b = reinterpret_cast<const float4*>(src)[2 * i + 1];
    gpu::store16(dst + 8 * i, make_uint4(pack2<Bf16>(a.x, a.y), pack2<Bf16>(a.z, a.w), pack2<Bf16>(b.x, b.y),
                                         pack2<Bf16>(b.z, b.w)));
  }
}

__global__ void __launch_bounds__(256) add_bias_kernel(float* __restrict__ y, const float* __restrict__ bias,
                                                       std::int64_t out, std::int64_t n) {
  for (std::int64_t i = std::int64_t(blockIdx.x) * 256 + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * 256) {
    y[i] += bias[i % out];
  }
}

unsigned elementwise_blocks(std::int64_t n) { return unsigned(std::min<std::int64_t>((n + 255) / 256, 65536)); }

constexpr std::size_t round_up(std::size_t n) { return (n + 255) / 256 * 256; }

// Scratch layout: [dequantized W][converted x], each 256-byte aligned.
std::size_t weight_scratch_bytes(gemm_algo algo, model::ggml_type t, std::int64_t in, std::int64_t out) {
  const std::size_t elems = std::size_t(in) * std::size_t(out);
  switch (algo) {
    case gemm_algo::quantized:
    case gemm_algo::vendor_blas:
      return gemm_dequantizes(t) ? round_up(elems * 2) : 0;
    case gemm_algo::tiled_f16: return t == model::ggml_type::F16 ? 0 : round_up(elems * 2);
    case gemm_algo::tiled_f32: return t == model::ggml_type::F32 ? 0 : round_up(elems * 4);
  }
  return 0;
}

bool valid_shape(const matmul_params& p) {
  const std::int64_t block = gpu_block_elems(p.w_type);
  return block > 0 && p.n_tokens >= 0 && p.out >= 0 && p.in > 0 && p.in % block == 0 && p.in < (std::int64_t(1) << 31) &&
         p.out < (std::int64_t(1) << 31) && p.n_tokens < (std::int64_t(1) << 31);
}

hipError_t run_tiled(const matmul_params& p, const gemm_context& ctx, hipStream_t stream) {
  const dim3 grid(unsigned((p.out + tile_m - 1) / tile_m), unsigned((p.n_tokens + tile_n - 1) / tile_n));
  if (grid.y > 65535) return hipErrorInvalidValue;
  const int in = int(p.in), out = int(p.out), nt = int(p.n_tokens);
  hipError_t e = hipSuccess;
  if (ctx.algo == gemm_algo::tiled_f32) {
    const float* w = static_cast<const float*>(p.w);
    if (p.w_type != model::ggml_type::F32) {
      float* scratch = static_cast<float*>(ctx.workspace);
      if ((e = launch_dequantize_f32(p.w_type, p.w, scratch, p.out, p.in, stream)) != hipSuccess) return e;
      w = scratch;
    }
    gemm_tiled_kernel<float><<<grid, tiled_threads, 0, stream>>>(w, p.x, p.bias, p.y, in, out, nt);
  } else {
    const auto* w = static_cast<const std::uint16_t*>(p.w);
    if (p.w_type != model::ggml_type::F16) {
      auto* scratch = static_cast<std::uint16_t*>(ctx.workspace);
      if ((e = launch_dequantize(p.w_type, p.w, scratch, p.out, p.in, stream)) != hipSuccess) return e;
      w = scratch;
    }
    gemm_tiled_kernel<std::uint16_t><<<grid, tiled_threads, 0, stream>>>(w, p.x, p.bias, p.y, in, out, nt);
  }
  return hipGetLastError();
}

hipError_t run_blas(const matmul_params& p, const gemm_context& ctx, hipStream_t stream) {
  if (!ANVIL_GPU_HAVE_BLAS || (ctx.blas == nullptr && ctx.lt == nullptr)) return hipErrorNotSupported;
  const bool bf16 = p.w_type == model::ggml_type::BF16;
  // A weight not stored in f16/bf16 is dequantized into the workspace, unless it comes with its f16
  // copy (made by launch_dequantize at start-up: the same values).
  const std::size_t scratch = weight_scratch_bytes(gemm_algo::vendor_blas, p.w_type, p.in, p.out);
  const bool copied = scratch > 0 && p.w16 != nullptr;
  const std::size_t w_bytes = copied ? 0 : scratch;
  auto* base = static_cast<unsigned char*>(ctx.workspace);
  const void* w = copied ? p.w16 : p.w;
  hipError_t e = hipSuccess;
  if (w_bytes > 0) {
    if ((e = launch_dequantize(p.w_type, p.w, reinterpret_cast<std::uint16_t*>(base), p.out, p.in, stream)) != hipSuccess) {
      return e;
    }
    w = base;
  }
  auto* x16 = reinterpret_cast<std::uint16_t*>(base + w_bytes);
  const std::int64_t nx = p.n_tokens * p.in;  // in % 8 == 0 (valid_shape: a multiple of the format block)
  if (bf16) {
    convert_kernel<true><<<elementwise_blocks(nx / 8), 256, 0, stream>>>(p.x, x16, nx);
  } else {
    convert_kernel<false><<<elementwise_blocks(nx / 8), 256, 0, stream>>>(p.x, x16, nx);
  }
  if ((e = hipGetLastError()) != hipSuccess) return e;

  // Row-major y[n_tokens][out] is column-major [out x n_tokens] = W (column-major [in x out],
  // transposed) times x (column-major [in x n_tokens]).
  const blas::dtype in_type = bf16 ? blas::dtype::bf16 : blas::dtype::f16;
  const int m = int(p.out), n = int(p.n_tokens), k = int(p.in);
  if (ctx.lt != nullptr) {
    if (ctx.lt->run_half(in_type, m, n, k, w, x16, p.y, ctx.blas_workspace, ctx.blas_workspace_bytes, stream) != blas::ok) {
      return hipErrorNotSupported;
    }
  } else {
    if (blas::bind(ctx.blas, stream, ctx.blas_workspace, ctx.blas_workspace_bytes) != blas::ok) return hipErrorNotSupported;
    if (blas::gemm(ctx.blas, true, false, m, n, k, 1.f, w, in_type, k, x16, in_type, k, 0.f, p.y, blas::dtype::f32, m) !=
        blas::ok) {
      return hipErrorNotSupported;
    }
  }
  if (p.bias) return launch_add_bias(p.y, p.bias, p.out, p.n_tokens, stream);
  return hipGetLastError();
}

}  // namespace

hipError_t launch_add_bias(float* y, const float* bias, std::int64_t out, std::int64_t n_tokens, hipStream_t stream) {
  const std::int64_t ny = n_tokens * out;
  if (ny <= 0) return hipSuccess;
  add_bias_kernel<<<elementwise_blocks(ny), 256, 0, stream>>>(y, bias, out, ny);
  return hipGetLastError();
}

gemm_algo default_gemm_algo() { return ANVIL_GPU_HAVE_BLAS ? gemm_algo::quantized : gemm_algo::tiled_f16; }

std::size_t gemm_workspace_bytes(gemm_algo algo, model::ggml_type w_type, std::int64_t in, std::int64_t out,
                                 std::int64_t max_tokens, bool f16_copy) {
  // The vendor path multiplies an f16 copy where there is one: no room for the dequantized weight.
  std::size_t bytes = f16_copy && gemm_uses_blas(algo) ? 0 : weight_scratch_bytes(algo, w_type, in, out);
  if (gemm_uses_blas(algo)) bytes += round_up(std::size_t(max_tokens) * std::size_t(in) * 2);
  if (algo == gemm_algo::quantized) bytes = std::max(bytes, gemm_quant_workspace_bytes(w_type, in, out, max_tokens));
  return bytes;
}

hipError_t launch_gemm(const matmul_params& p, const gemm_context& ctx, hipStream_t stream) {
  if (!valid_shape(p)) return hipErrorInvalidValue;
  if (p.n_tokens == 0 || p.out == 0) return hipSuccess;
  if (!aligned16(p.w) || !aligned16(p.x) || p.y == nullptr) return hipErrorInvalidValue;
  if (p.w16 != nullptr && !aligned16(p.w16)) return hipErrorInvalidValue;
  const std::size_t need = gemm_workspace_bytes(ctx.algo, p.w_type, p.in, p.out, p.n_tokens, p.w16 != nullptr);
  if (need > ctx.workspace_bytes || (need > 0 && !aligned16(ctx.workspace))) return hipErrorInvalidValue;
  if (ctx.algo == gemm_algo::quantized && gemm_quant_preferred(p.w_type, p.n_tokens, p.in, p.out)) {
    return launch_gemm_quant(p, ctx.workspace, ctx.workspace_bytes, stream);
  }
  return gemm_uses_blas(ctx.algo) ? run_blas(p, ctx, stream) : run_tiled(p, ctx, stream);
}

}  // namespace anvil::kernels
