// Paged decode attention (flash-decoding); see kernels/attention_decode.h for the design. Two
// kernels: on the CUDA cores (below; every device) and on tensor cores (further down; NVIDIA
// sm_80+). Both write their results through decode_store and share the merge kernel.
//
// CUDA cores. Block: 128 threads, one (sequence, kv head, chunk of up to MaxG query heads, split).
//   0. Before waiting on the kernel ahead (programmatic dependent launch): the cache row of each
//      of the split's positions, from the block table, to shared memory.
//   1. Scores: threads form groups of HeadDim/8, one group per key; each thread owns 8 f16 of
//      its keys (16 bytes), multiplies them with the MaxG query heads held in shared memory, and
//      the group reduces by shuffles (heads of 512 on 32-wide warps: each warp's half of the group
//      by shuffles, the two halves added in shared memory). Scores for the split's positions go
//      to shared memory.
//   2. Softmax statistics per head: one warp per head (max, exp, sum), f32.
//   3. P·V: each thread owns the same 8 dims of V for the same positions, accumulating for every
//      head in registers; the rows are summed in shared memory in a fixed order (deterministic).
// An 8-bit cache (kernels/kv_quant.h) is read the same way, eight codes (8 bytes) per thread and
// key, with each key's row scale applied to its score and to its weight in P·V. It takes about the
// f16 cache's time, not half: the kernel is bound by its instructions per position more than by
// the bytes it reads (45-62% of the copy bandwidth in f16). Measured and left out (GPU_NOTES.md):
// 16 codes per thread, tiles of 128 positions for 8 bits, and reducing the scores of all a
// thread's keys and heads at once (fewer shuffles, more registers) — each as slow or slower.
// The context is latency-bound, not bandwidth-bound (a split of 64 positions is 32 KB of K and V
// per kv head): a thread issues all its K and V loads of a 64-position tile at once, so a split
// of 64 waits on the cache once rather than once per pass of the block.
//
// Window and sinks (both kernels, decode_span and decode_store): a block's split is cut to the
// window's positions (splits before it have no block: the grid's z counts from the window's first
// split), and the sink logit joins the denominator where the output is normalised — in
// decode_store when the window holds one split, else in the merge, which starts its softmax at the
// sink. Without them the arithmetic is today's, operation for operation.
#include "kernels/attention_decode.h"

#include <algorithm>
#include <type_traits>

#include "kernels/gpu_quant_dot.h"
#include "kernels/kv_cache_read.h"
#include "kernels/tensor_core.h"

