// GEMV kernels.
//
// Quantized weights (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K): a first kernel quantizes the activations to
// 8 bits (gpu_quant_dot.h: int8 values, one float scale per 32 elements and the sums of 16) into
// the workspace; the GEMV kernel then dots the packed weight integers with them using dp4a, so
// that its inner loop is a few integer instructions per 16 weight bytes instead of a float
// dequantization per element. Each warp owns R rows; lane l takes slices l, l + warp, ... of
// the row (16-byte runs of packed quants, or whole Q8_0/Q4_0 blocks), and loads U slices of each
// of its rows before doing any arithmetic, so that every thread has R * U independent loads in
// flight (memory-level parallelism is what reaches the bandwidth). Each activation load feeds
// R rows. The warp reduces with shuffles and lane 0 writes R x n_tokens outputs.
//
// F32/F16/BF16 weights keep float activations (exact but for summation order): lanes decode
// chunks of 8 elements (gpu_quant.h) and multiply them with float4 loads of x. The quantized
// types take the same path when the caller asks for f32 activations: chunks decode to the floats
// model::dequantize_row gives.
// No shared memory, no block-level barrier: a warp past the last row simply returns.
#include "kernels/gemv.h"

#include <algorithm>

#include "kernels/gpu_quant.h"
#include "kernels/gpu_quant_dot.h"

namespace anvil::kernels {
namespace {

using namespace gpu_quant;

constexpr int gemv_threads = 128;

template <class F, int NT, int R>
__global__ void __launch_bounds__(gemv_threads) gemv_kernel(matmul_params p, std::size_t row_bytes) {
  constexpr int n = F::runs * F::run_len;
  const int lane = int(threadIdx.x) % gpu::warp_size;
  const std::int64_t warp = std::int64_t(blockIdx.x) * (gemv_threads / gpu::warp_size) + threadIdx.x / gpu::warp_size;
  const std::int64_t row0 = warp * R;
  if (row0 >= p.out) return;

  const u8* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const std::int64_t row = row0 + r < p.out ? row0 + r : p.out - 1;  // tail rows: computed, not stored
    rows[r] = static_cast<const u8*>(p.w) + std::size_t(row) * row_bytes;
  }

  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;
  }

  const int chunks = int(p.in / F::block_elems) * F::chunks;
#pragma unroll 2
  for (int c = lane; c < chunks; c += gpu::warp_size) {
    const int blk = c / F::chunks;
    const int sub = c % F::chunks;
    float v[R][n];
#pragma unroll
    for (int r = 0; r < R; ++r) F::decode(rows[r] + std::size_t(blk) * F::block_bytes, sub, v[r]);
#pragma unroll
    for (int k = 0; k < F::runs; ++k) {
      const std::int64_t e0 = std::int64_t(blk) * F::block_elems + F::run_start(sub, k);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float4* xs = reinterpret_cast<const float4*>(p.x + t * p.in + e0);
#pragma unroll
        for (int q = 0; q < F::run_len / 4; ++q) {
          const float4 xv = xs[q];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const float* w = &v[r][k * F::run_len + 4 * q];
            acc[r][t] = fmaf(w[0], xv.x, acc[r][t]);
            acc[r][t] = fmaf(w[1], xv.y, acc[r][t]);
            acc[r][t] = fmaf(w[2], xv.z, acc[r][t]);
            acc[r][t] = fmaf(w[3], xv.w, acc[r][t]);
          }
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = gpu::warp_reduce_sum(acc[r][t]);
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const std::int64_t row = row0 + r;
      if (row >= p.out) break;
      const float b = p.bias ? p.bias[row] : 0.f;
#pragma unroll
      for (int t = 0; t < NT; ++t) p.y[t * p.out + row] = acc[r][t] + b;
    }
  }
}

// ---- activations to 8 bits -------------------------------------------------------------------------
// Four elements per thread, eight threads per 32-element block (the max and the sums of 16 by
// shuffles inside aligned groups of 8 lanes, which a warp of 32 or 64 holds whole).
constexpr int quantize_threads = 256;

