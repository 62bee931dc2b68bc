// GEMV kernels.
//
// Quantized weights with an integer path (gpu_quant_dot.h): a first kernel quantizes the activations to
// 8 bits (gpu_quant_dot.h: int8 values, one float scale per 32 elements and the sums of 16) into
// the workspace — unless the caller says a producer kernel (the norms, SwiGLU) or the previous
// GEMV on the same x already did (gemv_x8_source::workspace); the GEMV kernel then dots the packed weight integers with them using dp4a, so
// that its inner loop is a few integer instructions per 16 weight bytes instead of a float
// dequantization per element. Each warp owns R rows; lane l takes slices l, l + warp, ... of
// the row (16-byte runs of packed quants, or whole 32-element blocks), and loads U slices of each
// of its rows before doing any arithmetic, so that every thread has R * U independent loads in
// flight (memory-level parallelism is what reaches the bandwidth). Each activation load feeds
// R rows. The warp reduces with shuffles and lane 0 writes R x n_tokens outputs.
//
// F32/F16/BF16 weights (and Q2_K, Q3_K, IQ4_XS, which have no integer path yet) keep float
// activations (exact but for summation order): lanes decode
// chunks of 8 elements (gpu_quant.h) and multiply them with float4 loads of x. The quantized
// types take the same path when the caller asks for f32 activations: chunks decode to the floats
// model::dequantize_row gives.
// Both kernels serve a group of up to three matrices sharing x in one launch (group_args): the
// grid's blocks are dealt to the matrices in order.
// No shared memory, no block-level barrier: a warp past the last row simply returns — except in
// the kernels that norm their own x (gemv_norm_input, one token): each block computes the norm
// into shared memory (kernels/norm_device.h) while its first weight loads are in flight. The
// q/k/v launch that also rotates (launch_gemv_qkv_rope) gives each warp rotary pairs of rows, so
// its lane 0 rotates them and stores q, or k and v into the cache, with no block meeting another.
//
// launch_gemv_glu's kernel (one token) dots a feed-forward's gate and up rows on the same 8-bit x in
// blocks of 32 rows of both, writes their gated product, and rounds each block's 32 products to the
// 8-bit form the down projection's GEMV reads — through shared memory, behind one block barrier.
#include "kernels/gemv.h"

#include <algorithm>
#include <span>
#include <type_traits>

#include "kernels/glu_device.h"
#include "kernels/gpu_quant.h"
#include "kernels/gpu_quant_dot.h"
#include "kernels/norm_device.h"
#include "kernels/rope_device.h"

namespace anvil::kernels {
namespace {

using namespace gpu_quant;

constexpr int gemv_threads = 128;

// One launch serves a group of up to gemv_max_group matrices that share the type, `in`, the batch
// and x (the q, k and v projections; gate and up): matrix g owns blocks
// [first_block[g], first_block[g + 1]) of the grid.
struct group_args {
  const void* w[gemv_max_group] = {};
  const float* bias[gemv_max_group] = {};
  float* y[gemv_max_group] = {};
  std::int64_t out[gemv_max_group] = {};
  unsigned first_block[gemv_max_group + 1] = {};
  std::int64_t in = 0;
};
static_assert(gemv_max_group == 3, "member_of below selects among three matrices");

template <class T>
__device__ __forceinline__ T pick(int g, T a, T b, T c) { return g == 0 ? a : g == 1 ? b : c; }

// The matrix this block works on, and the block's index inside it. Parameters are read with
// constant indices only: a run-time index would copy the whole argument block to local memory in
// every thread (120 bytes of stack, a quarter of the GEMV rate on the H200).
struct group_member {
  const u8* w;
  const float* bias;
  float* y;
  std::int64_t out;
  unsigned block;
  int g;  // which matrix of the group
};
__device__ __forceinline__ group_member member_of(const group_args& a) {
  const unsigned b = blockIdx.x;
  const int g = b >= a.first_block[2] ? 2 : b >= a.first_block[1] ? 1 : 0;
  return {static_cast<const u8*>(pick(g, a.w[0], a.w[1], a.w[2])), pick(g, a.bias[0], a.bias[1], a.bias[2]),
          pick(g, a.y[0], a.y[1], a.y[2]), pick(g, a.out[0], a.out[1], a.out[2]),
          b - pick(g, a.first_block[0], a.first_block[1], a.first_block[2]), g};
}

template <class F, int NT, int R>
__global__ void __launch_bounds__(gemv_threads) gemv_kernel(group_args args, std::size_t row_bytes, const float* x) {
  constexpr int n = F::runs * F::run_len;
  const group_member m = member_of(args);
  const int lane = int(threadIdx.x) % gpu::warp_size;
  const std::int64_t warp = std::int64_t(m.block) * (gemv_threads / gpu::warp_size) + threadIdx.x / gpu::warp_size;
  const std::int64_t row0 = warp * R;
  if (row0 >= m.out) return;
  const std::int64_t in = args.in;

  const u8* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const std::int64_t row = row0 + r < m.out ? row0 + r : m.out - 1;  // tail rows: computed, not stored
    rows[r] = m.w + std::size_t(row) * row_bytes;
  }
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();

  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;
  }

  const int chunks = int(in / F::block_elems) * F::chunks;
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
        const float4* xs = reinterpret_cast<const float4*>(x + t * in + e0);
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
      if (row >= m.out) break;
      const float b = m.bias ? m.bias[row] : 0.f;
#pragma unroll
      for (int t = 0; t < NT; ++t) m.y[t * m.out + row] = acc[r][t] + b;
    }
  }
}