namespace anvil::kernels {
namespace {

constexpr int threads = 128;

// What a query at position ctx - 1 reads: positions [lo, ctx) (lo > 0 only under a window shorter
// than the context), which lie in splits [first, end) of `split` positions. Block z of a sequence
// takes split first + z; the merge combines [first, end).
struct decode_span {
  int lo, first, end;
};
__device__ __forceinline__ decode_span decode_span_of(const attention_decode_params& p, int ctx, int split) {
  const int lo = p.window > 0 && p.window < ctx ? ctx - int(p.window) : 0;
  return {lo, lo / split, (ctx + split - 1) / split};
}

// Splits per sequence in the grid: max_context's, or as many as a window of W positions can touch.
std::int64_t decode_grid_splits(const attention_decode_params& p) {
  const std::int64_t all = attention_decode_splits(p.max_context, p.split);
  const std::int64_t w = std::min(p.window, p.max_context);  // a window past every context is none
  return w > 0 ? std::min(all, (w - 1 + p.split - 1) / p.split + 1) : all;
}

// What a block of the decode kernels leaves for heads head0 .. head0 + ng of one sequence and
// split `sp`: alone (the only split of the window), the output (and its 8-bit form when asked);
// else the split's partial output and its heads' softmax (max, sum) for the merge. sum(g, d) is
// head g's unnormalised output at dim d; m and l the heads' max and sum, in shared memory. The
// output alone takes the sink into its denominator: l + exp(s - m), m finite (the split has a
// key); a sink that overwhelms the scores gives inf and the output 0, its limit, never NaN.
template <int HeadDim, int MaxG, class Sum>
__device__ __forceinline__ void decode_store(const attention_decode_params& p, int seq, int sp, bool alone, int head0,
                                             int ng, const float* m, const float* l, Sum sum) {
  const int tid = threadIdx.x;
  const std::int64_t max_splits = (p.max_context + p.split - 1) / p.split;
  const bool sink = alone && p.sinks != nullptr;
  const auto o = [&](int g, int d) { return sum(g, d) / (sink ? l[g] + expf(p.sinks[head0 + g] - m[g]) : l[g]); };
  for (int e = tid; e < ng * HeadDim; e += threads) {
    const int g = e / HeadDim, d = e % HeadDim;
    const float v = o(g, d);
    const std::int64_t qh = std::int64_t(seq) * p.n_heads + head0 + g;
    if (alone) {
      p.out[qh * HeadDim + d] = v;
    } else {
      float* partial = static_cast<float*>(p.workspace);
      partial[(qh * max_splits + sp) * HeadDim + d] = v;
    }
  }
  // The 8-bit form, four outputs per thread (eight lanes per 32-element block), from the same sums.
  if (alone && p.yq != nullptr) {
    for (int base = 0; base < MaxG * HeadDim / 4; base += threads) {  // uniform: every lane shuffles
      const int e4 = base + tid;
      const bool valid = e4 < ng * HeadDim / 4;
      const int g = valid ? 4 * e4 / HeadDim : 0, d0 = valid ? 4 * e4 % HeadDim : 0;
      const float4 v = make_float4(o(g, d0), o(g, d0 + 1), o(g, d0 + 2), o(g, d0 + 3));
      const std::int64_t i = (std::int64_t(seq) * p.n_heads + head0 + g) * HeadDim + d0;
      gpu_quant::quantize_x8(v, i, valid, p.yq, reinterpret_cast<float2*>(p.yq_scales));
    }
  }
  if (!alone && tid < ng) {
    const std::int64_t qh = std::int64_t(seq) * p.n_heads + head0 + tid;
    float* stats = static_cast<float*>(p.workspace) + p.n_seqs * p.n_heads * max_splits * HeadDim;
    stats[(qh * max_splits + sp) * 2] = m[tid];
    stats[(qh * max_splits + sp) * 2 + 1] = l[tid];
  }
}

template <int HeadDim, int MaxG, int Split>
struct decode_smem {
  static constexpr int tpk = HeadDim / 8;         // threads per key (scores) and per V row (P·V)
  static constexpr int rows = threads / tpk;      // keys (V rows) per pass of the block
  // Positions whose K and V loads are in flight together: 64, 32 for head_dim 256, 16 for 512, so
  // that a thread holds at most 8 keys' loads (and its registers do not spill).
  static constexpr int tile = HeadDim > 256 ? 16 : HeadDim > 128 ? 32 : 64;
  static constexpr int per_thread = tile / rows;  // keys (V rows) each thread loads per tile
  static_assert(Split % tile == 0 && tile % rows == 0, "a split is whole tiles, a tile whole passes");
  float q[MaxG][HeadDim];
  float m[MaxG], l[MaxG];
  // Cache row of each position of the split (block id x block size + offset: far below 2^31 rows
  // on any device; 32 bits keep a split of 1024 at head_dim 256 within 48 KB).
  std::int32_t slot[Split];
  union {
    float p[MaxG][Split];
    float red[rows][MaxG][HeadDim];
  } u;
};

template <kv_dtype T, int HeadDim, int MaxG, int Split>
__global__ void __launch_bounds__(threads) decode_kernel(attention_decode_params p) {
  using smem_t = decode_smem<HeadDim, MaxG, Split>;
  using vec = kv_vec8<T>;
  constexpr int tpk = smem_t::tpk, rows = smem_t::rows, tile = smem_t::tile, per_thread = smem_t::per_thread;
  __shared__ smem_t sm;

  const int seq = blockIdx.y, tid = threadIdx.x;
  const int n_kv = int(p.cache.n_kv_heads), group = int(p.n_heads / n_kv);
  const int chunks = (group + MaxG - 1) / MaxG;
  const int kvh = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  const int head0 = kvh * group + chunk * MaxG, ng = min(MaxG, group - chunk * MaxG);
  // The context lengths and block tables are inputs of the step, complete before the kernel ahead
  // of this one started: read before the wait, while that kernel finishes.
  const int ctx = min(p.context_lens[seq], int(p.max_context));
  const decode_span span = decode_span_of(p, ctx, Split);
  const int sp = span.first + int(blockIdx.z);
  if (sp >= span.end) return;  // uniform over the block
  const int start = max(sp * Split, span.lo), n = min(sp * Split + Split, ctx) - start;
  const std::int32_t* table = p.block_tables + std::int64_t(seq) * p.block_table_stride;
  const std::int64_t bs = p.cache.block_size, kv_row = std::int64_t(n_kv) * HeadDim;
  for (int j = tid; j < n; j += threads) {
    const std::int64_t pos = start + j;
    sm.slot[j] = std::int32_t(std::int64_t(table[pos / bs]) * bs + pos % bs);
  }
  __syncthreads();  // the slots
  gpu::dependency_wait();  // launched with gpu::launch_dependent: q and the newest K/V come from the kernel before
  gpu::allow_dependents();

  // Thread (kg, kl) owns dims [8 kl, 8 kl + 8) of positions kg, kg + rows, ... of each tile, for
  // the scores (K) and for P·V (V): all its loads of a tile are issued before any is used — the
  // first tile's K and V together, and before q — so a split of 64 waits on memory about once.
  const int kl = tid % tpk, kg = tid / tpk;
  const std::int64_t dim0 = std::int64_t(kvh) * HeadDim + kl * 8;
  const int n_tiles = (n + tile - 1) / tile;  // uniform: every lane reaches the shuffles
  // 8-bit caches: each key's row scale comes with its elements (f16: 1).
  using raw_t = typename vec::raw;
  const auto load_tile = [&](const void* base, const float* scales, int t0, raw_t (&dst)[per_thread],
                             float (&sc)[per_thread]) {
#pragma unroll
    for (int i = 0; i < per_thread; ++i) {
      const int j = t0 + kg + i * rows;
      dst[i] = j < n ? vec::load(base, std::int64_t(sm.slot[j]) * kv_row + dim0) : vec::zero();
      sc[i] = j < n ? kv_row_scale<T>(scales, std::int64_t(sm.slot[j]) * n_kv + kvh) : 0.f;
    }
  };
  raw_t kr[per_thread], vr[per_thread];
  float ks[per_thread], vs[per_thread];
  load_tile(p.cache.k, p.cache.k_scales, 0, kr, ks);
  load_tile(p.cache.v, p.cache.v_scales, 0, vr, vs);
  for (int e = tid; e < MaxG * HeadDim; e += threads) {
    const int g = e / HeadDim, d = e % HeadDim;
    sm.q[g][d] = g < ng ? p.q[(std::int64_t(seq) * p.n_heads + head0 + g) * HeadDim + d] * p.scale : 0.f;
  }
  // Heads of 512 on 32-wide warps: a key's 64 threads span two warps, whose halves of each score
  // are added into shared memory (two addends on a zero: the same sum whichever comes first).
  constexpr bool key_spans_warps = tpk > gpu::warp_size;
  if constexpr (key_spans_warps) {
    for (int e = tid; e < MaxG * Split; e += threads) sm.u.p[e / Split][e % Split] = 0.f;
  }
  __syncthreads();

  // 1. Scores, to shared memory. The thread's 8 dims of each head's q stay in registers.
  float qr[MaxG][8];
#pragma unroll
  for (int g = 0; g < MaxG; ++g) {
#pragma unroll
    for (int e = 0; e < 8; ++e) qr[g][e] = sm.q[g][kl * 8 + e];
  }
  for (int t = 0; t < n_tiles; ++t) {
    if (t > 0) load_tile(p.cache.k, p.cache.k_scales, t * tile, kr, ks);
#pragma unroll
    for (int i = 0; i < per_thread; ++i) {
      const int j = t * tile + kg + i * rows;
      float kf[8];
      vec::to_float(kr[i], kf);
#pragma unroll
      for (int g = 0; g < MaxG; ++g) {
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) s += qr[g][e] * kf[e];
#pragma unroll
        for (int m = (key_spans_warps ? gpu::warp_size : tpk) / 2; m > 0; m /= 2) s += gpu::shfl_xor(s, m);
        if constexpr (key_spans_warps) {
          if (kl % gpu::warp_size == 0 && j < n) atomicAdd(&sm.u.p[g][j], s * ks[i]);
        } else {
          if (kl == 0 && j < n) sm.u.p[g][j] = s * ks[i];
        }
      }
    }
  }
  __syncthreads();