__global__ void __launch_bounds__(quantize_threads) quantize_x_kernel(const float* x, std::int64_t n, i8* xq, float2* ds) {
  const std::int64_t i = (std::int64_t(blockIdx.x) * quantize_threads + threadIdx.x) * 4;
  const bool valid = i < n;  // n % 32 == 0: a group of 8 lanes is valid or not as a whole
  const float4 v = valid ? *reinterpret_cast<const float4*>(x + i) : make_float4(0.f, 0.f, 0.f, 0.f);
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
  amax = fmaxf(amax, gpu::shfl_xor(amax, 1));
  amax = fmaxf(amax, gpu::shfl_xor(amax, 2));
  amax = fmaxf(amax, gpu::shfl_xor(amax, 4));
  const float d = amax / 127.f;
  const float id = d > 0.f ? 1.f / d : 0.f;
  const int q0 = int(rintf(v.x * id)), q1 = int(rintf(v.y * id)), q2 = int(rintf(v.z * id)), q3 = int(rintf(v.w * id));
  int sum = q0 + q1 + q2 + q3;
  sum += gpu::shfl_xor(sum, 1);
  sum += gpu::shfl_xor(sum, 2);
  if (!valid) return;
  *reinterpret_cast<u32*>(xq + i) = (u32(q0) & 0xFFu) | ((u32(q1) & 0xFFu) << 8) | ((u32(q2) & 0xFFu) << 16) | (u32(q3) << 24);
  if ((threadIdx.x & 3) == 0) ds[i / 16] = make_float2(d, d * float(sum));
}

// ---- integer GEMV ------------------------------------------------------------------------------------
template <class F, int NT, int R, int U>
__global__ void __launch_bounds__(gemv_threads) gemv_q8_kernel(matmul_params p, std::size_t row_bytes, const i8* xq,
                                                              const float2* ds) {
  const int lane = int(threadIdx.x) % gpu::warp_size;
  const std::int64_t warp = std::int64_t(blockIdx.x) * (gemv_threads / gpu::warp_size) + threadIdx.x / gpu::warp_size;
  const std::int64_t row0 = warp * R;
  if (row0 >= p.out) return;

  const u8* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const std::int64_t row = row0 + r < p.out ? row0 + r : p.out - 1;  // tail rows: computed, not stored
    rows[r] = static_cast<const u8*>(p.w) + std::size_t(row) * row_bytes;
  }
  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;
  }

  const int slices = int(p.in / F::block_elems) * F::slices;
  for (int c0 = lane; c0 < slices; c0 += gpu::warp_size * U) {
    // All loads first. Slices past the end re-read the last one (in bounds) and are skipped below.
    typename F::w_t w[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = min(c0 + u * gpu::warp_size, slices - 1);
#pragma unroll
      for (int r = 0; r < R; ++r) w[u][r] = F::load(rows[r] + std::size_t(c / F::slices) * F::block_bytes, c % F::slices);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * gpu::warp_size;
      if (c >= slices) break;
      const int blk = c / F::slices, s = c % F::slices;
      typename F::dec_t dec[R];
#pragma unroll
      for (int r = 0; r < R; ++r) dec[r] = F::decode(w[u][r], s);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const auto xv = F::load_x(x8_view{xq + t * p.in, ds + t * (p.in / 16)}, blk, s);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][t] += F::dot(dec[r], xv);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = gpu::warp_reduce_sum(acc[r][t]);
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const std::int64_t row = row0 + r;
      if (row >= p.out) break;
      const float b = p.bias ? p.bias[row] : 0.f;
#pragma unroll
      for (int t = 0; t < NT; ++t) p.y[t * p.out + row] = acc[r][t] + b;
    }
  }
}

// Rows per warp and slices per lane in flight, by batch size: one row at batch 1 (enough warps
// even for 4096 rows) with four blocks (Q8_0, Q4_0) or two 32-byte K-quant slices per lane in
// flight; more rows per warp as the batch grows, so that each activation load (NT of them per
// slice) feeds more weight bytes.
template <class F, int NT>
struct q8_tile {
  static constexpr int R = NT == 1 ? 1 : NT <= 4 ? 2 : 4;
  static constexpr int U = NT == 1 ? (F::slices == 1 ? 4 : 2) : NT <= 4 ? 2 : 1;
};

template <class F, int NT>
void launch_q8_for(const matmul_params& p, std::size_t row_bytes, const i8* xq, const float2* ds, hipStream_t stream) {
  constexpr int R = q8_tile<F, NT>::R, U = q8_tile<F, NT>::U;
  constexpr std::int64_t rows_per_block = std::int64_t(R) * (gemv_threads / gpu::warp_size);
  const dim3 grid(static_cast<unsigned>((p.out + rows_per_block - 1) / rows_per_block));
  gemv_q8_kernel<F, NT, R, U><<<grid, gemv_threads, 0, stream>>>(p, row_bytes, xq, ds);
}

template <class F>
void launch_q8_tokens(const matmul_params& p, std::size_t row_bytes, const i8* xq, const float2* ds, hipStream_t stream) {
  switch (p.n_tokens) {
    case 1: launch_q8_for<F, 1>(p, row_bytes, xq, ds, stream); break;
    case 2: launch_q8_for<F, 2>(p, row_bytes, xq, ds, stream); break;
    case 3: launch_q8_for<F, 3>(p, row_bytes, xq, ds, stream); break;
    case 4: launch_q8_for<F, 4>(p, row_bytes, xq, ds, stream); break;
    case 5: launch_q8_for<F, 5>(p, row_bytes, xq, ds, stream); break;
    case 6: launch_q8_for<F, 6>(p, row_bytes, xq, ds, stream); break;
    case 7: launch_q8_for<F, 7>(p, row_bytes, xq, ds, stream); break;
    default: launch_q8_for<F, 8>(p, row_bytes, xq, ds, stream); break;
  }
}