// ---- activations to 8 bits -------------------------------------------------------------------------
// Four elements per thread, eight threads per 32-element block (the max and the sums of 16 by
// shuffles inside aligned groups of 8 lanes, which a warp of 32 or 64 holds whole).
constexpr int quantize_threads = 256;

__global__ void __launch_bounds__(quantize_threads) quantize_x_kernel(const float* x, std::int64_t n, i8* xq, float2* ds) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const std::int64_t i = (std::int64_t(blockIdx.x) * quantize_threads + threadIdx.x) * 4;
  const bool valid = i < n;  // n % 32 == 0: a group of 8 lanes is valid or not as a whole
  quantize_x8(valid ? *reinterpret_cast<const float4*>(x + i) : make_float4(0.f, 0.f, 0.f, 0.f), i, valid, xq, ds);
}

// The n activations at x (n % 32 == 0; tokens one after the other) to 8 bits.
void launch_quantize_x(const float* x, std::int64_t n, i8* xq, float2* ds, hipStream_t stream) {
  const std::int64_t blocks = (n / 4 + quantize_threads - 1) / quantize_threads;
  const dim3 grid(static_cast<unsigned>(blocks));
  gpu::launch_dependent(quantize_x_kernel, grid, dim3(quantize_threads), stream, x, n, xq, ds);
}

// ---- integer GEMV ------------------------------------------------------------------------------------
// A warp's dots of R weight rows with NT rows of 8-bit x: acc[r][t], summed over the warp (every
// lane holds the sums). Lane l takes slices l, l + warp, ..., U of them per row loaded before any
// arithmetic. Waits for the kernel before (gpu::dependency_wait) inside: up to 4 tokens the first
// iteration's weight loads are issued before the wait, so they are in flight while that kernel
// finishes (with more, holding them across the wait costs registers the tile does not have), and
// while after_wait() (the block's norm of its own x) runs.
// Every row is summed in the same order whatever R and U, so a row's result does not depend on
// the tile.
struct no_prologue {
  __device__ void operator()() const {}
};