  // 2. Softmax statistics, one warp per head.
  {
    constexpr int warps = threads / gpu::warp_size;
    const int lane = tid % gpu::warp_size;
    for (int g = tid / gpu::warp_size; g < ng; g += warps) {
      float mx = -INFINITY;
      for (int j = lane; j < n; j += gpu::warp_size) mx = fmaxf(mx, sm.u.p[g][j]);
      mx = gpu::warp_reduce_max(mx);
      float sum = 0.f;
      for (int j = lane; j < n; j += gpu::warp_size) {
        const float e = expf(sm.u.p[g][j] - mx);
        sm.u.p[g][j] = e;
        sum += e;
      }
      sum = gpu::warp_reduce_sum(sum);
      if (lane == 0) {
        sm.m[g] = mx;
        sm.l[g] = sum;
      }
    }
  }
  __syncthreads();

  // 3. P·V over the same positions: thread (kg, kl) sums its rows in registers.
  float acc[MaxG][8];
#pragma unroll
  for (int g = 0; g < MaxG; ++g) {
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
  }
  for (int t = 0; t < n_tiles; ++t) {
    if (t > 0) load_tile(p.cache.v, p.cache.v_scales, t * tile, vr, vs);
#pragma unroll
    for (int i = 0; i < per_thread; ++i) {
      const int j = t * tile + kg + i * rows;
      float vf[8];
      vec::to_float(vr[i], vf);
#pragma unroll
      for (int g = 0; g < MaxG; ++g) {
        const float w = g < ng && j < n ? sm.u.p[g][j] * vs[i] : 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] += w * vf[e];
      }
    }
  }
  __syncthreads();  // every read of p is done before red overwrites it
#pragma unroll
  for (int g = 0; g < MaxG; ++g) {
#pragma unroll
    for (int i = 0; i < 8; ++i) sm.u.red[kg][g][kl * 8 + i] = acc[g][i];
  }
  __syncthreads();

  decode_store<HeadDim, MaxG>(p, seq, sp, span.end - span.first == 1, head0, ng, sm.m, sm.l, [&](int g, int d) {
    float o = 0.f;
    for (int rr = 0; rr < rows; ++rr) o += sm.u.red[rr][g][d];
    return o;
  });
}

#if defined(ANVIL_GPU_CUDA)
// ---- Tensor cores (NVIDIA sm_80+): the same attention on mma.sync m16n8k16 ----
// Block: 4 warps, one (sequence, kv head, up to 8 of its query heads, split), as above. Warp w
// takes the split's steps w, w + 4, ... of 16 keys (f16) or 32 (8 bits; tiles_per_step), each
// step one or two tiles of 16 keys. Each warp streams its steps' K and V rows
// (and 8-bit row scales) into its own ring of stages in shared memory with cp.async, several
// steps ahead of the one it computes, so the bytes in flight do not cost registers — the
// register-tile version of this kernel was bound by how many it could keep in flight (8 bits
// then took the f16 time). Per step, with the query heads as rows 0-7 of the products and rows
// 8-15 carrying what the f16 rounding of rows 0-7 left out (so Q and the softmax weights count
// to about f32 precision, for no extra instruction), f32 accumulate:
//   S = Q K^T: Q (pre-scaled) in A registers for the whole split. The reduction index of each
//     16-dim slice is mapped to dims so that lane (g, c) reads K's B operand as 8 contiguous
//     elements at dims 8 (4 i + c) of key g; Q's columns follow the same map.
//   an online softmax per head (a head's four lanes reduce by shuffles);
//   O += P V: P's accumulators are already the A operand. V's B operand (16 keys x 8 dims) comes
//     from 8 contiguous elements at dims 64 u + 8 g of keys 2c, 2c+1, 2c+8, 2c+9, paired by one
//     byte permute per register; column j of dims tile t is dim 64 (t / 8) + 8 j + t % 8.
// Row strides in the ring are padded so that those fragment reads hit distinct banks. The four
// warps' (max, sum, output) are combined in shared memory in a fixed order. 8-bit caches: the
// codes enter the products exactly as halves (fp8 by the conversion instruction on sm_89+); K's
// row scale multiplies the score, V's the softmax weight, divided by the largest V scale seen so
// far (a running unit, rescaled like the running max) so the weight stays in [0, 1].
namespace decode_tc {

constexpr int warps = threads / 32, keys = 16, max_heads = 8;
// Tiles of 16 keys per step of a warp: two for 8-bit caches, whose per-key bytes are half, so the
// step's fixed work (waiting on the stage, the softmax update, rescaling the accumulators) is
// spread over 32 keys (int8 / fp8 8% faster; f16 10% slower, bench/GPU_NOTES.md). Head size 256
// takes one (a step of 16 keys already holds 128-dim 32 keys' work; two spill registers).
template <kv_dtype T, int HeadDim>
inline constexpr int tiles_per_step = T == kv_dtype::f16 || HeadDim > 128 ? 1 : 2;

// The eight elements of a cache fragment as four half2 words (elements 2w and 2w + 1 in word w),
// the 8-bit codes exactly: int8 as the half 1024 + (c + 128) (a byte permute) minus 1152, fp8 by
// the conversion instruction where there is one (sm_89+), else as the half worth 2^-8 of the code
// by bit moves (row_factor carries the 2^8).
template <kv_dtype T>
__device__ __forceinline__ void halves(typename kv_vec8<T>::raw r, unsigned (&h)[4]) {
  if constexpr (T == kv_dtype::f16) {
    h[0] = r.x, h[1] = r.y, h[2] = r.z, h[3] = r.w;
  } else if constexpr (T == kv_dtype::fp8) {
#if __CUDA_ARCH__ >= 890
    fp8x8_to_half2x4_cvt(r, h);  // the conversion instruction: the codes' own values
#else
    fp8x4_to_half2x2(r.x, h[0], h[1]);
    fp8x4_to_half2x2(r.y, h[2], h[3]);
#endif
  } else {
    const unsigned w[2] = {r.x ^ 0x80808080u, r.y ^ 0x80808080u};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned b = __byte_perm(w[i / 2], 0x64646464u, i % 2 ? 0x4342u : 0x4140u);
      asm("sub.f16x2 %0, %1, %2;" : "=r"(h[i]) : "r"(b), "r"(0x64806480u));  // 0x6480: the half 1152
    }
  }
}

