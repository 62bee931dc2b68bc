// Mixture-of-experts kernels (kernels/moe.h).
//
// route: one warp per token. The softmax's maximum and sum by warp reductions; then k passes,
//   each a warp arg-max over the experts not yet chosen (the lower id on a tie), as the reference.
//   Each lane owns experts lane, lane + warp, ...; a bit mask per lane marks its chosen ones.
// group: one block. Counts per expert in shared memory, an exclusive scan, then every pair takes
//   a place in its expert's range with a shared atomic (the order inside a range does not matter:
//   every pair's output is computed on its own).
// matmul: the GEMV's float path (gemv.hip, gemv_kernel) with the grid's y dimension over the
//   experts and z over the (up to two) matrices: a block owns R rows per warp of one expert's
//   matrix and walks that expert's pairs in chunks of 8, 2 and 1, so each row is read once per
//   chunk, not once per pair. Blocks of experts without pairs return at once.
// combine: one block per token: the shared expert's gate by a block reduction, then each column.
#include "kernels/moe.h"

#include <algorithm>
#include <cmath>

#include "kernels/gpu_quant.h"

namespace anvil::kernels {
namespace {

using namespace gpu_quant;

// ---- route -----------------------------------------------------------------------------------
constexpr int route_threads = 128;
constexpr int lane_experts = int(moe_max_experts / gpu::warp_size);  // experts per lane, at most
static_assert(lane_experts <= 32, "a lane's chosen experts fit one 32-bit mask");

__global__ void __launch_bounds__(route_threads) route_kernel(moe_route_params p) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const int lane = int(threadIdx.x) % gpu::warp_size;
  const std::int64_t t = std::int64_t(blockIdx.x) * (route_threads / gpu::warp_size) + threadIdx.x / gpu::warp_size;
  if (t >= p.n_tokens) return;
  const int n = int(p.n_expert), k = int(p.k);
  const float* l = p.logits + t * p.n_expert;
  float top = -INFINITY;
  for (int e = lane; e < n; e += gpu::warp_size) top = fmaxf(top, l[e]);
  top = gpu::warp_reduce_max(top);
  float sum = 0.f;
  for (int e = lane; e < n; e += gpu::warp_size) sum += expf(l[e] - top);
  sum = gpu::warp_reduce_sum(sum);
  unsigned chosen = 0;  // bit i: expert lane + i * warp_size is taken
  float total = 0.f;
  std::int32_t* ids = p.ids + t * p.k;
  float* wt = p.weights + t * p.k;
  for (int j = 0; j < k; ++j) {
    float best_p = -1.f;
    int best = n;
    for (int e = lane, i = 0; e < n; e += gpu::warp_size, ++i) {
      if (chosen & (1u << i)) continue;
      const float pe = expf(l[e] - top) / sum;
      if (pe > best_p) best_p = pe, best = e;  // ascending e: the first of equals stays
    }
    for (int m = gpu::warp_size / 2; m > 0; m /= 2) {
      const float op = gpu::shfl_xor(best_p, m);
      const int oe = gpu::shfl_xor(best, m);
      if (op > best_p || (op == best_p && oe < best)) best_p = op, best = oe;
    }
    if (best % gpu::warp_size == lane) chosen |= 1u << (best / gpu::warp_size);
    if (lane == 0) {
      ids[j] = best;
      wt[j] = best_p;
    }
    total += best_p;
  }
  if (p.normalize && lane == 0) {
    for (int j = 0; j < k; ++j) wt[j] /= total;  // what this thread wrote above
  }
}

constexpr int group_threads = 1024;

__global__ void __launch_bounds__(group_threads) group_kernel(const std::int32_t* ids, std::int64_t n_pairs,
                                                              std::int32_t n_expert, std::int32_t* offsets,
                                                              std::int32_t* sorted) {
  __shared__ std::int32_t count[moe_max_experts];
  __shared__ std::int32_t cursor[moe_max_experts];
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  for (int e = int(threadIdx.x); e < n_expert; e += group_threads) count[e] = 0;
  __syncthreads();
  for (std::int64_t i = threadIdx.x; i < n_pairs; i += group_threads) atomicAdd(&count[ids[i]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    std::int32_t at = 0;
    for (int e = 0; e < n_expert; ++e) {
      offsets[e] = at;
      cursor[e] = at;
      at += count[e];
    }
    offsets[n_expert] = at;
  }
  __syncthreads();
  for (std::int64_t i = threadIdx.x; i < n_pairs; i += group_threads) {
    sorted[atomicAdd(&cursor[ids[i]], 1)] = std::int32_t(i);
  }
}

// ---- matmul ------------------------------------------------------------------------------------
constexpr int matmul_threads = 128;
constexpr int matmul_rows = 2;  // rows per warp

struct matmul_args {
  const u8* w0;
  const u8* w1;
  float* y0;
  float* y1;
  std::size_t stride, row_bytes;
  std::int64_t in, out, x_div;
  const float* x;
  const std::int32_t* offsets;
  const std::int32_t* sorted;
};

// y[p][row] for the NT pairs at sorted[i..i + NT) and the R rows at rows[].
template <class F, int NT, int R>
__device__ __forceinline__ void matmul_chunk(const matmul_args& a, const u8* const (&rows)[R], std::int64_t row0,
                                             float* y, int i, int lane) {
  constexpr int n = F::runs * F::run_len;
  const std::int64_t in = a.in;
  std::int32_t pair[NT];
  const float* xs[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    pair[t] = a.sorted[i + t];
    xs[t] = a.x + std::int64_t(pair[t]) / a.x_div * in;
  }
  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;
  }
  const int chunks = int(in / F::block_elems) * F::chunks;
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
        const float4* xv4 = reinterpret_cast<const float4*>(xs[t] + e0);
#pragma unroll
        for (int q = 0; q < F::run_len / 4; ++q) {
          const float4 xv = xv4[q];
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
      if (row >= a.out) break;
#pragma unroll
      for (int t = 0; t < NT; ++t) y[std::int64_t(pair[t]) * a.out + row] = acc[r][t];
    }
  }
}