template <class F, int NT, int R, int U, class AfterWait = no_prologue>
__device__ __forceinline__ void q8_dots(const u8* const (&rows)[R], std::int64_t in, const i8* xq, const float2* ds,
                                        float (&acc)[R][NT], AfterWait after_wait = {}) {
  const int lane = int(threadIdx.x) % gpu::warp_size;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;
  }
  const int slices = int(in / F::block_elems) * F::slices;
  // All loads of an iteration first. Slices past the end re-read the last one (in bounds) and are
  // skipped below.
  typename F::w_t wv[U][R];
  const auto load = [&](int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = min(c0 + u * gpu::warp_size, slices - 1);
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = F::load(rows[r] + std::size_t(c / F::slices) * F::block_bytes, c % F::slices);
    }
  };
  constexpr bool early = NT <= 4;
  if (early && slices > 0) load(lane);
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  after_wait();  // the block's own x, where it norms it (every thread of the block is here)
  for (int c0 = lane; c0 < slices; c0 += gpu::warp_size * U) {
    if (!early || c0 != lane) load(c0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * gpu::warp_size;
      if (c >= slices) break;
      const int blk = c / F::slices, s = c % F::slices;
      typename F::dec_t dec[R];
#pragma unroll
      for (int r = 0; r < R; ++r) dec[r] = F::decode(wv[u][r], s);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const auto xv = F::load_x(x8_view{xq + t * in, ds + t * (in / 16)}, blk, s);
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
}

// The norm a block computes its x from (gemv_norm_input), for the Norm kernels.
struct norm_args {
  const float* h = nullptr;
  const float* delta = nullptr;
  const float* weight = nullptr;
  float* h_out = nullptr;
  int cols = 0;
  float eps = 0.f;
};

// x normed into shared memory by every block (norm_device.h), block 0 storing h + delta. The gain
// is loaded before q8_dots issues its first weight loads and waits.
template <int Threads, class F, int R, int U>
__device__ __forceinline__ void q8_dots_normed(const u8* const (&rows)[R], std::int64_t in, const norm_args& n,
                                               float (&acc)[R][1]) {
  __shared__ __align__(16) i8 xs[norm_device::max_cols];
  __shared__ __align__(16) float2 dss[norm_device::max_cols / 16];
  float4 g[norm_device::slots<Threads>];
  norm_device::load_gain<Threads>(n.weight, n.cols, g);
  q8_dots<F, 1, R, U>(rows, in, xs, dss, acc, [&] {
    norm_device::rms_norm_x8_row<Threads>(n.h, n.delta, g, blockIdx.x == 0 ? n.h_out : nullptr, n.cols, n.eps, xs, dss);
  });
}

// The rotation and the cache of a q/k/v group that stores its rows where the attention reads them
// (gemv_rope_kv). A matrix's part is its place in the group plus `first`: 0 q, 1 k, 2 v (a group
// of the three starts at 0; a run of them sharing a weight type at the first part it holds).
struct rope_args {
  const double* angles = nullptr;
  int head_dim = 0, rot_dim = 0;
  bool neox = false;
  gpu::half_bits* k = nullptr;
  gpu::half_bits* v = nullptr;
  std::int64_t row = 0;  // a slot's elements: n_kv_heads * head_dim
  const std::int64_t* slot = nullptr;
  int first = 0;
};

// The matrix row a warp's row L stands for. A warp's rows come in rotary pairs (L even, L + 1): the
// identity for adjacent pairs (rope_style::normal) and v, and for GPT-NeoX's halves pair i of a
// head as rows (i, i + rot_dim / 2) of that head; dimensions past rot_dim as they are.
__device__ __forceinline__ std::int64_t rope_row(const rope_args& a, int part, std::int64_t L) {
  if (part == 2 || !a.neox) return L;
  const int k = int(L % a.head_dim);
  if (k >= a.rot_dim) return L;
  return L - k + (k >> 1) + (k & 1) * (a.rot_dim >> 1);
}

// Lane 0's store of a warp's R rows (R even) of a rope group: each pair's two sums with their bias,
// rotated as launch_rope_kv_write rotates them (rope_device::rotate, pair k / 2 of the head), into y
// (q) or the token's cache slot in f16 (k; v unrotated). Nothing of k or v without a slot.
template <int R>
__device__ __forceinline__ void store_rotated(const rope_args& a, const group_member& m, std::int64_t row0,
                                              const float (&acc)[R][1]) {
  static_assert(R % 2 == 0, "a warp's rows are rotary pairs");
  const int part = m.g + a.first;
  const std::int64_t slot = *a.slot;
  if (part > 0 && slot < 0) return;
  gpu::half_bits* cache = (part == 1 ? a.k : a.v) + (slot < 0 ? 0 : slot) * a.row;
#pragma unroll
  for (int r = 0; r < R; r += 2) {
    const std::int64_t L = row0 + r;
    if (L >= m.out) break;
    const std::int64_t p0 = rope_row(a, part, L), p1 = rope_row(a, part, L + 1);
    float y0 = acc[r][0] + (m.bias ? m.bias[p0] : 0.f), y1 = acc[r + 1][0] + (m.bias ? m.bias[p1] : 0.f);
    const int k = int(L % a.head_dim);
    if (part < 2 && k < a.rot_dim) {
      const double* sc = a.angles + 2 * (k >> 1);
      rope_device::rotate(y0, y1, sc[0], sc[1], y0, y1);
    }
    if (part == 0) {
      m.y[p0] = y0;
      m.y[p1] = y1;
    } else {
      cache[p0] = gpu::float_to_half_bits(y0);
      cache[p1] = gpu::float_to_half_bits(y1);
    }
  }
}

// Rope: a q/k/v group stored by store_rotated (one token; rows by rope_row).
template <class F, int NT, int R, int U, bool Norm = false, bool Rope = false>
__global__ void __launch_bounds__(gemv_threads) gemv_q8_kernel(group_args args, std::size_t row_bytes, const i8* xq,
                                                              const float2* ds, norm_args norm, rope_args rope) {
  const group_member m = member_of(args);
  const std::int64_t out = m.out;
  const int lane = int(threadIdx.x) % gpu::warp_size;
  const std::int64_t warp = std::int64_t(m.block) * (gemv_threads / gpu::warp_size) + threadIdx.x / gpu::warp_size;
  const std::int64_t row0 = warp * R;
  // A warp past the last row returns, unless the block meets at its norm's barriers.
  if (!Norm && row0 >= out) return;

  const u8* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const std::int64_t row = row0 + r < out ? row0 + r : out - 1;  // tail rows: computed, not stored
    rows[r] = m.w + std::size_t(Rope ? rope_row(rope, m.g + rope.first, row) : row) * row_bytes;
  }
  float acc[R][NT];
  if constexpr (Norm) {
    static_assert(NT == 1, "one token is normed");
    q8_dots_normed<gemv_threads, F, R, U>(rows, args.in, norm, acc);
  } else {
    q8_dots<F, NT, R, U>(rows, args.in, xq, ds, acc);
  }
  if constexpr (Rope) {
    static_assert(NT == 1, "one token is rotated");
    if (lane == 0 && row0 < out) store_rotated(rope, m, row0, acc);
    return;
  }
  if (lane == 0 && row0 < out) {
    const float* bias = m.bias;
    float* y = m.y;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const std::int64_t row = row0 + r;
      if (row >= out) break;
      const float b = bias ? bias[row] : 0.f;
#pragma unroll
      for (int t = 0; t < NT; ++t) y[t * out + row] = acc[r][t] + b;
    }
  }
}

// Rows per warp and slices per lane in flight, by batch size. At batch 1: Q8_0 and Q4_0 one row
// per warp with four blocks per lane in flight; the K-quants two rows per warp with one 32-byte
// slice each (each activation load then feeds two rows; measured on the H200 with
// gpu_roofline's tile table, bench/GPU_NOTES.md session 4: +15-45% over one row per warp on
// every Q4_K/Q5_K/Q6_K shape of an 8B model). More rows per warp as the batch grows, so that each
// activation load (NT of them per slice) feeds more weight bytes.
template <class F, int NT>
struct q8_tile {
  static constexpr int R = NT == 1 ? (F::slices == 1 ? 1 : 2) : NT <= 4 ? 2 : 4;
  static constexpr int U = NT == 1 ? (F::slices == 1 ? 4 : 1) : NT <= 4 ? 2 : 1;
};

