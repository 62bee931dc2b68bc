// Mixture-of-experts kernels (kernels/moe.h).
//
// route: one warp per token. The softmax's maximum and sum by warp reductions; then k passes,
//   each a warp arg-max over the experts not yet chosen (the lower id on a tie), as the reference.
//   Each lane owns experts lane, lane + warp, ...; a bit mask per lane marks its chosen ones.
//   Steps of up to 8 tokens: each token by a whole block, a thread per expert finding its rank.
// group: one block, a thread per expert. Counts per expert in shared memory, block-wide scans of
//   the counts (offsets) and of "has pairs" (the active list), then every pair takes a place in
//   its expert's range with a shared atomic (the order inside a range does not matter: every
//   pair's output is computed on its own). Steps of up to a token per warp of a 1,024-thread block
//   route and group in one block (route_group_kernel) of as few threads as the experts and tokens
//   need: a launch less per layer.
// router: up to 8 tokens, a block per expert splitting the row; above, a warp per 4 experts x 8
//   tokens (each x load feeds four experts), lanes striding over the row in float4s.
// matmul: the GEMV's float path (gemv.hip, gemv_kernel) with the grid's y dimension over the
//   active experts (at most min(n_expert, pairs) of them) and z over the (up to two) matrices: a
//   block owns R rows per warp of one expert's matrix and walks that expert's pairs in chunks of
//   8, 2 and 1, so each row is read once per chunk, not once per pair. With 8-bit activations,
//   the GEMV's integer path on the same grid, a row per group of 4, 8 or 32 lanes (q8_kernel).
//   One token's step: the grid's y over its k pairs instead (q8_pair_kernel), each block reading
//   its pair's expert from the route's ids, which the route then makes without the grouping.
// combine: a block per (256 columns, token); the shared expert's gate by a block reduction.
#include "kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/gpu_quant_dot.h"