// What multiplies the halves() of a row's codes: the row's scale (fp8 decoded by bit moves is worth
// 2^-8 of the code, the conversion instruction gives the code's value); f16 rows have none.
template <kv_dtype T>
__device__ __forceinline__ float row_factor(const float* scales, int i) {
  if constexpr (T == kv_dtype::f16) {
    return 1.f;
  } else if constexpr (T == kv_dtype::fp8) {
#if __CUDA_ARCH__ >= 890
    return scales[i];
#else
    return scales[i] * fp8_half_decode_factor;
#endif
  } else {
    return scales[i];
  }
}

// One warp's ring: per stage, the K and V rows of a step of Tiles x 16 keys and (8 bits) their
// row scales.
template <kv_dtype T, int HeadDim, int Tiles>
struct ring {
  static constexpr int step_keys = Tiles * keys;
  static constexpr int elem = T == kv_dtype::f16 ? 2 : 1;
  static constexpr int row_bytes = HeadDim * elem;
  static constexpr int frag_bytes = 8 * elem;  // a lane's fragment read
  // K fragments are read by lanes (g, c) at row g, byte frag_bytes (4 i + c): rows g and g + 1 of
  // one read phase must fall 4 * frag_bytes apart modulo 128 bytes; V fragments at rows 2c and
  // byte 8 g elem: rows 2c and 2c + 2 must fall 32 bytes apart (f16: 16 bytes per lane, 8 lanes
  // per phase; 8 bits: 8 bytes, 16 lanes).
  static constexpr int k_stride = row_bytes + 4 * frag_bytes;
  static constexpr int v_stride = row_bytes + 16;
  static constexpr int scale_bytes = T == kv_dtype::f16 ? 0 : 2 * step_keys * 4;
  static constexpr int stage_bytes = step_keys * (k_stride + v_stride) + scale_bytes;
  // About 20 KB a warp: two blocks fit an SM's shared memory; 8-bit stages are half the size,
  // so twice as many keys are in flight.
  static constexpr int stages = std::clamp(20480 / stage_bytes, 2, 6);
  static constexpr int block_bytes = warps * stages * stage_bytes;
  static_assert(block_bytes >= warps * max_heads * (HeadDim + 4) * 4, "the ring also holds the warps' outputs");
};

// (a, b) as two halves, hi, and what their rounding left out, lo: hi + lo = (a, b) to about 2^-22.
__device__ __forceinline__ void split_half2(float a, float b, unsigned& hi, unsigned& lo) {
  hi = gpu::floats_to_half2_bits(a, b);
  lo = gpu::floats_to_half2_bits(a - gpu::half_bits_to_float(static_cast<unsigned short>(hi & 0xffffu)),
                                 b - gpu::half_bits_to_float(static_cast<unsigned short>(hi >> 16)));
}

}  // namespace decode_tc