// The kernel arguments of a group and its grid size: each matrix's rows in blocks of
// rows_per_block, one after the other.
group_args make_group(std::span<const matmul_params> ps, std::int64_t rows_per_block, std::int64_t& blocks) {
  group_args args;
  args.in = ps[0].in;
  blocks = 0;
  for (std::size_t g = 0; g < std::size_t(gemv_max_group); ++g) {
    args.first_block[g] = static_cast<unsigned>(blocks);
    if (g >= ps.size()) continue;
    args.w[g] = ps[g].w;
    args.bias[g] = ps[g].bias;
    args.y[g] = ps[g].y;
    args.out[g] = ps[g].out;
    blocks += (ps[g].out + rows_per_block - 1) / rows_per_block;
  }
  args.first_block[gemv_max_group] = static_cast<unsigned>(blocks);  // unused slots own no blocks
  return args;
}

// Norm: one token, the kernel that norms its own x (from `norm`; xq and ds are not read). Rope: a
// q/k/v group stored where the attention reads it (`rope`).
template <class F, int NT, int R, int U, bool Norm = false, bool Rope = false>
void launch_q8_tile(std::span<const matmul_params> ps, std::size_t row_bytes, const i8* xq, const float2* ds,
                    hipStream_t stream, const norm_args& norm = {}, const rope_args& rope = {}) {
  constexpr std::int64_t rows_per_block = std::int64_t(R) * (gemv_threads / gpu::warp_size);
  std::int64_t blocks = 0;
  const group_args args = make_group(ps, rows_per_block, blocks);
  if (blocks == 0) return;
  gpu::launch_dependent(gemv_q8_kernel<F, NT, R, U, Norm, Rope>, dim3(static_cast<unsigned>(blocks)),
                        dim3(gemv_threads), stream, args, row_bytes, xq, ds, norm, rope);
}

template <class F, int NT, bool Norm = false, bool Rope = false>
void launch_q8_for(std::span<const matmul_params> ps, std::size_t row_bytes, const i8* xq, const float2* ds,
                   hipStream_t stream, const norm_args& norm = {}, const rope_args& rope = {}) {
  // Batch 1 on rows of at most one block a lane (0.5B models' 896): slices past the first are never
  // there, so four rows a warp of one slice each instead (the head of 151,936 x 896 in Q8_0: 48% ->
  // 90% of the copy rate; Q4_0 32% -> 72%; gpu_roofline --small-gemv, bench/GPU_NOTES.md
  // session 37).
  // The normed rows (at most gemv_norm_max_cols) always are such rows.
  static_assert(gemv_norm_max_cols / 32 <= 32, "a normed row has at most one 32-element block a lane");
  if constexpr (NT == 1 && F::slices == 1) {
    if (Norm || ps[0].in / F::block_elems <= gpu::warp_size) {
      launch_q8_tile<F, 1, 4, 1, Norm, Rope>(ps, row_bytes, xq, ds, stream, norm, rope);
      return;
    }
  }
  if constexpr (Rope && !Norm && q8_tile<F, NT>::R % 2 != 0) {
    // A rotating warp holds rotary pairs: two rows of two slices each in flight, the loads a lane
    // of the table's one row of four.
    launch_q8_tile<F, 1, 2, 2, Norm, Rope>(ps, row_bytes, xq, ds, stream, norm, rope);
  } else if constexpr (!Norm || F::slices > 1) {
    launch_q8_tile<F, NT, q8_tile<F, NT>::R, q8_tile<F, NT>::U, Norm, Rope>(ps, row_bytes, xq, ds, stream, norm, rope);
  }
}

template <class F>
void launch_q8_tokens(std::span<const matmul_params> ps, std::size_t row_bytes, const i8* xq, const float2* ds,
                      hipStream_t stream) {
  switch (ps[0].n_tokens) {
    case 1: launch_q8_for<F, 1>(ps, row_bytes, xq, ds, stream); break;
    case 2: launch_q8_for<F, 2>(ps, row_bytes, xq, ds, stream); break;
    case 3: launch_q8_for<F, 3>(ps, row_bytes, xq, ds, stream); break;
    case 4: launch_q8_for<F, 4>(ps, row_bytes, xq, ds, stream); break;
    case 5: launch_q8_for<F, 5>(ps, row_bytes, xq, ds, stream); break;
    case 6: launch_q8_for<F, 6>(ps, row_bytes, xq, ds, stream); break;
    case 7: launch_q8_for<F, 7>(ps, row_bytes, xq, ds, stream); break;
    default: launch_q8_for<F, 8>(ps, row_bytes, xq, ds, stream); break;
  }
}

// ---- gate and up with their gated product (launch_gemv_glu) ---------------------------------------
// One token. A block owns glu_rows consecutive rows of both matrices: each of its
// glu_rows / glu_rows_per_warp warps dots glu_rows_per_warp gate rows and the same up rows (one
// pass over x for both), lane 0 writes the products, and, with yq, warp 0 rounds the block's
// products to 8 bits — one whole quantization group, so no other block is waited for.
constexpr int glu_rows = 32;
constexpr int glu_rows_per_warp = 2;
constexpr int glu_threads = glu_rows / glu_rows_per_warp * gpu::warp_size;

struct glu_args {
  const u8* gate = nullptr;
  const u8* up = nullptr;
  float* y = nullptr;
  std::int64_t out = 0;
  std::int64_t in = 0;
  float limit = 0.f;
  float alpha = 1.f;
  glu_activation act = glu_activation::silu;
  i8* yq = nullptr;
  float2* yds = nullptr;
};

