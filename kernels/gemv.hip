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
// No shared memory, no block-level barrier: a warp past the last row simply returns.
#include "kernels/gemv.h"

#include <algorithm>
#include <span>

#include "kernels/gpu_quant.h"
#include "kernels/gpu_quant_dot.h"

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
};
__device__ __forceinline__ group_member member_of(const group_args& a) {
  const unsigned b = blockIdx.x;
  const int g = b >= a.first_block[2] ? 2 : b >= a.first_block[1] ? 1 : 0;
  return {static_cast<const u8*>(pick(g, a.w[0], a.w[1], a.w[2])), pick(g, a.bias[0], a.bias[1], a.bias[2]),
          pick(g, a.y[0], a.y[1], a.y[2]), pick(g, a.out[0], a.out[1], a.out[2]),
          b - pick(g, a.first_block[0], a.first_block[1], a.first_block[2])};
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
template <class F, int NT, int R, int U>
__global__ void __launch_bounds__(gemv_threads) gemv_q8_kernel(group_args args, std::size_t row_bytes, const i8* xq,
                                                              const float2* ds) {
  const group_member m = member_of(args);
  const u8* const w = m.w;
  const std::int64_t out = m.out;
  const int lane = int(threadIdx.x) % gpu::warp_size;
  const std::int64_t warp = std::int64_t(m.block) * (gemv_threads / gpu::warp_size) + threadIdx.x / gpu::warp_size;
  const std::int64_t row0 = warp * R;
  if (row0 >= out) return;

  const u8* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const std::int64_t row = row0 + r < out ? row0 + r : out - 1;  // tail rows: computed, not stored
    rows[r] = w + std::size_t(row) * row_bytes;
  }
  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;
  }

  const std::int64_t in = args.in;
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
  // Before the wait only the weights may be read (gpu::dependency_wait): up to 4 tokens, the first
  // iteration's weight loads are in flight while the kernel before this one finishes (with more,
  // holding them across the wait costs registers the tile does not have: spills).
  constexpr bool early = NT <= 4;
  if (early && slices > 0) load(lane);
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
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
  if (lane == 0) {
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

template <class F, int NT, int R, int U>
void launch_q8_tile(std::span<const matmul_params> ps, std::size_t row_bytes, const i8* xq, const float2* ds,
                    hipStream_t stream) {
  constexpr std::int64_t rows_per_block = std::int64_t(R) * (gemv_threads / gpu::warp_size);
  std::int64_t blocks = 0;
  const group_args args = make_group(ps, rows_per_block, blocks);
  if (blocks == 0) return;
  gpu::launch_dependent(gemv_q8_kernel<F, NT, R, U>, dim3(static_cast<unsigned>(blocks)), dim3(gemv_threads), stream,
                        args, row_bytes, xq, ds);
}

template <class F, int NT>
void launch_q8_for(std::span<const matmul_params> ps, std::size_t row_bytes, const i8* xq, const float2* ds,
                   hipStream_t stream) {
  launch_q8_tile<F, NT, q8_tile<F, NT>::R, q8_tile<F, NT>::U>(ps, row_bytes, xq, ds, stream);
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

}  // namespace

hipError_t launch_gemv_group(std::span<const matmul_params> ps, void* workspace, std::size_t workspace_bytes,
                             hipStream_t stream, gemv_activations activations, gemv_x8_source source) {
  if (ps.empty() || ps.size() > std::size_t(gemv_max_group)) return hipErrorInvalidValue;
  const matmul_params& p = ps[0];
  for (const matmul_params& q : ps) {
    if (!valid_single(q) || q.w_type != p.w_type || q.in != p.in || q.n_tokens != p.n_tokens || q.x != p.x) {
      return hipErrorInvalidValue;
    }
  }
  if (p.n_tokens == 0 || std::all_of(ps.begin(), ps.end(), [](const matmul_params& q) { return q.out == 0; })) {
    return hipSuccess;
  }
  const std::size_t row_bytes = *model::row_bytes(p.w_type, p.in);
  if (!uses_q8(p.w_type) || activations == gemv_activations::f32) {
    with_format(p.w_type, [&](auto f) { launch_tokens<decltype(f)>(ps, row_bytes, stream); });
    return hipGetLastError();
  }
  if (workspace == nullptr || !aligned16(workspace) || workspace_bytes < x8_bytes(p.in, p.n_tokens)) {
    return hipErrorInvalidValue;
  }
  const gemv_x8_rows x8 = gemv_x8_view(workspace, p.in, p.n_tokens);
  auto* ds = reinterpret_cast<float2*>(x8.ds);
  if (source == gemv_x8_source::quantize) {
    launch_quantize_x(p.x, p.in * p.n_tokens, x8.q, ds, stream);
  }
  with_dot_format(p.w_type, [&](auto f) { launch_q8_tokens<decltype(f)>(ps, row_bytes, x8.q, ds, stream); });
  return hipGetLastError();
}

hipError_t launch_gemv_b1_tile(const matmul_params& p, void* workspace, std::size_t workspace_bytes, hipStream_t stream,
                               int rows_per_warp, int slices_per_lane, gemv_x8_source source) {
  if (!valid_single(p) || p.n_tokens != 1 || !uses_q8(p.w_type) || p.out == 0 || workspace == nullptr ||
      !aligned16(workspace) || workspace_bytes < x8_bytes(p.in, 1)) {
    return hipErrorInvalidValue;
  }
  const std::size_t row_bytes = *model::row_bytes(p.w_type, p.in);
  const gemv_x8_rows x8 = gemv_x8_view(workspace, p.in, 1);
  auto* ds = reinterpret_cast<float2*>(x8.ds);
  if (source == gemv_x8_source::quantize) {
    launch_quantize_x(p.x, p.in, x8.q, ds, stream);
  }
  const std::span<const matmul_params> ps(&p, 1);
  bool known = true;
  with_dot_format(p.w_type, [&](auto f) {
    using F = decltype(f);
    switch (rows_per_warp * 10 + slices_per_lane) {
      case 11: launch_q8_tile<F, 1, 1, 1>(ps, row_bytes, x8.q, ds, stream); break;
      case 12: launch_q8_tile<F, 1, 1, 2>(ps, row_bytes, x8.q, ds, stream); break;
      case 14: launch_q8_tile<F, 1, 1, 4>(ps, row_bytes, x8.q, ds, stream); break;
      case 21: launch_q8_tile<F, 1, 2, 1>(ps, row_bytes, x8.q, ds, stream); break;
      case 22: launch_q8_tile<F, 1, 2, 2>(ps, row_bytes, x8.q, ds, stream); break;
      case 24: launch_q8_tile<F, 1, 2, 4>(ps, row_bytes, x8.q, ds, stream); break;
      case 41: launch_q8_tile<F, 1, 4, 1>(ps, row_bytes, x8.q, ds, stream); break;
      case 42: launch_q8_tile<F, 1, 4, 2>(ps, row_bytes, x8.q, ds, stream); break;
      default: known = false; break;
    }
  });
  return known ? hipGetLastError() : hipErrorInvalidValue;
}

hipError_t launch_gemv(const matmul_params& p, void* workspace, std::size_t workspace_bytes, hipStream_t stream,
                       gemv_activations activations, gemv_x8_source source) {
  return launch_gemv_group(std::span<const matmul_params>(&p, 1), workspace, workspace_bytes, stream, activations, source);
}

}  // namespace anvil::kernels