template <kv_dtype T, int HeadDim, int Split, int Tiles>
__global__ void __launch_bounds__(threads) decode_tc_kernel(attention_decode_params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using vec = kv_vec8<T>;
  using raw_t = typename vec::raw;
  using rg = decode_tc::ring<T, HeadDim, Tiles>;
  constexpr int MaxG = decode_tc::max_heads, warps = decode_tc::warps, keys = decode_tc::keys, stages = rg::stages;
  constexpr int step_keys = rg::step_keys;
  constexpr int kslices = HeadDim / 32;  // K fragments per key and lane: dims 8 (4 i + c)
  constexpr int vslices = HeadDim / 64;  // V fragments per key and lane: dims 64 u + 8 g
  constexpr int dtiles = HeadDim / 8;    // 8-dim column tiles of O
  constexpr int o_stride = HeadDim + 4;  // floats; spreads the lanes' scattered stores over the banks
  // Q's fragments in registers for the whole split, or for head_dim 256 (64 registers beside O's
  // 128) in shared memory, each lane's four words of a slice read as one 16-byte load per step.
  constexpr bool q_in_smem = HeadDim > 128;
  static_assert(Split % step_keys == 0, "a split is whole steps");
  __shared__ std::int64_t row_off[Split];  // byte offset of each key's row of the kv head in the cache arrays
  __shared__ std::int32_t scale_row[Split];  // 8 bits: index of each key's row scale
  __shared__ float warp_m[warps][MaxG], warp_l[warps][MaxG], head_m[MaxG], head_l[MaxG];
  __shared__ uint4 q_frags[q_in_smem ? HeadDim / 16 : 1][32];  // q_in_smem: slice i of lane l at [i][l]
  extern __shared__ __align__(16) unsigned char dyn_smem[];  // the rings; after the loop, the warps' outputs

  const int seq = blockIdx.y, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, c = lane % 4;
  const int n_kv = int(p.cache.n_kv_heads), group = int(p.n_heads / n_kv);
  const int chunks = (group + MaxG - 1) / MaxG;
  const int kvh = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  const int head0 = kvh * group + chunk * MaxG, ng = min(MaxG, group - chunk * MaxG);
  const int ctx = min(p.context_lens[seq], int(p.max_context));  // step inputs: read before the wait
  const decode_span span = decode_span_of(p, ctx, Split);
  const int sp = span.first + int(blockIdx.z);
  if (sp >= span.end) return;  // uniform over the block
  const int start = max(sp * Split, span.lo), n = min(sp * Split + Split, ctx) - start;
  const std::int32_t* table = p.block_tables + std::int64_t(seq) * p.block_table_stride;
  const std::int64_t bs = p.cache.block_size, kv_row = std::int64_t(n_kv) * HeadDim;
  for (int j = tid; j < n; j += threads) {
    const std::int64_t pos = start + j;
    const std::int64_t slot = std::int64_t(table[pos / bs]) * bs + pos % bs;
    row_off[j] = (slot * kv_row + std::int64_t(kvh) * HeadDim) * rg::elem;
    if constexpr (T != kv_dtype::f16) scale_row[j] = std::int32_t(slot * n_kv + kvh);
  }
  __syncthreads();  // the offsets
  gpu::dependency_wait();  // launched with gpu::launch_dependent: q and the newest K/V come from the kernel before
  gpu::allow_dependents();

  // Step st (keys st * step_keys ..) into stage b of the warp's ring, one commit group per step (an
  // empty one past the split's end, so that the count of groups stays uniform); keys past the end
  // as zeros.
  unsigned char* const my_ring = dyn_smem + warp * stages * rg::stage_bytes;
  const auto issue = [&](int st, int b) {
    if (st * step_keys < n) {
      unsigned char* const kdst = my_ring + b * rg::stage_bytes;
      unsigned char* const vdst = kdst + step_keys * rg::k_stride;
      constexpr int pieces = rg::row_bytes / 16;
#pragma unroll
      for (int q = lane; q < step_keys * pieces; q += 32) {
        const int kk = q / pieces, piece = q % pieces, j = st * step_keys + kk;
        const bool valid = j < n;
        const std::int64_t off = (valid ? row_off[j] : 0) + piece * 16;
        tc::cp_async16(kdst + kk * rg::k_stride + piece * 16, static_cast<const unsigned char*>(p.cache.k) + off, valid);
        tc::cp_async16(vdst + kk * rg::v_stride + piece * 16, static_cast<const unsigned char*>(p.cache.v) + off, valid);
      }
      if constexpr (T != kv_dtype::f16) {
        float* const sdst = reinterpret_cast<float*>(vdst + step_keys * rg::v_stride);
#pragma unroll
        for (int q = lane; q < 2 * step_keys; q += 32) {
          const int kk = q % step_keys, j = st * step_keys + kk;
          const bool valid = j < n;
          const float* src = q < step_keys ? p.cache.k_scales : p.cache.v_scales;
          tc::cp_async4(sdst + q, src + (valid ? scale_row[j] : 0), valid);
        }
      }
    }
    tc::cp_async_commit();
  };
#pragma unroll
  for (int b = 0; b < stages; ++b) issue(warp + warps * b, b);

  // Q of head g as the A operand of each 16-dim slice (slice 2i + h: dims 8 (4 i + c) + 4 h +
  // {0, 1} and + {2, 3}, the dims words 2h and 2h + 1 of K's fragment hold): its f16 rounding in
  // row g and what that rounding left out in row g + 8, so the two rows' scores add up to q . k
  // to f32 precision at no extra instruction.
  unsigned qa[q_in_smem ? 1 : HeadDim / 16][4];
  const auto q_slice = [&](int i, int h, unsigned (&dst)[4]) {  // slice 2i + h, from q
    const float* qrow = g < ng ? p.q + (std::int64_t(seq) * p.n_heads + head0 + g) * HeadDim : nullptr;
    const float4 v = qrow != nullptr ? *reinterpret_cast<const float4*>(qrow + 8 * (4 * i + c) + 4 * h)
                                     : make_float4(0.f, 0.f, 0.f, 0.f);
    decode_tc::split_half2(v.x * p.scale, v.y * p.scale, dst[0], dst[1]);
    decode_tc::split_half2(v.z * p.scale, v.w * p.scale, dst[2], dst[3]);
  };
  if constexpr (q_in_smem) {
    for (int e = warp; e < HeadDim / 16; e += warps) {  // each warp a share of the slices
      unsigned w[4];
      q_slice(e / 2, e % 2, w);
      q_frags[e][lane] = make_uint4(w[0], w[1], w[2], w[3]);
    }
    __syncthreads();
  } else {
#pragma unroll
    for (int i = 0; i < kslices; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) q_slice(i, h, qa[2 * i + h]);
    }
  }

  float acc[dtiles][4];  // rows g (the weights' f16 rounding) and g + 8 (its remainder)