namespace anvil::kernels {
namespace {

using namespace gpu_quant;

// ---- route -----------------------------------------------------------------------------------
constexpr int route_threads = 128;
constexpr int lane_experts = int(moe_max_experts / gpu::warp_size);  // experts per lane, at most
static_assert(lane_experts <= 32, "a lane's chosen experts fit one 32-bit mask");

// A probability's key in the top-k order: the probability, or for a NaN (a NaN logit) -0.5, below
// every probability (>= 0) and above no choice (-1): such experts come last, the lower id first,
// so that k valid ids are always chosen.
__device__ __forceinline__ float route_key(float pe) { return pe == pe ? pe : -0.5f; }

// The softmax's maximum and sum over a token's n logits l, by a warp (each lane striding from
// `lane`; every lane gets both): both routes' floats.
__device__ __forceinline__ void route_softmax(const float* l, int n, int lane, float& top, float& sum) {
  top = -INFINITY;
  for (int e = lane; e < n; e += gpu::warp_size) top = fmaxf(top, l[e]);
  top = gpu::warp_reduce_max(top);
  sum = 0.f;
  for (int e = lane; e < n; e += gpu::warp_size) sum += expf(l[e] - top);
  sum = gpu::warp_reduce_sum(sum);
}

// Token t's experts and weights, by the warp whose lane this is.
__device__ __forceinline__ void route_token(const moe_route_params& p, std::int64_t t, int lane) {
  const int n = int(p.n_expert), k = int(p.k);
  const float* l = p.logits + t * p.n_expert;
  float top, sum;
  route_softmax(l, n, lane, top, sum);
  unsigned chosen = 0;  // bit i: expert lane + i * warp_size is taken
  float total = 0.f;
  std::int32_t* ids = p.ids + t * p.k;
  float* wt = p.weights + t * p.k;
  for (int j = 0; j < k; ++j) {
    float best_key = -1.f, best_p = 0.f;
    int best = n;
    for (int e = lane, i = 0; e < n; e += gpu::warp_size, ++i) {
      if (chosen & (1u << i)) continue;
      const float pe = expf(l[e] - top) / sum;
      if (route_key(pe) > best_key) best_key = route_key(pe), best_p = pe, best = e;  // ascending e: the first of equals stays
    }
    for (int m = gpu::warp_size / 2; m > 0; m /= 2) {
      const float ok = gpu::shfl_xor(best_key, m), op = gpu::shfl_xor(best_p, m);
      const int oe = gpu::shfl_xor(best, m);
      if (ok > best_key || (ok == best_key && oe < best)) best_key = ok, best_p = op, best = oe;
    }
    if (best % gpu::warp_size == lane) chosen |= 1u << (best / gpu::warp_size);
    if (lane == 0) {
      ids[j] = best;
      wt[j] = best_p;
    }
    total += best_p;
  }
  if (lane == 0) {  // what this thread wrote above
    for (int j = 0; j < k; ++j) {
      if (p.normalize) wt[j] /= total;
      if (p.expert_scale != nullptr) wt[j] *= p.expert_scale[ids[j]];
    }
  }
}

// Token t's experts and weights by a whole block of Threads >= n_expert threads, a thread per
// expert: the softmax's maximum and sum by warp 0 (route_softmax, as route_token),
// then each expert's rank among all of them (higher key first, the lower id on a tie) in one pass
// over shared memory; the k first write themselves. No k rounds of warp-wide arg max: what a decode
// step of one token waits on. prob: shared, [moe_max_experts]; picked: shared, [moe_max_used].
template <int Threads>
__device__ __forceinline__ void route_token_block(const moe_route_params& p, std::int64_t t, float* prob, float* picked) {
  __shared__ float top_sum[2];
  const int n = int(p.n_expert), k = int(p.k), e = int(threadIdx.x);
  const float* l = p.logits + t * p.n_expert;
  if (e < gpu::warp_size) {
    float top, sum;
    route_softmax(l, n, e, top, sum);
    if (e == 0) top_sum[0] = top, top_sum[1] = sum;
  }
  __syncthreads();
  const float pe = e < n ? expf(l[e] - top_sum[0]) / top_sum[1] : 0.f;
  const float key = route_key(pe);
  if (e < n) prob[e] = key;
  __syncthreads();
  int rank = 0;
  if (e < n) {
    for (int o = 0; o < n; ++o) {
      const float q = prob[o];
      rank += q > key || (q == key && o < e);
    }
  }
  const bool mine = e < n && rank < k;
  if (mine) {
    p.ids[t * p.k + rank] = e;
    picked[rank] = pe;
  }
  __syncthreads();  // picked complete; prob and top_sum free for the next token
  if (mine) {
    float total = 0.f;  // in rank order, as route_token adds them
    for (int j = 0; j < k; ++j) total += picked[j];
    const float w = p.normalize ? pe / total : pe;
    p.weights[t * p.k + rank] = p.expert_scale != nullptr ? w * p.expert_scale[e] : w;
  }
}

__global__ void __launch_bounds__(route_threads) route_kernel(moe_route_params p) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const std::int64_t t = std::int64_t(blockIdx.x) * (route_threads / gpu::warp_size) + threadIdx.x / gpu::warp_size;
  if (t < p.n_tokens) route_token(p, t, int(threadIdx.x) % gpu::warp_size);
}

constexpr int group_threads = 1024;
static_assert(group_threads >= moe_max_experts, "a thread per expert");

// The grouping of the pairs by expert, by a whole block of Threads >= n_expert threads.
template <int Threads>
__device__ __forceinline__ void group_pairs(const std::int32_t* ids, std::int64_t n_pairs, std::int32_t n_expert,
                                            std::int32_t* offsets, std::int32_t* sorted, std::int32_t* active) {
  __shared__ std::int32_t count[moe_max_experts];
  __shared__ std::int32_t cursor[moe_max_experts];
  const int e = int(threadIdx.x);
  if (e < n_expert) count[e] = 0;
  __syncthreads();
  for (std::int64_t i = threadIdx.x; i < n_pairs; i += Threads) atomicAdd(&count[ids[i]], 1);
  __syncthreads();
  const std::int32_t c = e < n_expert ? count[e] : 0;
  std::int32_t pairs = 0, n_active = 0;
  const std::int32_t at = gpu::block_exclusive_scan<Threads>(c, pairs);
  const std::int32_t slot = gpu::block_exclusive_scan<Threads>(c > 0 ? 1 : 0, n_active);
  if (e < n_expert) {
    offsets[e] = at;
    cursor[e] = at;
    if (c > 0) active[1 + slot] = e;
  }
  if (e == 0) {
    offsets[n_expert] = pairs;
    active[0] = n_active;
  }
  __syncthreads();
  for (std::int64_t i = threadIdx.x; i < n_pairs; i += Threads) {
    sorted[atomicAdd(&cursor[ids[i]], 1)] = std::int32_t(i);
  }
}

__global__ void __launch_bounds__(group_threads) group_kernel(const std::int32_t* ids, std::int64_t n_pairs,
                                                              std::int32_t n_expert, std::int32_t* offsets,
                                                              std::int32_t* sorted, std::int32_t* active) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  group_pairs<group_threads>(ids, n_pairs, n_expert, offsets, sorted, active);
}