// Blocks a multiprocessor: two where the registers allow it without spilling (a cap of 64), one
// for the types whose decoders need more (the K-quants, IQ4_NL, MXFP4).
template <class F>
constexpr int glu_min_blocks = std::is_same_v<F, dot_q8_0> || std::is_same_v<F, dot_q4_0> ||
                                       std::is_same_v<F, dot_q4_1> || std::is_same_v<F, dot_q5_0> ||
                                       std::is_same_v<F, dot_q5_1>
                                   ? 2
                                   : 1;

// One token (gemv_glu_max_tokens): with more, the four rows' tiles spill at either register cap.
// Norm: x normed by every block from `norm` (xq and ds not read).
template <class F, bool Norm = false>
__global__ void __launch_bounds__(glu_threads, glu_min_blocks<F>) gemv_glu_kernel(glu_args a, std::size_t row_bytes,
                                                                                  const i8* xq, const float2* ds,
                                                                                  norm_args norm) {
  constexpr int R = glu_rows_per_warp;
  __shared__ float4 prod4[glu_rows / 4];
  float* prod = reinterpret_cast<float*>(prod4);
  const int lane = int(threadIdx.x) % gpu::warp_size;
  const int warp = int(threadIdx.x) / gpu::warp_size;
  const std::int64_t base = std::int64_t(blockIdx.x) * glu_rows;
  // No warp returns early: the block meets at a barrier below.
  const u8* rows[2 * R];  // gate rows, then the same up rows
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const std::int64_t row = min(base + warp * R + r, a.out - 1);  // tail rows: computed, not stored
    rows[r] = a.gate + std::size_t(row) * row_bytes;
    rows[R + r] = a.up + std::size_t(row) * row_bytes;
  }
  float acc[2 * R][1];
  if constexpr (Norm) {
    q8_dots_normed<glu_threads, F, 2 * R, 1>(rows, a.in, norm, acc);
  } else {
    q8_dots<F, 1, 2 * R, 1>(rows, a.in, xq, ds, acc);
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const std::int64_t row = base + warp * R + r;
      const float v = glu_product(acc[r][0], acc[R + r][0], a.limit, a.alpha, a.act);
      prod[warp * R + r] = v;
      if (row < a.out) a.y[row] = v;
    }
  }
  if (a.yq == nullptr) return;  // the same for every thread of the grid
  __syncthreads();
  // Eight lanes round the block's group (gpu_quant::quantize_x8; every lane of the warp shuffles).
  if (warp != 0) return;
  const int c = lane % 8;
  quantize_x8(prod4[c], base + 4 * c, lane < 8, a.yq, a.yds);
}

// Workspace layout for n tokens of `in` elements: xq [n][in] int8, then ds [n][in / 16] float2
// at the next 256-byte boundary.
constexpr std::size_t round256(std::size_t n) { return (n + 255) / 256 * 256; }
std::size_t x8_bytes(std::int64_t in, std::int64_t n) { return round256(std::size_t(in * n)) + std::size_t(in / 16 * n) * 8; }

bool uses_q8(model::ggml_type t) {
  return with_dot_format(t, [](auto) {});
}

template <class F, int NT>
void launch_for(std::span<const matmul_params> ps, std::size_t row_bytes, hipStream_t stream) {
  constexpr int R = NT <= 2 ? 2 : 4;
  // Sized for the widest warp the build targets (64 on CDNA): with narrower warps the extra
  // warps find no row and return at once.
  constexpr std::int64_t rows_per_block = std::int64_t(R) * (gemv_threads / gpu::warp_size);
  std::int64_t blocks = 0;
  const group_args args = make_group(ps, rows_per_block, blocks);
  if (blocks == 0) return;
  gpu::launch_dependent(gemv_kernel<F, NT, R>, dim3(static_cast<unsigned>(blocks)), dim3(gemv_threads), stream, args,
                        row_bytes, ps[0].x);
}

template <class F>
void launch_tokens(std::span<const matmul_params> ps, std::size_t row_bytes, hipStream_t stream) {
  switch (ps[0].n_tokens) {
    case 1: launch_for<F, 1>(ps, row_bytes, stream); break;
    case 2: launch_for<F, 2>(ps, row_bytes, stream); break;
    case 3: launch_for<F, 3>(ps, row_bytes, stream); break;
    case 4: launch_for<F, 4>(ps, row_bytes, stream); break;
    case 5: launch_for<F, 5>(ps, row_bytes, stream); break;
    case 6: launch_for<F, 6>(ps, row_bytes, stream); break;
    case 7: launch_for<F, 7>(ps, row_bytes, stream); break;
    default: launch_for<F, 8>(ps, row_bytes, stream); break;
  }
}

}  // namespace

bool gemv_supports(model::ggml_type t) { return gpu_block_elems(t) > 0; }

std::size_t gemv_workspace_bytes(model::ggml_type w_type, std::int64_t in, std::int64_t max_tokens) {
  if (!uses_q8(w_type) || in <= 0 || max_tokens <= 0) return 0;
  return x8_bytes(in, std::min(max_tokens, gemv_max_tokens));
}

std::size_t gemv_x8_bytes(std::int64_t in, std::int64_t n_rows) { return in > 0 && n_rows > 0 ? x8_bytes(in, n_rows) : 0; }

hipError_t launch_gemv_quantize_x(const float* x, std::int64_t in, std::int64_t n_rows, gemv_x8_rows out,
                                  hipStream_t stream) {
  if (in <= 0 || in % 32 != 0 || n_rows < 0 || in * n_rows > (std::int64_t(1) << 40) || !aligned16(x) ||
      out.q == nullptr || out.ds == nullptr || !aligned16(out.q) || !aligned16(out.ds)) {
    return hipErrorInvalidValue;
  }
  if (n_rows > 0) launch_quantize_x(x, in * n_rows, out.q, reinterpret_cast<float2*>(out.ds), stream);
  return hipGetLastError();
}