#pragma unroll
  for (int dt = 0; dt < dtiles; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.f;
  float m = -INFINITY, l = 0.f;  // head g's running max, and this lane's part of its sum
  float unit = 0.f;              // 8 bits: the largest V scale so far, the unit of acc
  for (int i = 0, st = warp; st * step_keys < n; ++i, st += warps) {
    const int b = i % stages;
    tc::cp_async_wait<stages - 1>();  // this step's group has landed (at most the later ones fly)
    __syncwarp();
    const unsigned char* const kbuf = my_ring + b * rg::stage_bytes;
    const unsigned char* const vbuf = kbuf + step_keys * rg::k_stride;
    const float* const sbuf = reinterpret_cast<const float*>(vbuf + step_keys * rg::v_stride);
    // Column r of the lane's scores in tile t: key 16 t + 8 (r / 2) + 2c + r % 2 of the step.
    const auto col_key = [&](int t, int r) { return keys * t + 8 * (r / 2) + 2 * c + r % 2; };

    // S = Q K^T: s[t][r] is head g's score of column r's key in tile t.
    float s[Tiles][4];
    float mx = -INFINITY, vmax = 0.f, vsc[Tiles][4];
#pragma unroll
    for (int t = 0; t < Tiles; ++t) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float sc[4] = {0.f, 0.f, 0.f, 0.f};
        const unsigned char* const krow = kbuf + (keys * t + 8 * h + g) * rg::k_stride;
#pragma unroll
        for (int k = 0; k < kslices; ++k) {
          unsigned w[4];
          decode_tc::halves<T>(*reinterpret_cast<const raw_t*>(krow + rg::frag_bytes * (4 * k + c)), w);
          if constexpr (q_in_smem) {
            const uint4 a0 = q_frags[2 * k][lane], a1 = q_frags[2 * k + 1][lane];
            const unsigned qa0[4] = {a0.x, a0.y, a0.z, a0.w}, qa1[4] = {a1.x, a1.y, a1.z, a1.w};
            tc::mma_16816(sc, qa0, w[0], w[1]);
            tc::mma_16816(sc, qa1, w[2], w[3]);
          } else {
            tc::mma_16816(sc, qa[2 * k], w[0], w[1]);
            tc::mma_16816(sc, qa[2 * k + 1], w[2], w[3]);
          }
        }
        s[t][2 * h] = sc[0] + sc[2];
        s[t][2 * h + 1] = sc[1] + sc[3];
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int kk = col_key(t, r);
        s[t][r] = st * step_keys + kk < n ? s[t][r] * decode_tc::row_factor<T>(sbuf, kk) : -INFINITY;
        mx = fmaxf(mx, s[t][r]);
        vsc[t][r] = decode_tc::row_factor<T>(sbuf, step_keys + kk);  // 0 past the end (zero-filled); f16: 1
        vmax = fmaxf(vmax, vsc[t][r]);
      }
    }
    mx = fmaxf(mx, gpu::shfl_xor(mx, 1));
    mx = fmaxf(mx, gpu::shfl_xor(mx, 2));
    const float m_new = fmaxf(m, mx);  // finite: the step has a key
    float alpha = expf(m - m_new);     // 0 on the first step
    m = m_new;
    float sum = 0.f;
#pragma unroll
    for (int t = 0; t < Tiles; ++t) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        s[t][r] = expf(s[t][r] - m_new);
        sum += s[t][r];
      }
    }
    l = l * alpha + sum;
    if constexpr (T != kv_dtype::f16) {
      vmax = fmaxf(vmax, gpu::shfl_xor(vmax, 1));
      vmax = fmaxf(vmax, gpu::shfl_xor(vmax, 2));
      const float unit_new = fmaxf(unit, vmax);
      const float inv = unit_new > 0.f ? 1.f / unit_new : 0.f;
      alpha *= unit * inv;  // acc moves to the new unit (acc is 0 while unit is)
      unit = unit_new;
#pragma unroll
      for (int t = 0; t < Tiles; ++t) {
#pragma unroll
        for (int r = 0; r < 4; ++r) s[t][r] *= vsc[t][r] * inv;
      }
    }
#pragma unroll
    for (int dt = 0; dt < dtiles; ++dt) acc[dt][0] *= alpha, acc[dt][1] *= alpha, acc[dt][2] *= alpha, acc[dt][3] *= alpha;

    // O += P V, the weights as their f16 rounding (row g) and its remainder (row g + 8).
#pragma unroll
    for (int t = 0; t < Tiles; ++t) {
      unsigned pa[4];
      decode_tc::split_half2(s[t][0], s[t][1], pa[0], pa[1]);
      decode_tc::split_half2(s[t][2], s[t][3], pa[2], pa[3]);
#pragma unroll
      for (int u = 0; u < vslices; ++u) {
        unsigned w[4][4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          decode_tc::halves<T>(*reinterpret_cast<const raw_t*>(vbuf + col_key(t, r) * rg::v_stride + (64 * u + 8 * g) * rg::elem), w[r]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const unsigned sel = hh ? 0x7632u : 0x5410u;  // the low or the high halves of two keys' words
            tc::mma_16816(acc[8 * u + 2 * e + hh], pa, __byte_perm(w[0][e], w[1][e], sel), __byte_perm(w[2][e], w[3][e], sel));
          }
        }
      }
    }
    __syncwarp();  // every lane has read stage b
    issue(st + warps * stages, b);
  }
  tc::cp_async_wait<0>();  // nothing in flight into the ring, which now takes the outputs

  // Combine the warps: each scales its output to the block's max (and from its V unit).
  l += gpu::shfl_xor(l, 1);
  l += gpu::shfl_xor(l, 2);
  if (c == 0) {
    warp_m[warp][g] = m;
    warp_l[warp][g] = l;
  }
  __syncthreads();  // the statistics; every warp is past its ring
  float(*warp_o)[MaxG][o_stride] = reinterpret_cast<float(*)[MaxG][o_stride]>(dyn_smem);
  if (tid < MaxG) {
    float mx = -INFINITY, sum = 0.f;
    for (int w = 0; w < warps; ++w) mx = fmaxf(mx, warp_m[w][tid]);
    for (int w = 0; w < warps; ++w) sum += warp_l[w][tid] * expf(warp_m[w][tid] - mx);  // a warp without keys: 0
    head_m[tid] = mx;
    head_l[tid] = sum;
  }
  if (g < ng) {
    float mx = -INFINITY;
    for (int w = 0; w < warps; ++w) mx = fmaxf(mx, warp_m[w][g]);
    const float f = expf(m - mx) * (T == kv_dtype::f16 ? 1.f : unit);
#pragma unroll
    for (int dt = 0; dt < dtiles; ++dt) {
#pragma unroll
      for (int j = 0; j < 2; ++j) warp_o[warp][g][64 * (dt / 8) + 8 * (2 * c + j) + dt % 8] = (acc[dt][j] + acc[dt][j + 2]) * f;
    }
  }
  __syncthreads();
  decode_store<HeadDim, MaxG>(p, seq, sp, span.end - span.first == 1, head0, ng, head_m, head_l, [&](int h, int d) {
    float o = 0.f;
    for (int w = 0; w < warps; ++w) o += warp_o[w][h][d];
    return o;
  });