// Both in one block for steps of up to a token per warp: a launch less on every layer. The block
// is as small as the experts and tokens allow (a barrier over 1,024 threads costs more than one
// over 128). ByBlock (steps of up to block_route_tokens tokens, decode): each token routed by the
// whole block in turn (route_token_block); else a warp per token.
constexpr int block_route_tokens = 8;

template <int Threads, bool ByBlock>
__global__ void __launch_bounds__(Threads) route_group_kernel(moe_route_params p) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  if constexpr (ByBlock) {
    __shared__ float prob[moe_max_experts];
    __shared__ float picked[moe_max_used];
    for (std::int64_t t = 0; t < p.n_tokens; ++t) route_token_block<Threads>(p, t, prob, picked);
  } else {
    const std::int64_t t = threadIdx.x / gpu::warp_size;
    if (t < p.n_tokens) route_token(p, t, int(threadIdx.x) % gpu::warp_size);
  }
  if (p.offsets == nullptr) return;  // ids and weights only
  __syncthreads();  // the ids this block wrote are visible to all its threads
  group_pairs<Threads>(p.ids, p.n_tokens * p.k, std::int32_t(p.n_expert), p.offsets, p.sorted, p.active);
}

// ---- router ------------------------------------------------------------------------------------
constexpr int router_threads = 128;
constexpr int router_tokens = 8;

template <int E>
__global__ void __launch_bounds__(router_threads) router_kernel(moe_router_params p) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const int lane = int(threadIdx.x) % gpu::warp_size;
  const std::int64_t e0 = (std::int64_t(blockIdx.x) * (router_threads / gpu::warp_size) + threadIdx.x / gpu::warp_size) * E;
  const std::int64_t t0 = std::int64_t(blockIdx.y) * router_tokens;
  if (e0 >= p.n_expert) return;
  const std::int64_t e_left = p.n_expert - e0, t_left = p.n_tokens - t0;
  const int n_e = e_left < E ? int(e_left) : E, n_t = t_left < router_tokens ? int(t_left) : router_tokens;
  float acc[E][router_tokens];
#pragma unroll
  for (int i = 0; i < E; ++i) {
#pragma unroll
    for (int t = 0; t < router_tokens; ++t) acc[i][t] = 0.f;
  }
  const std::int64_t in = p.in;
  for (std::int64_t c = std::int64_t(lane) * 4; c < in; c += 4 * gpu::warp_size) {
    float4 w[E];
#pragma unroll
    for (int i = 0; i < E; ++i) {
      w[i] = *reinterpret_cast<const float4*>(p.w + (e0 + (i < n_e ? i : n_e - 1)) * in + c);
    }
#pragma unroll
    for (int t = 0; t < router_tokens; ++t) {
      if (t >= n_t) break;
      const float4 xv = *reinterpret_cast<const float4*>(p.x + (t0 + t) * in + c);
#pragma unroll
      for (int i = 0; i < E; ++i) {
        acc[i][t] = fmaf(w[i].x, xv.x, acc[i][t]);
        acc[i][t] = fmaf(w[i].y, xv.y, acc[i][t]);
        acc[i][t] = fmaf(w[i].z, xv.z, acc[i][t]);
        acc[i][t] = fmaf(w[i].w, xv.w, acc[i][t]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < E; ++i) {
#pragma unroll
    for (int t = 0; t < router_tokens; ++t) acc[i][t] = gpu::warp_reduce_sum(acc[i][t]);
  }
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < E; ++i) {
#pragma unroll
      for (int t = 0; t < router_tokens; ++t) {
        if (i < n_e && t < n_t) p.logits[(t0 + t) * p.n_expert + e0 + i] = acc[i][t] + (p.bias ? p.bias[e0 + i] : 0.f);
      }
    }
  }
}