template <class F>
__global__ void __launch_bounds__(matmul_threads) matmul_kernel(matmul_args a) {
  constexpr int R = matmul_rows;
  const int e = int(blockIdx.y);
  const bool second = blockIdx.z == 1;
  const int lane = int(threadIdx.x) % gpu::warp_size;
  const std::int64_t warp = std::int64_t(blockIdx.x) * (matmul_threads / gpu::warp_size) + threadIdx.x / gpu::warp_size;
  const std::int64_t row0 = warp * R;
  gpu::dependency_wait();  // the grouping is the kernel before's output
  gpu::allow_dependents();
  if (row0 >= a.out) return;
  const int begin = a.offsets[e], end = a.offsets[e + 1];
  if (begin == end) return;
  const u8* base = (second ? a.w1 : a.w0) + std::size_t(e) * a.stride;
  float* y = second ? a.y1 : a.y0;
  const u8* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const std::int64_t row = row0 + r < a.out ? row0 + r : a.out - 1;  // tail rows: computed, not stored
    rows[r] = base + std::size_t(row) * a.row_bytes;
  }
  int i = begin;
  for (; end - i >= 8; i += 8) matmul_chunk<F, 8, R>(a, rows, row0, y, i, lane);
  for (; end - i >= 2; i += 2) matmul_chunk<F, 2, R>(a, rows, row0, y, i, lane);
  if (i < end) matmul_chunk<F, 1, R>(a, rows, row0, y, i, lane);
}

// ---- combine -----------------------------------------------------------------------------------
constexpr int combine_threads = 256;

__global__ void __launch_bounds__(combine_threads) combine_kernel(moe_combine_params p) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const std::int64_t t = blockIdx.x, d = p.cols;
  float g = 1.f;
  if (p.shared != nullptr && p.shared_gate != nullptr) {
    float dot = 0.f;
    for (std::int64_t i = threadIdx.x; i < d; i += combine_threads) dot += p.x[t * d + i] * p.shared_gate[i];
    dot = gpu::block_reduce_sum<combine_threads>(dot);
    g = 1.f / (1.f + expf(-dot));
  }
  const float* w = p.weights + t * p.k;
  for (std::int64_t i = threadIdx.x; i < d; i += combine_threads) {
    float s = 0.f;
    for (std::int64_t j = 0; j < p.k; ++j) s += w[j] * p.y[(t * p.k + j) * d + i];
    if (p.shared != nullptr) s += g * p.shared[t * d + i];
    p.out[t * d + i] = s;
  }
}

// Rows of these types are only 2-byte aligned (gpu_quant.h): their experts may be too.
bool two_byte_rows(model::ggml_type t) {
  return t == model::ggml_type::Q8_0 || t == model::ggml_type::Q4_0 || t == model::ggml_type::Q6_K;
}

}  // namespace