gemv_x8_rows gemv_x8_view(void* workspace, std::int64_t in, std::int64_t n_tokens) {
  auto* base = static_cast<std::uint8_t*>(workspace);
  return {reinterpret_cast<std::int8_t*>(base), reinterpret_cast<float*>(base + round256(std::size_t(in * n_tokens)))};
}

namespace {

// The checks launch_gemv documents, for one matrix.
bool valid_single(const matmul_params& p) {
  const std::int64_t block = gpu_block_elems(p.w_type);
  if (block == 0 || p.n_tokens < 0 || p.n_tokens > gemv_max_tokens || p.out < 0 || p.in <= 0 || p.in % block != 0) {
    return false;
  }
  if (p.n_tokens == 0 || p.out == 0) return true;
  if (!aligned16(p.w) || !aligned16(p.x) || p.y == nullptr) return false;
  // Grid size: out / rows_per_block blocks must fit the x dimension (2^31 - 1); slice counts an int.
  return p.out <= (std::int64_t(1) << 31) && p.in <= (std::int64_t(1) << 30);
}

// The checks launch_gemv_group documents: one to gemv_max_group matrices, each valid alone, sharing
// the type, `in`, the batch and x.
bool valid_group(std::span<const matmul_params> ps) {
  if (ps.empty() || ps.size() > std::size_t(gemv_max_group)) return false;
  const matmul_params& p = ps[0];
  return std::all_of(ps.begin(), ps.end(), [&](const matmul_params& q) {
    return valid_single(q) && q.w_type == p.w_type && q.in == p.in && q.n_tokens == p.n_tokens && q.x == p.x;
  });
}

// The 8-bit x of p's tokens that the integer GEMVs read, in the workspace: rounded there from p.x
// first (launch_quantize_x) unless `source` says it is already there. False, nothing launched, for
// a workspace that is missing, misaligned or short.
struct x8_input {
  const i8* q = nullptr;
  const float2* ds = nullptr;
};
bool x8_of(const matmul_params& p, void* workspace, std::size_t workspace_bytes, gemv_x8_source source,
           hipStream_t stream, x8_input& in) {
  if (workspace == nullptr || !aligned16(workspace) || workspace_bytes < x8_bytes(p.in, p.n_tokens)) return false;
  const gemv_x8_rows x8 = gemv_x8_view(workspace, p.in, p.n_tokens);
  auto* ds = reinterpret_cast<float2*>(x8.ds);
  if (source == gemv_x8_source::quantize) launch_quantize_x(p.x, p.in * p.n_tokens, x8.q, ds, stream);
  in = {.q = x8.q, .ds = ds};
  return true;
}

}  // namespace

hipError_t launch_gemv_group(std::span<const matmul_params> ps, void* workspace, std::size_t workspace_bytes,
                             hipStream_t stream, gemv_activations activations, gemv_x8_source source) {
  if (!valid_group(ps)) return hipErrorInvalidValue;
  const matmul_params& p = ps[0];
  if (p.n_tokens == 0 || std::all_of(ps.begin(), ps.end(), [](const matmul_params& q) { return q.out == 0; })) {
    return hipSuccess;
  }
  const std::size_t row_bytes = *model::row_bytes(p.w_type, p.in);
  if (!uses_q8(p.w_type) || activations == gemv_activations::f32) {
    with_format(p.w_type, [&](auto f) { launch_tokens<decltype(f)>(ps, row_bytes, stream); });
    return hipGetLastError();
  }
  x8_input x8;
  if (!x8_of(p, workspace, workspace_bytes, source, stream, x8)) return hipErrorInvalidValue;
  with_dot_format(p.w_type, [&](auto f) { launch_q8_tokens<decltype(f)>(ps, row_bytes, x8.q, x8.ds, stream); });
  return hipGetLastError();
}

hipError_t launch_gemv_b1_tile(const matmul_params& p, void* workspace, std::size_t workspace_bytes, hipStream_t stream,
                               int rows_per_warp, int slices_per_lane, gemv_x8_source source) {
  // The tiles gemv.h names: (1|2|4, 1|2|4), not (4, 4). Checked before x is rounded, so that a
  // refused launch queues nothing.
  const auto one_two_four = [](int n) { return n == 1 || n == 2 || n == 4; };
  x8_input x8;
  if (!valid_single(p) || p.n_tokens != 1 || !uses_q8(p.w_type) || p.out == 0 || !one_two_four(rows_per_warp) ||
      !one_two_four(slices_per_lane) || (rows_per_warp == 4 && slices_per_lane == 4) ||
      !x8_of(p, workspace, workspace_bytes, source, stream, x8)) {
    return hipErrorInvalidValue;
  }
  const std::size_t row_bytes = *model::row_bytes(p.w_type, p.in);
  const std::span<const matmul_params> ps(&p, 1);
  with_dot_format(p.w_type, [&](auto f) {
    using F = decltype(f);
    switch (rows_per_warp * 10 + slices_per_lane) {
      case 11: launch_q8_tile<F, 1, 1, 1>(ps, row_bytes, x8.q, x8.ds, stream); break;
      case 12: launch_q8_tile<F, 1, 1, 2>(ps, row_bytes, x8.q, x8.ds, stream); break;
      case 14: launch_q8_tile<F, 1, 1, 4>(ps, row_bytes, x8.q, x8.ds, stream); break;
      case 21: launch_q8_tile<F, 1, 2, 1>(ps, row_bytes, x8.q, x8.ds, stream); break;
      case 22: launch_q8_tile<F, 1, 2, 2>(ps, row_bytes, x8.q, x8.ds, stream); break;
      case 24: launch_q8_tile<F, 1, 2, 4>(ps, row_bytes, x8.q, x8.ds, stream); break;
      case 41: launch_q8_tile<F, 1, 4, 1>(ps, row_bytes, x8.q, x8.ds, stream); break;
      default: launch_q8_tile<F, 1, 4, 2>(ps, row_bytes, x8.q, x8.ds, stream); break;  // 42: the last left
    }
  });
  return hipGetLastError();
}