// Steps of up to router_tokens tokens: a block per expert, its threads splitting the row (every
// float4 of a thread loaded before the sums: one memory latency, not one per warp-wide stride),
// the partial sums through shared memory.
__global__ void __launch_bounds__(router_threads) router_split_kernel(moe_router_params p) {
  constexpr int warps = router_threads / gpu::warp_size;
  __shared__ float part[warps][router_tokens];
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const std::int64_t e = blockIdx.x, in = p.in;
  const int n_t = int(p.n_tokens);
  const float* w = p.w + e * in;
  float acc[router_tokens];
#pragma unroll
  for (int t = 0; t < router_tokens; ++t) acc[t] = 0.f;
#pragma unroll 4
  for (std::int64_t c = std::int64_t(threadIdx.x) * 4; c < in; c += 4 * router_threads) {
    const float4 wv = *reinterpret_cast<const float4*>(w + c);
#pragma unroll
    for (int t = 0; t < router_tokens; ++t) {
      if (t >= n_t) break;
      const float4 xv = *reinterpret_cast<const float4*>(p.x + t * in + c);
      acc[t] = fmaf(wv.x, xv.x, acc[t]);
      acc[t] = fmaf(wv.y, xv.y, acc[t]);
      acc[t] = fmaf(wv.z, xv.z, acc[t]);
      acc[t] = fmaf(wv.w, xv.w, acc[t]);
    }
  }
  const int lane = int(threadIdx.x) % gpu::warp_size, warp = int(threadIdx.x) / gpu::warp_size;
#pragma unroll
  for (int t = 0; t < router_tokens; ++t) {
    acc[t] = gpu::warp_reduce_sum(acc[t]);
    if (lane == 0) part[warp][t] = acc[t];
  }
  __syncthreads();
  if (int(threadIdx.x) < n_t) {
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < warps; ++i) sum += part[i][threadIdx.x];
    p.logits[std::int64_t(threadIdx.x) * p.n_expert + e] = sum + (p.bias ? p.bias[e] : 0.f);
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
  const float* b0;  // [n_expert, out] or null
  const float* b1;
  std::size_t stride, row_bytes;
  std::int64_t in, out, x_div;
  const float* x;
  const std::int32_t* offsets;
  const std::int32_t* sorted;
  const std::int32_t* active;
};

// y[p][row] (+ bias[row]) for the NT pairs at sorted[i..i + NT) and the R rows at rows[].
template <class F, int NT, int R>
__device__ __forceinline__ void matmul_chunk(const matmul_args& a, const u8* const (&rows)[R], std::int64_t row0,
                                             float* y, const float* bias, int i, int lane) {
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
      const float b = bias ? bias[row] : 0.f;
#pragma unroll
      for (int t = 0; t < NT; ++t) y[std::int64_t(pair[t]) * a.out + row] = acc[r][t] + b;
    }
  }
}

template <class F>
__global__ void __launch_bounds__(matmul_threads) matmul_kernel(matmul_args a) {
  constexpr int R = matmul_rows;
  const bool second = blockIdx.z == 1;
  const int lane = int(threadIdx.x) % gpu::warp_size;
  const std::int64_t warp = std::int64_t(blockIdx.x) * (matmul_threads / gpu::warp_size) + threadIdx.x / gpu::warp_size;
  const std::int64_t row0 = warp * R;
  gpu::dependency_wait();  // the grouping is the kernel before's output
  gpu::allow_dependents();
  if (row0 >= a.out || int(blockIdx.y) >= a.active[0]) return;
  const int e = a.active[1 + blockIdx.y];
  const int begin = a.offsets[e], end = a.offsets[e + 1];
  const u8* base = (second ? a.w1 : a.w0) + std::size_t(e) * a.stride;
  float* y = second ? a.y1 : a.y0;
  const float* bias = second ? a.b1 : a.b0;
  if (bias) bias += std::int64_t(e) * a.out;
  const u8* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const std::int64_t row = row0 + r < a.out ? row0 + r : a.out - 1;  // tail rows: computed, not stored
    rows[r] = base + std::size_t(row) * a.row_bytes;
  }
  int i = begin;
  for (; end - i >= 8; i += 8) matmul_chunk<F, 8, R>(a, rows, row0, y, bias, i, lane);
  for (; end - i >= 2; i += 2) matmul_chunk<F, 2, R>(a, rows, row0, y, bias, i, lane);
  if (i < end) matmul_chunk<F, 1, R>(a, rows, row0, y, bias, i, lane);
}

