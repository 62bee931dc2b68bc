// Paged decode attention (flash-decoding); see kernels/attention_decode.h for the design.
//
// Block: 128 threads, one (sequence, kv head, chunk of up to MaxG query heads, split).
//   1. Scores: threads form groups of HeadDim/8, one group per key; each thread loads 8 f16 of
//      the key (16 bytes), multiplies with the MaxG query heads held in shared memory, and the
//      group reduces by shuffles. Scores for the split's positions go to shared memory.
//   2. Softmax statistics per head: one warp per head (max, exp, sum), f32.
//   3. P·V: threads form rows of HeadDim/8; each thread owns 8 dims of V and strides over the
//      positions, accumulating for every head in registers; the rows are summed in shared memory
//      in a fixed order (deterministic).
#include "kernels/attention_decode.h"

#include <algorithm>

#include "kernels/gpu_quant_dot.h"

namespace anvil::kernels {
namespace {

constexpr int threads = 128;

__device__ __forceinline__ void load8(const gpu::half_bits* src, float (&f)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
  const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = gpu::half_to_float(gpu::half_bits(w[i] & 0xffffu));
    f[2 * i + 1] = gpu::half_to_float(gpu::half_bits(w[i] >> 16));
  }
}

template <int HeadDim, int MaxG, int Split>
struct decode_smem {
  static constexpr int tpk = HeadDim / 8;        // threads per key (scores) and per V row (P·V)
  static constexpr int rows = threads / tpk;     // V rows in flight
  float q[MaxG][HeadDim];
  float m[MaxG], l[MaxG];
  union {
    float p[MaxG][Split];
    float red[rows][MaxG][HeadDim];
  } u;
};

template <int HeadDim, int MaxG, int Split>
__global__ void __launch_bounds__(threads) decode_kernel(attention_decode_params p) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  using smem_t = decode_smem<HeadDim, MaxG, Split>;
  constexpr int tpk = smem_t::tpk, rows = smem_t::rows;
  __shared__ smem_t sm;

  const int seq = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x;
  const int n_kv = int(p.cache.n_kv_heads), group = int(p.n_heads / n_kv);
  const int chunks = (group + MaxG - 1) / MaxG;
  const int kvh = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  const int head0 = kvh * group + chunk * MaxG, ng = min(MaxG, group - chunk * MaxG);
  const int ctx = min(p.context_lens[seq], int(p.max_context));
  const int n_splits = (ctx + Split - 1) / Split;
  if (sp >= n_splits) return;  // uniform over the block
  const int start = sp * Split, n = min(Split, ctx - start);
  const std::int32_t* table = p.block_tables + std::int64_t(seq) * p.block_table_stride;
  const std::int64_t bs = p.cache.block_size, kv_row = std::int64_t(n_kv) * HeadDim;

  for (int e = tid; e < MaxG * HeadDim; e += threads) {
    const int g = e / HeadDim, d = e % HeadDim;
    sm.q[g][d] = g < ng ? p.q[(std::int64_t(seq) * p.n_heads + head0 + g) * HeadDim + d] * p.scale : 0.f;
  }
  __syncthreads();