hipError_t launch_moe_route(const moe_route_params& p, hipStream_t stream) {
  if (p.n_tokens < 0 || p.n_tokens > 65535 || p.n_expert < 1 || p.n_expert > moe_max_experts || p.k < 1 ||
      p.k > std::min(p.n_expert, moe_max_used) || p.logits == nullptr || p.ids == nullptr || p.weights == nullptr ||
      p.offsets == nullptr || p.sorted == nullptr) {
    return hipErrorInvalidValue;
  }
  constexpr int per_block = route_threads / gpu::warp_size;
  if (p.n_tokens > 0) {
    const dim3 grid(static_cast<unsigned>((p.n_tokens + per_block - 1) / per_block));
    gpu::launch_dependent(route_kernel, grid, dim3(route_threads), stream, p);
  }
  // Even for no tokens: the offsets say every expert has no pairs.
  gpu::launch_dependent(group_kernel, dim3(1), dim3(group_threads), stream, static_cast<const std::int32_t*>(p.ids),
                        p.n_tokens * p.k, std::int32_t(p.n_expert), p.offsets, p.sorted);
  return hipGetLastError();
}

bool moe_matmul_supports(model::ggml_type t, std::int64_t in, std::size_t stride) {
  const std::int64_t block = gpu_block_elems(t);
  return block > 0 && in > 0 && in % block == 0 && in % 8 == 0 && stride % (two_byte_rows(t) ? 2 : 16) == 0;
}

hipError_t launch_moe_matmul(const moe_matmul_params& p, hipStream_t stream) {
  if (!moe_matmul_supports(p.w_type, p.in, p.stride) || p.out <= 0 || p.n_mats < 1 || p.n_mats > 2 ||
      p.n_expert < 1 || p.n_expert > moe_max_experts || p.x_div < 1 || p.n_pairs < 0 || p.in > (std::int64_t(1) << 30) ||
      p.out > (std::int64_t(1) << 30) || p.offsets == nullptr || p.sorted == nullptr) {
    return hipErrorInvalidValue;
  }
  const std::size_t row_bytes = *model::row_bytes(p.w_type, p.in);
  if (p.stride < row_bytes * std::size_t(p.out)) {
    return hipErrorInvalidValue;
  }
  for (int m = 0; m < p.n_mats; ++m) {
    if (!aligned16(p.w[m]) || p.y[m] == nullptr) return hipErrorInvalidValue;
  }
  if (!aligned16(p.x)) return hipErrorInvalidValue;
  if (p.n_pairs == 0) return hipSuccess;
  const matmul_args a{.w0 = static_cast<const u8*>(p.w[0]),
                      .w1 = static_cast<const u8*>(p.n_mats > 1 ? p.w[1] : p.w[0]),
                      .y0 = p.y[0],
                      .y1 = p.n_mats > 1 ? p.y[1] : p.y[0],
                      .stride = p.stride,
                      .row_bytes = row_bytes,
                      .in = p.in,
                      .out = p.out,
                      .x_div = p.x_div,
                      .x = p.x,
                      .offsets = p.offsets,
                      .sorted = p.sorted};
  constexpr std::int64_t rows_per_block = std::int64_t(matmul_rows) * (matmul_threads / gpu::warp_size);
  const dim3 grid(static_cast<unsigned>((p.out + rows_per_block - 1) / rows_per_block), static_cast<unsigned>(p.n_expert),
                  static_cast<unsigned>(p.n_mats));
  with_format(p.w_type, [&](auto f) {
    gpu::launch_dependent(matmul_kernel<decltype(f)>, grid, dim3(matmul_threads), stream, a);
  });
  return hipGetLastError();
}

hipError_t launch_moe_combine(const moe_combine_params& p, hipStream_t stream) {
  if (p.n_tokens < 0 || p.n_tokens > 0x7fffffff || p.k < 1 || p.cols < 1 || p.y == nullptr || p.weights == nullptr ||
      p.out == nullptr || (p.shared_gate != nullptr && (p.shared == nullptr || p.x == nullptr))) {
    return hipErrorInvalidValue;
  }
  if (p.n_tokens == 0) return hipSuccess;
  gpu::launch_dependent(combine_kernel, dim3(static_cast<unsigned>(p.n_tokens)), dim3(combine_threads), stream, p);
  return hipGetLastError();
}

}  // namespace anvil::kernels