#else
  __trap();  // launched only on devices of compute capability 8.0 and up
#endif
}

#endif

// Merges the splits of one (sequence, query head): out = sum_s w_s o_s / sum_s w_s with
// w_s = l_s exp(m_s - max_s m_s), in split order, over the splits the window reaches; a sink s_h
// is one more term of the denominator, exp(s_h - max), the max taken over it too. A merge is a
// few loads per split on the critical path of every layer, so none of them waits on another: the
// threads stage the splits' (max, sum) pairs in shared memory together (HeadDim splits per round,
// one round but for very long contexts, whose running sums are rescaled to the new max), and each
// thread then issues the loads of its dim's partial outputs eight at a time.
template <int HeadDim>
__global__ void __launch_bounds__(HeadDim) decode_merge_kernel(attention_decode_params p) {
  __shared__ float merged[HeadDim];
  __shared__ float sm_m[HeadDim], sm_l[HeadDim];
  const int head = blockIdx.x, seq = blockIdx.y, d = threadIdx.x;
  const int ctx = min(p.context_lens[seq], int(p.max_context));  // a step input: read before the wait
  const int split = int(p.split);
  const decode_span span = decode_span_of(p, ctx, split);
  const int n_splits = span.end - span.first;
  if (n_splits <= 1) return;  // the decode kernel wrote the output itself
  gpu::dependency_wait();     // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const std::int64_t max_splits = (p.max_context + split - 1) / split;
  const std::int64_t qh = std::int64_t(seq) * p.n_heads + head;
  const float* partial = static_cast<const float*>(p.workspace) + (qh * max_splits + span.first) * HeadDim + d;
  const float* stats = static_cast<const float*>(p.workspace) + p.n_seqs * p.n_heads * max_splits * HeadDim +
                       (qh * max_splits + span.first) * 2;
  float mx = -INFINITY, num = 0.f, den = 0.f;
  if (p.sinks != nullptr) mx = p.sinks[head], den = 1.f;  // the sink: exp(s_h - mx) with mx = s_h so far
  for (int s0 = 0; s0 < n_splits; s0 += HeadDim) {
    const int n = min(HeadDim, n_splits - s0);
    __syncthreads();  // the previous round's statistics are read
    if (d < n) {
      sm_m[d] = stats[2 * (s0 + d)];
      sm_l[d] = stats[2 * (s0 + d) + 1];
    }
    __syncthreads();
    float round_mx = mx;
    for (int s = 0; s < n; ++s) round_mx = fmaxf(round_mx, sm_m[s]);
    const float rescale = expf(mx - round_mx);  // 0 in the first round (mx = -inf) but for a sink
    num *= rescale;
    den *= rescale;
    mx = round_mx;
    for (int s = 0; s < n; s += 8) {
      float o[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) o[k] = s + k < n ? partial[std::int64_t(s0 + s + k) * HeadDim] : 0.f;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (s + k < n) {
          const float w = sm_l[s + k] * expf(sm_m[s + k] - mx);
          num += w * o[k];
          den += w;
        }
      }
    }
  }
  p.out[qh * HeadDim + d] = num / den;
  if (p.yq == nullptr) return;  // uniform
  // The 8-bit form: the first warps, four outputs per lane (whole warps: every lane shuffles).
  merged[d] = num / den;
  __syncthreads();
  if (d < (HeadDim / 4 + gpu::warp_size - 1) / gpu::warp_size * gpu::warp_size) {
    const bool valid = d < HeadDim / 4;
    const float4 v = valid ? make_float4(merged[4 * d], merged[4 * d + 1], merged[4 * d + 2], merged[4 * d + 3])
                           : make_float4(0.f, 0.f, 0.f, 0.f);
    gpu_quant::quantize_x8(v, qh * HeadDim + 4 * d, valid, p.yq, reinterpret_cast<float2*>(p.yq_scales));
  }
}

// The decode kernel kernel<Split> over (kv heads x chunks of max_heads query heads, sequences,
// splits the window may touch), then the merge where a context has several.
template <int HeadDim, int MaxHeads, class Kernel>
void launch_with_merge(const attention_decode_params& p, int group, Kernel kernel, hipStream_t stream,
                       std::size_t dynamic_smem = 0) {
  const int chunks = (group + MaxHeads - 1) / MaxHeads;
  const std::int64_t splits = decode_grid_splits(p);
  const dim3 grid(static_cast<unsigned>(p.cache.n_kv_heads * chunks), static_cast<unsigned>(p.n_seqs),
                  static_cast<unsigned>(splits));
  gpu::launch_dependent_smem(kernel, grid, dim3(threads), dynamic_smem, stream, p);
  if (splits > 1) {
    const dim3 merge_grid(static_cast<unsigned>(p.n_heads), static_cast<unsigned>(p.n_seqs));
    gpu::launch_dependent(decode_merge_kernel<HeadDim>, merge_grid, dim3(HeadDim), stream, p);
  }
}