  // 1. Scores. The loop bound is uniform so every lane reaches the shuffles.
  {
    const int kl = tid % tpk, kg = tid / tpk;
    for (int j0 = 0; j0 < n; j0 += rows) {
      const int j = j0 + kg;
      float kf[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (j < n) {
        const std::int64_t pos = start + j;
        const std::int64_t slot = std::int64_t(table[pos / bs]) * bs + pos % bs;
        load8(p.cache.k + slot * kv_row + std::int64_t(kvh) * HeadDim + kl * 8, kf);
      }
#pragma unroll
      for (int g = 0; g < MaxG; ++g) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) s += sm.q[g][kl * 8 + i] * kf[i];
#pragma unroll
        for (int m = tpk / 2; m > 0; m /= 2) s += gpu::shfl_xor(s, m);
        if (kl == 0 && j < n) sm.u.p[g][j] = s;
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

  // 3. P·V: thread (r, c) owns dims [8c, 8c + 8) of rows r, r + rows, ...
  const int c = tid % tpk, r = tid / tpk;
  float acc[MaxG][8];
#pragma unroll
  for (int g = 0; g < MaxG; ++g) {
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
  }
  for (int j = r; j < n; j += rows) {
    const std::int64_t pos = start + j;
    const std::int64_t slot = std::int64_t(table[pos / bs]) * bs + pos % bs;
    float vf[8];
    load8(p.cache.v + slot * kv_row + std::int64_t(kvh) * HeadDim + c * 8, vf);
#pragma unroll
    for (int g = 0; g < MaxG; ++g) {
      const float w = g < ng ? sm.u.p[g][j] : 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] += w * vf[i];
    }
  }
  __syncthreads();  // every read of p is done before red overwrites it
#pragma unroll
  for (int g = 0; g < MaxG; ++g) {
#pragma unroll
    for (int i = 0; i < 8; ++i) sm.u.red[r][g][c * 8 + i] = acc[g][i];
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
// w_s = l_s exp(m_s - max_s m_s), in a fixed order.
template <int HeadDim>
__global__ void __launch_bounds__(HeadDim) decode_merge_kernel(attention_decode_params p) {
  __shared__ float merged[HeadDim];
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const int head = blockIdx.x, seq = blockIdx.y, d = threadIdx.x;
  const int ctx = min(p.context_lens[seq], int(p.max_context));
  const int split = int(p.split);
  const int n_splits = (ctx + split - 1) / split;
  if (n_splits <= 1) return;  // the decode kernel wrote the output itself
  const std::int64_t max_splits = (p.max_context + split - 1) / split;
  const std::int64_t qh = std::int64_t(seq) * p.n_heads + head;
  const float* partial = static_cast<const float*>(p.workspace) + qh * max_splits * HeadDim;
  const float* stats = static_cast<const float*>(p.workspace) + p.n_seqs * p.n_heads * max_splits * HeadDim +
                       qh * max_splits * 2;
  float mx = -INFINITY;
  for (int s = 0; s < n_splits; ++s) mx = fmaxf(mx, stats[2 * s]);
  float num = 0.f, den = 0.f;
  for (int s = 0; s < n_splits; ++s) {
    const float w = stats[2 * s + 1] * expf(stats[2 * s] - mx);
    num += w * partial[std::int64_t(s) * HeadDim + d];
    den += w;
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

template <int HeadDim, int MaxG>
void launch(const attention_decode_params& p, int group, hipStream_t stream) {
  const int chunks = (group + MaxG - 1) / MaxG;
  const std::int64_t splits = attention_decode_splits(p.max_context, p.split);
  const dim3 grid(static_cast<unsigned>(p.cache.n_kv_heads * chunks), static_cast<unsigned>(p.n_seqs),
                  static_cast<unsigned>(splits));
  if (p.split == attention_decode_short_split) {
    constexpr int short_split = int(attention_decode_short_split);
    gpu::launch_dependent(decode_kernel<HeadDim, MaxG, short_split>, grid, dim3(threads), stream, p);
  } else {
    gpu::launch_dependent(decode_kernel<HeadDim, MaxG, int(attention_decode_split)>, grid, dim3(threads), stream, p);
  }
  if (splits > 1) {
    const dim3 merge_grid(static_cast<unsigned>(p.n_heads), static_cast<unsigned>(p.n_seqs));
    gpu::launch_dependent(decode_merge_kernel<HeadDim>, merge_grid, dim3(HeadDim), stream, p);
  }
}

template <int HeadDim>
void launch_for_group(const attention_decode_params& p, int group, hipStream_t stream) {
  if (group == 1) {
    launch<HeadDim, 1>(p, group, stream);
  } else if (group <= 4) {
    launch<HeadDim, 4>(p, group, stream);
  } else {
    launch<HeadDim, 8>(p, group, stream);
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
  if (hd == 64) {
    launch_for_group<64>(p, group, stream);
  } else {
    launch_for_group<128>(p, group, stream);
  }
  return hipGetLastError();
}

}  // namespace anvil::kernels
