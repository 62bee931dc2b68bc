// GEMV kernel. A block of 128 threads; each warp owns R consecutive rows (2 for 1-2 tokens, 4
// for more, so that every activation load feeds R rows) and keeps R x n_tokens accumulators.
// Lane l decodes chunks l, l + warp, ... of its rows (gpu_quant.h: 8-16 elements, runs of 8/16
// contiguous elements) and multiplies them with float4 loads of x, which stay in L1/L2: x is
// in * n_tokens * 4 bytes, re-read by every warp, while each weight byte is read exactly once.
// The warp then reduces its accumulators with shuffles and lane 0 writes R x n_tokens outputs.
// No shared memory, no block-level barrier: a warp past the last row simply returns.
#include "kernels/gemv.h"

#include "kernels/gpu_quant.h"

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

hipError_t launch_gemv(const matmul_params& p, hipStream_t stream) {
  const std::int64_t block = gpu_block_elems(p.w_type);
  if (block == 0 || p.n_tokens < 0 || p.n_tokens > gemv_max_tokens || p.out < 0 || p.in <= 0 || p.in % block != 0) {
    return hipErrorInvalidValue;
  }
  if (p.n_tokens == 0 || p.out == 0) return hipSuccess;
  if (!aligned16(p.w) || !aligned16(p.x) || p.y == nullptr) return hipErrorInvalidValue;
  // Grid size: out / rows_per_block blocks must fit the x dimension (2^31 - 1); chunk counts an int.
  if (p.out > (std::int64_t(1) << 31) || p.in > (std::int64_t(1) << 30)) return hipErrorInvalidValue;
  const std::size_t row_bytes = *model::row_bytes(p.w_type, p.in);
  with_format(p.w_type, [&](auto f) { launch_tokens<decltype(f)>(p, row_bytes, stream); });
  return hipGetLastError();
}

}  // namespace anvil::kernels