// Calls f(std::integral_constant<int, split>) for the split length the launcher validated: each
// kernel is a template over it (the longest only for the tensor-core kernel, whose shared memory
// holds a row offset per position where the CUDA-core kernel also holds the scores).
template <bool TensorCores = false, class F>
void with_split(std::int64_t split, F&& f) {
  constexpr int short_split = int(attention_decode_short_split), mid_split = int(attention_decode_split);
  constexpr int long_split = int(attention_decode_long_split);
  if constexpr (TensorCores) {
    if (split == attention_decode_longest_split) return f(std::integral_constant<int, int(attention_decode_longest_split)>{});
  }
  if (split == short_split) {
    f(std::integral_constant<int, short_split>{});
  } else if (split == mid_split) {
    f(std::integral_constant<int, mid_split>{});
  } else {
    f(std::integral_constant<int, long_split>{});
  }
}

#if defined(ANVIL_GPU_CUDA)
template <kv_dtype T, int HeadDim, int Split>
void launch_tc(const attention_decode_params& p, int group, hipStream_t stream) {
  constexpr int tiles = decode_tc::tiles_per_step<T, HeadDim>;
  constexpr int smem = decode_tc::ring<T, HeadDim, tiles>::block_bytes;
  gpu::allow_dynamic_smem<decode_tc_kernel<T, HeadDim, Split, tiles>>(smem);
  launch_with_merge<HeadDim, decode_tc::max_heads>(p, group, decode_tc_kernel<T, HeadDim, Split, tiles>, stream, smem);
}
#endif

template <kv_dtype T, int HeadDim, int MaxG>
void launch(const attention_decode_params& p, int group, hipStream_t stream) {
  with_split(p.split, [&](auto split) {
    launch_with_merge<HeadDim, MaxG>(p, group, decode_kernel<T, HeadDim, MaxG, decltype(split)::value>, stream);
  });
}

template <kv_dtype T, int HeadDim>
void launch_for_group(const attention_decode_params& p, int group, hipStream_t stream) {
#if defined(ANVIL_GPU_CUDA)
  if constexpr (HeadDim <= attention_tc_max_head_dim) {
    if (!p.cuda_cores_only && tc::device_has_mma()) {
      with_split<true>(p.split, [&](auto split) { launch_tc<T, HeadDim, decltype(split)::value>(p, group, stream); });
      return;
    }
  }
#endif
  if (group == 1) {
    launch<T, HeadDim, 1>(p, group, stream);
  } else if (group <= 4 || HeadDim > 256) {  // heads of 512: chunks of 4 (8 would pass 48 KB of shared memory)
    launch<T, HeadDim, 4>(p, group, stream);
  } else {
    launch<T, HeadDim, 8>(p, group, stream);
  }
}

template <kv_dtype T>
void launch_for_dims(const attention_decode_params& p, int group, hipStream_t stream) {
  if (p.cache.head_dim == 64) {
    launch_for_group<T, 64>(p, group, stream);
  } else if (p.cache.head_dim == 128) {
    launch_for_group<T, 128>(p, group, stream);
  } else if (p.cache.head_dim == 256) {
    launch_for_group<T, 256>(p, group, stream);
  } else {
    launch_for_group<T, 512>(p, group, stream);
  }
}

using gpu::aligned16;

}  // namespace

hipError_t launch_attention_decode(const attention_decode_params& p, hipStream_t stream) {
  if (p.n_seqs == 0) return hipSuccess;
  const std::int64_t hd = p.cache.head_dim, n_kv = p.cache.n_kv_heads;
  if (p.n_seqs < 0 || p.n_seqs > 65535 || (hd != 64 && hd != 128 && hd != 256 && hd != 512) || n_kv <= 0 ||
      p.n_heads <= 0 || p.n_heads % n_kv != 0 || p.n_heads > 65535 || p.max_context < 1 ||
      p.max_context > 0x7fffffff || p.window < 0 ||
      (p.split != attention_decode_split && p.split != attention_decode_short_split &&
       p.split != attention_decode_long_split &&
       (p.split != attention_decode_longest_split || p.cuda_cores_only || !attention_decode_tensor_cores(hd))) ||
      attention_decode_splits(p.max_context, p.split) > 65535 || p.cache.block_size <= 0 ||
      p.cache.n_blocks * p.cache.block_size > 0x7fffffff ||  // cache rows as 32-bit slots
      p.block_table_stride * p.cache.block_size < p.max_context) {
    return hipErrorInvalidValue;
  }
  if (!aligned16(p.cache.k) || !aligned16(p.cache.v)) return hipErrorInvalidValue;
  if (kv_is_8bit(p.cache.dtype) && (p.cache.k_scales == nullptr || p.cache.v_scales == nullptr)) return hipErrorInvalidValue;
  if (p.yq != nullptr && (p.yq_scales == nullptr || reinterpret_cast<std::uintptr_t>(p.yq) % 4 != 0 ||
                          reinterpret_cast<std::uintptr_t>(p.yq_scales) % 8 != 0)) {
    return hipErrorInvalidValue;
  }
  const std::size_t need = attention_decode_workspace_bytes(p.n_seqs, p.n_heads, hd, p.max_context, p.split);
  if (need > 0 && (p.workspace == nullptr || p.workspace_bytes < need || !aligned16(p.workspace))) {
    return hipErrorInvalidValue;
  }
  const int group = int(p.n_heads / n_kv);
  if (std::int64_t(n_kv) * ((group + 7) / 8) > 0x7fffffff) return hipErrorInvalidValue;
  switch (p.cache.dtype) {
    case kv_dtype::f16: launch_for_dims<kv_dtype::f16>(p, group, stream); break;
    case kv_dtype::int8: launch_for_dims<kv_dtype::int8>(p, group, stream); break;
    case kv_dtype::fp8: launch_for_dims<kv_dtype::fp8>(p, group, stream); break;
  }
  return hipGetLastError();
}

bool attention_decode_tensor_cores(std::int64_t head_dim) {
#if defined(ANVIL_GPU_CUDA)
  return head_dim <= attention_tc_max_head_dim && tc::device_has_mma();
#else
  return false;
#endif
}

}  // namespace anvil::kernels