// ---- matmul on 8-bit activations -----------------------------------------------------------------
// The GEMV's integer path (gemv.hip gemv_q8_kernel, gpu_quant_dot.h) per expert: a group of L
// lanes owns a row and a warp warp_size / L rows, so that short rows keep every lane busy (a
// 768-long Q4_K row is 12 slices: L = 4), each lane with U slices' loads in flight at once.
struct q8_args {
  const u8* w0;
  const u8* w1;
  float* y0;
  float* y1;
  const float* b0;  // [n_expert, out] or null
  const float* b1;
  std::size_t stride, row_bytes;
  std::int64_t in, out, x_div;
  const i8* xq;
  const float2* ds;
  const std::int32_t* offsets;
  const std::int32_t* sorted;
  const std::int32_t* active;
};

constexpr int q8_slices_in_flight = 4;

// y[p][row] (+ b) for the NT pairs pair[], by the L lanes (gl their index) owning `row`.
template <class F, int NT, int L>
__device__ __forceinline__ void q8_chunk(const q8_args& a, const u8* row_w, std::int64_t row, bool store, float* y,
                                         float b, const std::int32_t (&pair)[NT], int gl) {
  constexpr int U = q8_slices_in_flight;
  const std::int64_t in = a.in;
  x8_view xs[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const std::int64_t xr = std::int64_t(pair[t]) / a.x_div;
    xs[t] = x8_view{a.xq + xr * in, a.ds + xr * (in / 16)};
  }
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.f;
  const int slices = int(in / F::block_elems) * F::slices;
  for (int c0 = gl; c0 < slices; c0 += L * U) {
    typename F::w_t wv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = min(c0 + u * L, slices - 1);  // past the end: re-read, skipped below
      wv[u] = F::load(row_w + std::size_t(c / F::slices) * F::block_bytes, c % F::slices);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * L;
      if (c >= slices) break;
      const typename F::dec_t dec = F::decode(wv[u], c % F::slices);
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[t] += F::dot(dec, F::load_x(xs[t], c / F::slices, c % F::slices));
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
#pragma unroll
    for (int m = L / 2; m > 0; m /= 2) acc[t] += gpu::shfl_xor(acc[t], m);
  }
  if (gl == 0 && store) {
#pragma unroll
    for (int t = 0; t < NT; ++t) y[std::int64_t(pair[t]) * a.out + row] = acc[t] + b;
  }
}

// MaxNT: the most pairs a chunk takes. Steps where no expert has two pairs (one token) take
// MaxNT = 1: without the 8-pair chunk's registers more warps fit a multiprocessor.
template <class F, int L, int MaxNT>
__global__ void __launch_bounds__(matmul_threads) q8_kernel(q8_args a) {
  constexpr int rows_per_warp = gpu::warp_size / L;
  const bool second = blockIdx.z == 1;
  const int lane = int(threadIdx.x) % gpu::warp_size;
  const std::int64_t warp = std::int64_t(blockIdx.x) * (matmul_threads / gpu::warp_size) + threadIdx.x / gpu::warp_size;
  const std::int64_t row0 = warp * rows_per_warp, r = row0 + lane / L;
  gpu::dependency_wait();  // the grouping and the activations are the kernels before's output
  gpu::allow_dependents();
  if (row0 >= a.out || int(blockIdx.y) >= a.active[0]) return;  // whole warps: the shuffles need every lane
  const int e = a.active[1 + blockIdx.y];
  const int begin = a.offsets[e], end = a.offsets[e + 1];
  const bool store = r < a.out;
  const std::int64_t row = store ? r : a.out - 1;  // tail rows: computed, not stored
  const u8* row_w = (second ? a.w1 : a.w0) + std::size_t(e) * a.stride + std::size_t(row) * a.row_bytes;
  float* y = second ? a.y1 : a.y0;
  const float* bias = second ? a.b1 : a.b0;
  const float b = bias ? bias[std::int64_t(e) * a.out + row] : 0.f;
  const int gl = lane % L;
  // The NT pairs at sorted[i..i + NT) in a chunk.
  const auto chunk = [&](auto nt, int i) {
    constexpr int NT = decltype(nt)::value;
    std::int32_t pair[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) pair[t] = a.sorted[i + t];
    q8_chunk<F, NT, L>(a, row_w, row, store, y, b, pair, gl);
  };
  int i = begin;
  if constexpr (MaxNT >= 8) {
    for (; end - i >= 8; i += 8) chunk(std::integral_constant<int, 8>{}, i);
    for (; end - i >= 2; i += 2) chunk(std::integral_constant<int, 2>{}, i);
  }
  for (; i < end; ++i) chunk(std::integral_constant<int, 1>{}, i);
}