namespace {

static_assert(gemv_norm_max_cols == norm_device::max_cols, "the shared rows of the normed kernels");

// The checks gemv_norm_input documents, for rows of `in`.
bool valid_norm(const gemv_norm_input& n, std::int64_t in) {
  if (in % 32 != 0 || in > gemv_norm_max_cols || n.h == nullptr || n.weight == nullptr || !aligned16(n.h) ||
      !aligned16(n.weight) || !aligned16(n.delta) || !aligned16(n.h_out)) {
    return false;
  }
  const auto overlaps_out = [&](const float* a) { return a != nullptr && a < n.h_out + in && n.h_out < a + in; };
  return n.h_out == nullptr || (!overlaps_out(n.h) && !overlaps_out(n.delta));
}

norm_args args_of(const gemv_norm_input& n, std::int64_t in) {
  return {.h = n.h, .delta = n.delta, .weight = n.weight, .h_out = n.h_out, .cols = int(in), .eps = n.eps};
}

// The one-token group launch that norms its own x (with Rope: rotates and caches too), for
// callers that checked ps, norm and rope.
template <bool Rope>
hipError_t launch_normed(std::span<const matmul_params> ps, const gemv_norm_input& norm, const rope_args& rope,
                         hipStream_t stream) {
  const matmul_params& p = ps[0];
  const std::size_t row_bytes = *model::row_bytes(p.w_type, p.in);
  with_dot_format(p.w_type, [&](auto f) {
    launch_q8_for<decltype(f), 1, true, Rope>(ps, row_bytes, nullptr, nullptr, stream, args_of(norm, p.in), rope);
  });
  return hipGetLastError();
}

}  // namespace

hipError_t launch_gemv_group_norm(std::span<const matmul_params> ps, const gemv_norm_input& norm, hipStream_t stream) {
  if (!valid_group(ps)) return hipErrorInvalidValue;
  const matmul_params& p = ps[0];
  if (!uses_q8(p.w_type) || p.n_tokens > 1 || !valid_norm(norm, p.in)) return hipErrorInvalidValue;
  if (p.n_tokens == 0 || std::all_of(ps.begin(), ps.end(), [](const matmul_params& q) { return q.out == 0; })) {
    return hipSuccess;
  }
  return launch_normed<false>(ps, norm, {}, stream);
}

namespace {

// The checks gemv_rope_kv documents, for a run of q/k/v parts from `first` (ps, one token, checked
// as a group by the caller): q whole heads, k and v the cache's rows.
bool valid_rope(std::span<const matmul_params> ps, int first, const gemv_rope_kv& rope) {
  const std::int64_t hd = rope.head_dim;
  const paged_kv_device& c = rope.cache;
  if (first < 0 || first + std::int64_t(ps.size()) > gemv_max_group || ps[0].n_tokens != 1 || hd <= 0 || hd % 2 != 0 ||
      hd > (std::int64_t(1) << 30) || rope.rot_dim < 0 || rope.rot_dim % 2 != 0 || rope.rot_dim > hd ||
      (rope.rot_dim > 0 && rope.angles == nullptr) || rope.slot == nullptr || c.dtype != kv_dtype::f16 ||
      c.k == nullptr || c.v == nullptr || c.head_dim != hd) {
    return false;
  }
  for (std::size_t g = 0; g < ps.size(); ++g) {
    const std::int64_t out = ps[g].out;
    if (first + int(g) == 0 ? out % hd != 0 : out != c.n_kv_heads * hd) return false;
  }
  return true;
}

rope_args rope_args_of(const gemv_rope_kv& rope, int first) {
  return {.angles = rope.angles,
          .head_dim = int(rope.head_dim),
          .rot_dim = int(rope.rot_dim),
          .neox = rope.style == rope_style::neox,
          .k = static_cast<gpu::half_bits*>(rope.cache.k),
          .v = static_cast<gpu::half_bits*>(rope.cache.v),
          .row = rope.cache.n_kv_heads * rope.head_dim,
          .slot = rope.slot,
          .first = first};
}

}  // namespace

hipError_t launch_gemv_qkv_rope(std::span<const matmul_params> ps, const gemv_norm_input& norm,
                                const gemv_rope_kv& rope, hipStream_t stream) {
  if (ps.size() != 3 || !valid_group(ps) || !uses_q8(ps[0].w_type) || !valid_norm(norm, ps[0].in) ||
      !valid_rope(ps, 0, rope)) {
    return hipErrorInvalidValue;
  }
  return launch_normed<true>(ps, norm, rope_args_of(rope, 0), stream);
}

