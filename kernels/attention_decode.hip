// Paged decode attention (flash-decoding); see kernels/attention_decode.h for the design.
//
// Block: 128 threads, one (sequence, kv head, chunk of up to MaxG query heads, split).
//   0. Before waiting on the kernel ahead (programmatic dependent launch): the cache row of each
//      of the split's positions, from the block table, to shared memory.
//   1. Scores: threads form groups of HeadDim/8, one group per key; each thread owns 8 f16 of
//      its keys (16 bytes), multiplies them with the MaxG query heads held in shared memory, and
//      the group reduces by shuffles. Scores for the split's positions go to shared memory.
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
#include "kernels/attention_decode.h"

#include <algorithm>

#include "kernels/gpu_quant_dot.h"
#include "kernels/kv_cache_read.h"

namespace anvil::kernels {
namespace {

constexpr int threads = 128;

template <int HeadDim, int MaxG, int Split>
struct decode_smem {
  static constexpr int tpk = HeadDim / 8;         // threads per key (scores) and per V row (P·V)
  static constexpr int rows = threads / tpk;      // keys (V rows) per pass of the block
  static constexpr int tile = 64;                 // positions whose K and V loads are in flight together
  static constexpr int per_thread = tile / rows;  // keys (V rows) each thread loads per tile
  static_assert(Split % tile == 0 && tile % rows == 0, "a split is whole tiles, a tile whole passes");
  float q[MaxG][HeadDim];
  float m[MaxG], l[MaxG];
  std::int64_t slot[Split];  // cache row of each position of the split
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