// A step's pairs each on its own (no grouping): block row y computes pair y, whose expert is
// pair_experts[y] (the route's ids). A pair's rows and dots are q8_kernel's one-pair chunk: the
// same floats. What it saves over q8_kernel for a token's step: the grouping, and the chain of
// loads (active, offsets, sorted) before a block's first weight load.
template <class F, int L>
__global__ void __launch_bounds__(matmul_threads) q8_pair_kernel(q8_args a, const std::int32_t* pair_experts) {
  constexpr int rows_per_warp = gpu::warp_size / L;
  const bool second = blockIdx.z == 1;
  const int lane = int(threadIdx.x) % gpu::warp_size;
  const std::int64_t warp = std::int64_t(blockIdx.x) * (matmul_threads / gpu::warp_size) + threadIdx.x / gpu::warp_size;
  const std::int64_t row0 = warp * rows_per_warp, r = row0 + lane / L;
  const std::int32_t pair[1] = {std::int32_t(blockIdx.y)};
  gpu::dependency_wait();  // the route and the activations are the kernels before's output
  gpu::allow_dependents();
  if (row0 >= a.out) return;  // whole warps: the shuffles need every lane
  const int e = pair_experts[pair[0]];
  const bool store = r < a.out;
  const std::int64_t row = store ? r : a.out - 1;  // tail rows: computed, not stored
  const u8* row_w = (second ? a.w1 : a.w0) + std::size_t(e) * a.stride + std::size_t(row) * a.row_bytes;
  const float* bias = second ? a.b1 : a.b0;
  q8_chunk<F, 1, L>(a, row_w, row, store, second ? a.y1 : a.y0, bias ? bias[std::int64_t(e) * a.out + row] : 0.f, pair,
                    lane % L);
}

// Lanes per row: about a slice in flight per lane and more rows per warp when rows are short.
int q8_lanes(std::int64_t slices) { return slices >= 4 * q8_slices_in_flight * 8 ? 32 : slices >= 2 * 8 ? 8 : 4; }

// ---- combine -----------------------------------------------------------------------------------
constexpr int combine_threads = 256;

__global__ void __launch_bounds__(combine_threads) combine_kernel(moe_combine_params p) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const std::int64_t t = blockIdx.y, d = p.cols;
  float g = 1.f;
  if (p.shared != nullptr && p.shared_gate != nullptr) {
    float dot = 0.f;
    for (std::int64_t i = threadIdx.x; i < d; i += combine_threads) dot += p.x[t * d + i] * p.shared_gate[i];
    dot = gpu::block_reduce_sum<combine_threads>(dot);
    g = 1.f / (1.f + expf(-dot));
  }
  const float* w = p.weights + t * p.k;
  const std::int64_t i = std::int64_t(blockIdx.x) * combine_threads + threadIdx.x;
  if (i >= d) return;
  float s = 0.f;
  for (std::int64_t j = 0; j < p.k; ++j) s += w[j] * p.y[(t * p.k + j) * d + i];
  if (p.shared != nullptr) s += g * p.shared[t * d + i];
  p.out[t * d + i] = s;
}


}  // namespace

hipError_t launch_moe_router(const moe_router_params& p, hipStream_t stream) {
  if (p.in <= 0 || p.in % 4 != 0 || p.n_expert < 1 || p.n_expert > moe_max_experts || p.n_tokens < 0 ||
      p.n_tokens > 65535 * std::int64_t(router_tokens) || !aligned16(p.w) || !aligned16(p.x) || p.logits == nullptr) {
    return hipErrorInvalidValue;
  }
  if (p.n_tokens == 0) return hipSuccess;
  constexpr int warps = router_threads / gpu::warp_size;
  const unsigned token_blocks = static_cast<unsigned>((p.n_tokens + router_tokens - 1) / router_tokens);
  const auto launch = [&](auto kernel, std::int64_t per_warp) {
    const std::int64_t per_block = per_warp * warps;
    const dim3 grid(static_cast<unsigned>((p.n_expert + per_block - 1) / per_block), token_blocks);
    gpu::launch_dependent(kernel, grid, dim3(router_threads), stream, p);
  };
  if (p.n_tokens <= router_tokens) {
    gpu::launch_dependent(router_split_kernel, dim3(static_cast<unsigned>(p.n_expert)), dim3(router_threads), stream, p);
  } else {
    launch(router_kernel<4>, 4);
  }
  return hipGetLastError();
}