hipError_t launch_gemv_rope_run(std::span<const matmul_params> ps, int first, const gemv_rope_kv& rope, void* workspace,
                                std::size_t workspace_bytes, hipStream_t stream, gemv_x8_source source) {
  if (!valid_group(ps) || !uses_q8(ps[0].w_type) || !valid_rope(ps, first, rope)) return hipErrorInvalidValue;
  const matmul_params& p = ps[0];
  x8_input x8;
  if (!x8_of(p, workspace, workspace_bytes, source, stream, x8)) return hipErrorInvalidValue;
  const std::size_t row_bytes = *model::row_bytes(p.w_type, p.in);
  with_dot_format(p.w_type, [&](auto f) {
    launch_q8_for<decltype(f), 1, false, true>(ps, row_bytes, x8.q, x8.ds, stream, {}, rope_args_of(rope, first));
  });
  return hipGetLastError();
}

hipError_t launch_gemv(const matmul_params& p, void* workspace, std::size_t workspace_bytes, hipStream_t stream,
                       gemv_activations activations, gemv_x8_source source) {
  return launch_gemv_group(std::span<const matmul_params>(&p, 1), workspace, workspace_bytes, stream, activations, source);
}

bool gemv_glu_supports(model::ggml_type t) { return uses_q8(t); }

bool gemv_glu_preferred(model::ggml_type w_type, std::int64_t out) {
  std::int64_t per_sm = 0;
  with_dot_format(w_type, [&](auto f) { per_sm = glu_min_blocks<decltype(f)>; });
  return (out + glu_rows - 1) / glu_rows <= per_sm * gpu::multiprocessors();
}

hipError_t launch_gemv_glu(const gemv_glu_params& p, void* workspace, std::size_t workspace_bytes, hipStream_t stream,
                           gemv_x8_source source) {
  const std::int64_t block = gpu_block_elems(p.w_type);
  if (!uses_q8(p.w_type) || p.n_tokens < 0 || p.n_tokens > gemv_glu_max_tokens || p.out < 0 || p.in <= 0 ||
      p.in % block != 0 || p.in > (std::int64_t(1) << 30) || p.out > (std::int64_t(1) << 31) ||
      (p.act != glu_activation::silu && p.limit > 0)) {
    return hipErrorInvalidValue;
  }
  const bool normed = p.norm.h != nullptr;
  if (normed && !valid_norm(p.norm, p.in)) return hipErrorInvalidValue;
  if (p.n_tokens == 0 || p.out == 0) return hipSuccess;
  if (!aligned16(p.gate) || !aligned16(p.up) || p.y == nullptr) return hipErrorInvalidValue;
  if (!normed && ((source == gemv_x8_source::quantize && !aligned16(p.x)) || workspace == nullptr ||
                  !aligned16(workspace) || workspace_bytes < x8_bytes(p.in, p.n_tokens))) {
    return hipErrorInvalidValue;
  }
  const bool quantized_out = p.yq.q != nullptr || p.yq.ds != nullptr;
  if (quantized_out && (p.out % glu_rows != 0 || p.yq.q == nullptr || p.yq.ds == nullptr || !aligned16(p.yq.q) ||
                        !aligned16(p.yq.ds))) {
    return hipErrorInvalidValue;
  }
  const gemv_x8_rows x8 = normed ? gemv_x8_rows{} : gemv_x8_view(workspace, p.in, p.n_tokens);
  auto* ds = reinterpret_cast<float2*>(x8.ds);
  // The 8-bit output may not overlap the 8-bit input it is computed from.
  if (quantized_out && !normed) {
    const auto* in_lo = reinterpret_cast<const std::uint8_t*>(x8.q);
    const auto* in_hi = in_lo + x8_bytes(p.in, p.n_tokens);
    const auto overlaps_input = [&](const void* lo, std::size_t bytes) {
      const auto* b = static_cast<const std::uint8_t*>(lo);
      return b < in_hi && in_lo < b + bytes;
    };
    if (overlaps_input(p.yq.q, std::size_t(p.out * p.n_tokens)) ||
        overlaps_input(p.yq.ds, std::size_t(p.out / 16 * p.n_tokens) * sizeof(float2))) {
      return hipErrorInvalidValue;
    }
  }
  if (!normed && source == gemv_x8_source::quantize) launch_quantize_x(p.x, p.in * p.n_tokens, x8.q, ds, stream);
  const glu_args a{.gate = static_cast<const u8*>(p.gate),
                   .up = static_cast<const u8*>(p.up),
                   .y = p.y,
                   .out = p.out,
                   .in = p.in,
                   .limit = p.limit,
                   .alpha = p.alpha,
                   .act = p.act,
                   .yq = quantized_out ? reinterpret_cast<i8*>(p.yq.q) : nullptr,
                   .yds = quantized_out ? reinterpret_cast<float2*>(p.yq.ds) : nullptr};
  const std::size_t row_bytes = *model::row_bytes(p.w_type, p.in);
  with_dot_format(p.w_type, [&](auto f) {
    using F = decltype(f);
    const dim3 grid(static_cast<unsigned>((p.out + glu_rows - 1) / glu_rows));
    if (normed) {
      gpu::launch_dependent(gemv_glu_kernel<F, true>, grid, dim3(glu_threads), stream, a, row_bytes, x8.q, ds,
                            args_of(p.norm, p.in));
    } else {
      gpu::launch_dependent(gemv_glu_kernel<F>, grid, dim3(glu_threads), stream, a, row_bytes, x8.q, ds, norm_args{});
    }
  });
  return hipGetLastError();
}

}  // namespace anvil::kernels