  const int seq = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x;
  const int n_kv = int(p.cache.n_kv_heads), group = int(p.n_heads / n_kv);
  const int chunks = (group + MaxG - 1) / MaxG;
  const int kvh = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  const int head0 = kvh * group + chunk * MaxG, ng = min(MaxG, group - chunk * MaxG);
  // The context lengths and block tables are inputs of the step, complete before the kernel ahead
  // of this one started: read before the wait, while that kernel finishes.
  const int ctx = min(p.context_lens[seq], int(p.max_context));
  const int n_splits = (ctx + Split - 1) / Split;
  if (sp >= n_splits) return;  // uniform over the block
  const int start = sp * Split, n = min(Split, ctx - start);
  const std::int32_t* table = p.block_tables + std::int64_t(seq) * p.block_table_stride;
  const std::int64_t bs = p.cache.block_size, kv_row = std::int64_t(n_kv) * HeadDim;
  for (int j = tid; j < n; j += threads) {
    const std::int64_t pos = start + j;
    sm.slot[j] = std::int64_t(table[pos / bs]) * bs + pos % bs;
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
      dst[i] = j < n ? vec::load(base, sm.slot[j] * kv_row + dim0) : vec::zero();
      sc[i] = j < n ? kv_row_scale<T>(scales, sm.slot[j] * n_kv + kvh) : 0.f;
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
        for (int m = tpk / 2; m > 0; m /= 2) s += gpu::shfl_xor(s, m);
        if (kl == 0 && j < n) sm.u.p[g][j] = s * ks[i];
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

  const std::int64_t max_splits = (p.max_context + Split - 1) / Split;
  for (int e = tid; e < ng * HeadDim; e += threads) {
    const int g = e / HeadDim, d = e % HeadDim;
    float o = 0.f;
    for (int rr = 0; rr < rows; ++rr) o += sm.u.red[rr][g][d];
    o /= sm.l[g];
    const std::int64_t qh = std::int64_t(seq) * p.n_heads + head0 + g;
    if (n_splits == 1) {
      p.out[qh * HeadDim + d] = o;
    } else {
      float* partial = static_cast<float*>(p.workspace);
      partial[(qh * max_splits + sp) * HeadDim + d] = o;
    }
  }
  // The 8-bit form, four outputs per thread (eight lanes per 32-element block), from the same sums.
  if (n_splits == 1 && p.yq != nullptr) {
    for (int base = 0; base < MaxG * HeadDim / 4; base += threads) {  // uniform: every lane shuffles
      const int e4 = base + tid;
      const bool valid = e4 < ng * HeadDim / 4;
      const int g = valid ? 4 * e4 / HeadDim : 0, d0 = valid ? 4 * e4 % HeadDim : 0;
      float o[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        o[j] = 0.f;
        for (int rr = 0; rr < rows; ++rr) o[j] += sm.u.red[rr][g][d0 + j];
        o[j] /= sm.l[g];
      }
      const std::int64_t i = (std::int64_t(seq) * p.n_heads + head0 + g) * HeadDim + d0;
      gpu_quant::quantize_x8(make_float4(o[0], o[1], o[2], o[3]), i, valid, p.yq,
                             reinterpret_cast<float2*>(p.yq_scales));
    }
  }
  if (n_splits > 1 && tid < ng) {
    const std::int64_t qh = std::int64_t(seq) * p.n_heads + head0 + tid;
    float* stats = static_cast<float*>(p.workspace) + p.n_seqs * p.n_heads * max_splits * HeadDim;
    stats[(qh * max_splits + sp) * 2] = sm.m[tid];
    stats[(qh * max_splits + sp) * 2 + 1] = sm.l[tid];
  }
}

// Merges the splits of one (sequence, query head): out = sum_s w_s o_s / sum_s w_s with
// w_s = l_s exp(m_s - max_s m_s), in split order. A merge is a few loads per split on the
// critical path of every layer, so none of them waits on another: the threads stage the splits'
// (max, sum) pairs in shared memory together (HeadDim splits per round, one round but for very
// long contexts, whose running sums are rescaled to the new max), and each thread then issues
// the loads of its dim's partial outputs eight at a time.
template <int HeadDim>
__global__ void __launch_bounds__(HeadDim) decode_merge_kernel(attention_decode_params p) {
  __shared__ float merged[HeadDim];
  __shared__ float sm_m[HeadDim], sm_l[HeadDim];
  const int head = blockIdx.x, seq = blockIdx.y, d = threadIdx.x;
  const int ctx = min(p.context_lens[seq], int(p.max_context));  // a step input: read before the wait
  const int split = int(p.split);
  const int n_splits = (ctx + split - 1) / split;
  if (n_splits <= 1) return;  // the decode kernel wrote the output itself
  gpu::dependency_wait();     // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const std::int64_t max_splits = (p.max_context + split - 1) / split;
  const std::int64_t qh = std::int64_t(seq) * p.n_heads + head;
  const float* partial = static_cast<const float*>(p.workspace) + qh * max_splits * HeadDim + d;
  const float* stats = static_cast<const float*>(p.workspace) + p.n_seqs * p.n_heads * max_splits * HeadDim +
                       qh * max_splits * 2;
  float mx = -INFINITY, num = 0.f, den = 0.f;
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
    const float rescale = expf(mx - round_mx);  // 0 in the first round (mx = -inf)
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
  // The 8-bit form: the first warp, four outputs per lane.
  merged[d] = num / den;
  __syncthreads();
  if (d < gpu::warp_size) {
    const bool valid = d < HeadDim / 4;
    const float4 v = valid ? make_float4(merged[4 * d], merged[4 * d + 1], merged[4 * d + 2], merged[4 * d + 3])
                           : make_float4(0.f, 0.f, 0.f, 0.f);
    gpu_quant::quantize_x8(v, qh * HeadDim + 4 * d, valid, p.yq, reinterpret_cast<float2*>(p.yq_scales));
  }
}

template <kv_dtype T, int HeadDim, int MaxG>
void launch(const attention_decode_params& p, int group, hipStream_t stream) {
  const int chunks = (group + MaxG - 1) / MaxG;
  const std::int64_t splits = attention_decode_splits(p.max_context, p.split);
  const dim3 grid(static_cast<unsigned>(p.cache.n_kv_heads * chunks), static_cast<unsigned>(p.n_seqs),
                  static_cast<unsigned>(splits));
  if (p.split == attention_decode_short_split) {
    constexpr int short_split = int(attention_decode_short_split);
    gpu::launch_dependent(decode_kernel<T, HeadDim, MaxG, short_split>, grid, dim3(threads), stream, p);
  } else {
    gpu::launch_dependent(decode_kernel<T, HeadDim, MaxG, int(attention_decode_split)>, grid, dim3(threads), stream, p);
  }
  if (splits > 1) {
    const dim3 merge_grid(static_cast<unsigned>(p.n_heads), static_cast<unsigned>(p.n_seqs));
    gpu::launch_dependent(decode_merge_kernel<HeadDim>, merge_grid, dim3(HeadDim), stream, p);
  }
}

template <kv_dtype T, int HeadDim>
void launch_for_group(const attention_decode_params& p, int group, hipStream_t stream) {
  if (group == 1) {
    launch<T, HeadDim, 1>(p, group, stream);
  } else if (group <= 4) {
    launch<T, HeadDim, 4>(p, group, stream);
  } else {
    launch<T, HeadDim, 8>(p, group, stream);
  }
}

template <kv_dtype T>
void launch_for_dims(const attention_decode_params& p, int group, hipStream_t stream) {
  if (p.cache.head_dim == 64) {
    launch_for_group<T, 64>(p, group, stream);
  } else {
    launch_for_group<T, 128>(p, group, stream);
  }
}

using gpu::aligned16;

}  // namespace

hipError_t launch_attention_decode(const attention_decode_params& p, hipStream_t stream) {
  if (p.n_seqs == 0) return hipSuccess;
  const std::int64_t hd = p.cache.head_dim, n_kv = p.cache.n_kv_heads;
  if (p.n_seqs < 0 || p.n_seqs > 65535 || (hd != 64 && hd != 128) || n_kv <= 0 || p.n_heads <= 0 ||
      p.n_heads % n_kv != 0 || p.n_heads > 65535 || p.max_context < 1 || p.max_context > 0x7fffffff ||
      (p.split != attention_decode_split && p.split != attention_decode_short_split) ||
      attention_decode_splits(p.max_context, p.split) > 65535 || p.cache.block_size <= 0 ||
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

}  // namespace anvil::kernels