hipError_t launch_moe_route(const moe_route_params& p, hipStream_t stream) {
  if (p.n_tokens < 0 || p.n_tokens > 65535 || p.n_expert < 1 || p.n_expert > moe_max_experts || p.k < 1 ||
      p.k > std::min(p.n_expert, moe_max_used) || p.logits == nullptr || p.ids == nullptr || p.weights == nullptr ||
      (p.offsets == nullptr) != (p.sorted == nullptr) || (p.offsets == nullptr) != (p.active == nullptr)) {
    return hipErrorInvalidValue;
  }
  const bool grouped = p.offsets != nullptr;
  // One block for both: a thread for every expert, and (routing by warps) a warp per token.
  const bool by_block = p.n_tokens <= block_route_tokens;
  const std::int64_t threads = by_block ? p.n_expert : std::max(p.n_expert, p.n_tokens * gpu::warp_size);
  if (threads <= group_threads) {
    const auto launch = [&](auto block_kernel, auto warp_kernel, int n) {
      if (by_block) {
        gpu::launch_dependent(block_kernel, dim3(1), dim3(n), stream, p);
      } else {
        gpu::launch_dependent(warp_kernel, dim3(1), dim3(n), stream, p);
      }
    };
    if (threads <= 128) {
      launch(route_group_kernel<128, true>, route_group_kernel<128, false>, 128);
    } else if (threads <= 256) {
      launch(route_group_kernel<256, true>, route_group_kernel<256, false>, 256);
    } else if (threads <= 512) {
      launch(route_group_kernel<512, true>, route_group_kernel<512, false>, 512);
    } else {
      launch(route_group_kernel<1024, true>, route_group_kernel<1024, false>, 1024);
    }
    return hipGetLastError();
  }
  constexpr int per_block = route_threads / gpu::warp_size;
  if (p.n_tokens > 0) {
    const dim3 grid(static_cast<unsigned>((p.n_tokens + per_block - 1) / per_block));
    gpu::launch_dependent(route_kernel, grid, dim3(route_threads), stream, p);
  }
  if (!grouped) return hipGetLastError();
  // Even for no tokens: the offsets say every expert has no pairs.
  gpu::launch_dependent(group_kernel, dim3(1), dim3(group_threads), stream, static_cast<const std::int32_t*>(p.ids),
                        p.n_tokens * p.k, std::int32_t(p.n_expert), p.offsets, p.sorted, p.active);
  return hipGetLastError();
}

bool moe_matmul_supports(model::ggml_type t, std::int64_t in, std::size_t stride) {
  const std::int64_t block = gpu_block_elems(t);
  return block > 0 && in > 0 && in % block == 0 && in % 8 == 0 && stride % gpu_block_align(t) == 0;
}

bool moe_matmul_int8(model::ggml_type t) {
  return with_dot_format(t, [](auto) {});
}