// Workspace layout for n tokens of `in` elements: xq [n][in] int8, then ds [n][in / 16] float2
// at the next 256-byte boundary.
constexpr std::size_t round256(std::size_t n) { return (n + 255) / 256 * 256; }
std::size_t x8_bytes(std::int64_t in, std::int64_t n) { return round256(std::size_t(in * n)) + std::size_t(in / 16 * n) * 8; }

bool uses_q8(model::ggml_type t) {
  return with_dot_format(t, [](auto) {});
}

template <class F, int NT>
void launch_for(const matmul_params& p, std::size_t row_bytes, hipStream_t stream) {
  constexpr int R = NT <= 2 ? 2 : 4;
  // Sized for the widest warp the build targets (64 on CDNA): with narrower warps the extra
  // warps find no row and return at once.
  constexpr std::int64_t rows_per_block = std::int64_t(R) * (gemv_threads / gpu::warp_size);
  const dim3 grid(static_cast<unsigned>((p.out + rows_per_block - 1) / rows_per_block));
  gemv_kernel<F, NT, R><<<grid, gemv_threads, 0, stream>>>(p, row_bytes);
}

template <class F>
void launch_tokens(const matmul_params& p, std::size_t row_bytes, hipStream_t stream) {
  switch (p.n_tokens) {
    case 1: launch_for<F, 1>(p, row_bytes, stream); break;
    case 2: launch_for<F, 2>(p, row_bytes, stream); break;
    case 3: launch_for<F, 3>(p, row_bytes, stream); break;
    case 4: launch_for<F, 4>(p, row_bytes, stream); break;
    case 5: launch_for<F, 5>(p, row_bytes, stream); break;
    case 6: launch_for<F, 6>(p, row_bytes, stream); break;
    case 7: launch_for<F, 7>(p, row_bytes, stream); break;
    default: launch_for<F, 8>(p, row_bytes, stream); break;
  }
}

}  // namespace

bool gemv_supports(model::ggml_type t) { return gpu_block_elems(t) > 0; }

std::size_t gemv_workspace_bytes(model::ggml_type w_type, std::int64_t in, std::int64_t max_tokens) {
  if (!uses_q8(w_type) || in <= 0 || max_tokens <= 0) return 0;
  return x8_bytes(in, std::min(max_tokens, gemv_max_tokens));
}

hipError_t launch_gemv(const matmul_params& p, void* workspace, std::size_t workspace_bytes, hipStream_t stream,
                       gemv_activations activations) {
  const std::int64_t block = gpu_block_elems(p.w_type);
  if (block == 0 || p.n_tokens < 0 || p.n_tokens > gemv_max_tokens || p.out < 0 || p.in <= 0 || p.in % block != 0) {
    return hipErrorInvalidValue;
  }
  if (p.n_tokens == 0 || p.out == 0) return hipSuccess;
  if (!aligned16(p.w) || !aligned16(p.x) || p.y == nullptr) return hipErrorInvalidValue;
  // Grid size: out / rows_per_block blocks must fit the x dimension (2^31 - 1); slice counts an int.
  if (p.out > (std::int64_t(1) << 31) || p.in > (std::int64_t(1) << 30)) return hipErrorInvalidValue;
  const std::size_t row_bytes = *model::row_bytes(p.w_type, p.in);
  if (!uses_q8(p.w_type) || activations == gemv_activations::f32) {
    with_format(p.w_type, [&](auto f) { launch_tokens<decltype(f)>(p, row_bytes, stream); });
    return hipGetLastError();
  }
  if (workspace == nullptr || !aligned16(workspace) || workspace_bytes < x8_bytes(p.in, p.n_tokens)) {
    return hipErrorInvalidValue;
  }
  auto* xq = static_cast<i8*>(workspace);
  auto* ds = reinterpret_cast<float2*>(static_cast<u8*>(workspace) + round256(std::size_t(p.in * p.n_tokens)));
  const std::int64_t n = p.in * p.n_tokens;
  const std::int64_t qblocks = (n / 4 + quantize_threads - 1) / quantize_threads;
  quantize_x_kernel<<<dim3(static_cast<unsigned>(qblocks)), quantize_threads, 0, stream>>>(p.x, n, xq, ds);
  with_dot_format(p.w_type, [&](auto f) { launch_q8_tokens<decltype(f)>(p, row_bytes, xq, ds, stream); });
  return hipGetLastError();
}

}  // namespace anvil::kernels