hipError_t launch_moe_matmul(const moe_matmul_params& p, hipStream_t stream) {
  const bool by_pair = p.pair_experts != nullptr;  // the grouping is not read
  if (!moe_matmul_supports(p.w_type, p.in, p.stride) || p.out <= 0 || p.n_mats < 1 || p.n_mats > 2 ||
      p.n_expert < 1 || p.n_expert > moe_max_experts || p.x_div < 1 || p.n_pairs < 0 || p.in > (std::int64_t(1) << 30) ||
      p.out > (std::int64_t(1) << 30) ||
      (!by_pair && (p.offsets == nullptr || p.sorted == nullptr || p.active == nullptr))) {
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
  if (by_pair && (p.xq == nullptr || !moe_matmul_int8(p.w_type) || p.n_pairs > 65535)) return hipErrorInvalidValue;
  if (p.n_pairs == 0) return hipSuccess;
  const matmul_args a{.w0 = static_cast<const u8*>(p.w[0]),
                      .w1 = static_cast<const u8*>(p.n_mats > 1 ? p.w[1] : p.w[0]),
                      .y0 = p.y[0],
                      .y1 = p.n_mats > 1 ? p.y[1] : p.y[0],
                      .b0 = p.bias[0],
                      .b1 = p.n_mats > 1 ? p.bias[1] : p.bias[0],
                      .stride = p.stride,
                      .row_bytes = row_bytes,
                      .in = p.in,
                      .out = p.out,
                      .x_div = p.x_div,
                      .x = p.x,
                      .offsets = p.offsets,
                      .sorted = p.sorted,
                      .active = p.active};
  // A y slot per expert that can have pairs: blocks past the active count return at once.
  const std::int64_t slots = std::min(p.n_expert, p.n_pairs);
  if (p.xq != nullptr && moe_matmul_int8(p.w_type)) {
    if (p.x_scales == nullptr || !aligned16(p.xq) || !aligned16(p.x_scales) || p.in % 32 != 0) return hipErrorInvalidValue;
    const q8_args q{.w0 = a.w0,
                    .w1 = a.w1,
                    .y0 = a.y0,
                    .y1 = a.y1,
                    .b0 = a.b0,
                    .b1 = a.b1,
                    .stride = a.stride,
                    .row_bytes = a.row_bytes,
                    .in = a.in,
                    .out = a.out,
                    .x_div = a.x_div,
                    .xq = p.xq,
                    .ds = reinterpret_cast<const float2*>(p.x_scales),
                    .offsets = a.offsets,
                    .sorted = a.sorted,
                    .active = a.active};
    with_dot_format(p.w_type, [&](auto f) {
      using F = decltype(f);
      // grid_y: the experts' slots, or the pairs (by pair).
      const auto launch = [&](auto kernel, int lanes, std::int64_t grid_y, auto... extra) {
        const std::int64_t rows_per_block = std::int64_t(gpu::warp_size / lanes) * (matmul_threads / gpu::warp_size);
        const dim3 grid(static_cast<unsigned>((p.out + rows_per_block - 1) / rows_per_block), static_cast<unsigned>(grid_y),
                        static_cast<unsigned>(p.n_mats));
        gpu::launch_dependent(kernel, grid, dim3(matmul_threads), stream, q, extra...);
      };
      if (by_pair) {
        const auto by_lanes = [&](auto kernel, int lanes) { launch(kernel, lanes, p.n_pairs, p.pair_experts); };
        switch (q8_lanes(p.in / F::block_elems * F::slices)) {
          case 32: by_lanes(q8_pair_kernel<F, 32>, 32); break;
          case 8: by_lanes(q8_pair_kernel<F, 8>, 8); break;
          default: by_lanes(q8_pair_kernel<F, 4>, 4); break;
        }
        return;
      }
      // A token's k experts are distinct: no expert has more pairs than the step has tokens.
      const std::int64_t per_expert = p.max_expert_pairs > 0 ? std::min(p.max_expert_pairs, p.n_pairs) : p.n_pairs;
      const auto by_lanes = [&](auto one, auto many, int lanes) {
        per_expert > 1 ? launch(many, lanes, slots) : launch(one, lanes, slots);
      };
      switch (q8_lanes(p.in / F::block_elems * F::slices)) {
        case 32: by_lanes(q8_kernel<F, 32, 1>, q8_kernel<F, 32, 8>, 32); break;
        case 8: by_lanes(q8_kernel<F, 8, 1>, q8_kernel<F, 8, 8>, 8); break;
        default: by_lanes(q8_kernel<F, 4, 1>, q8_kernel<F, 4, 8>, 4); break;
      }
    });
    return hipGetLastError();
  }
  constexpr std::int64_t rows_per_block = std::int64_t(matmul_rows) * (matmul_threads / gpu::warp_size);
  const dim3 grid(static_cast<unsigned>((p.out + rows_per_block - 1) / rows_per_block), static_cast<unsigned>(slots),
                  static_cast<unsigned>(p.n_mats));
  with_format(p.w_type, [&](auto f) {
    gpu::launch_dependent(matmul_kernel<decltype(f)>, grid, dim3(matmul_threads), stream, a);
  });
  return hipGetLastError();
}

hipError_t launch_moe_combine(const moe_combine_params& p, hipStream_t stream) {
  if (p.n_tokens < 0 || p.n_tokens > 65535 || p.k < 1 || p.cols < 1 || p.y == nullptr || p.weights == nullptr ||
      p.out == nullptr || (p.shared_gate != nullptr && (p.shared == nullptr || p.x == nullptr))) {
    return hipErrorInvalidValue;
  }
  if (p.n_tokens == 0) return hipSuccess;
  const dim3 grid(static_cast<unsigned>((p.cols + combine_threads - 1) / combine_threads), static_cast<unsigned>(p.n_tokens));
  gpu::launch_dependent(combine_kernel, grid, dim3(combine_threads), stream, p);
  return hipGetLastError();
}

}  // namespace anvil::kernels
