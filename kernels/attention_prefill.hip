// Paged prefill attention; see kernels/attention_prefill.h for the design.
//
// Block: 256 threads, 32 query rows (row = (token, head of the kv head's group), token-major), q
// pre-scaled in shared memory as f32. Per key tile (warp_size keys, f16 in shared memory, K rows
// padded by 16 bytes so the lanes' 16-byte reads hit distinct banks):
//   scores: lane j takes key j and dots it with the warp's rows (K read once for all of them);
//   online softmax per row: tile max and sum by warp reductions, f32;
//   P·V: lane d owns dims d, d + warp_size, ...; p_j is broadcast by a shuffle.
// An 8-bit cache is decoded and scaled as it is staged (kernels/kv_cache_read.h).
// Masked keys (past the row's own position) weigh exactly 0, and rows past the sequence's tokens
// are computed but never stored.
#include "kernels/attention_prefill.h"

#include "kernels/kv_cache_read.h"

namespace anvil::kernels {
namespace {

// Fixed on the host side (the host pass does not know the device's warp size under HIP):
// 256 threads and 32 rows per block; 8 warps of 4 rows with 32-wide warps, 4 of 8 with 64.
constexpr int threads = 256;
constexpr int tile_rows = 32;

// Eight elements of a cache row as halves in shared memory: f16 rows as they are, 8-bit rows
// decoded and scaled (rounded to f16 once more).
template <kv_dtype T>
__device__ __forceinline__ uint4 staged8(const void* base, const float* scales, std::int64_t elem, std::int64_t row) {
  using vec = kv_vec<T, 8>;
  if constexpr (T == kv_dtype::f16) {
    return vec::load(base, elem);
  } else {
    float f[8];
    vec::to_float(vec::load(base, elem), f);
    const float sc = kv_row_scale<T>(scales, row);
    return make_uint4(gpu::floats_to_half2_bits(f[0] * sc, f[1] * sc), gpu::floats_to_half2_bits(f[2] * sc, f[3] * sc),
                      gpu::floats_to_half2_bits(f[4] * sc, f[5] * sc), gpu::floats_to_half2_bits(f[6] * sc, f[7] * sc));
  }
}

template <kv_dtype T, int HeadDim>
__global__ void __launch_bounds__(threads) prefill_kernel(attention_prefill_params p) {
  constexpr int ws = gpu::warp_size, keys = ws, dpl = HeadDim / ws;
  constexpr int warps = threads / ws, rows_per_warp = tile_rows / warps;
  constexpr int k_stride = HeadDim + 8;  // halfs; 16 bytes of padding per row
  __shared__ float q_s[tile_rows][HeadDim];
  __shared__ __align__(16) gpu::half_bits k_s[keys][k_stride];
  __shared__ __align__(16) gpu::half_bits v_s[keys][HeadDim];

  const attention_prefill_seq sq = p.seqs[blockIdx.z];
  const int kvh = blockIdx.y, tid = threadIdx.x, lane = tid % ws, warp = tid / ws;
  const int group = int(p.n_heads / p.cache.n_kv_heads);
  const std::int64_t rows_total = std::int64_t(sq.n_tokens) * group;
  const std::int64_t row0 = std::int64_t(blockIdx.x) * tile_rows;
  if (row0 >= rows_total) return;  // uniform over the block
  const std::int32_t* table = p.block_tables + std::int64_t(blockIdx.z) * p.block_table_stride;
  const std::int64_t bs = p.cache.block_size, kv_row = p.cache.n_kv_heads * HeadDim;

  for (int e = tid; e < tile_rows * HeadDim; e += threads) {
    const int r = e / HeadDim, d = e % HeadDim;
    const std::int64_t row = row0 + r;
    float x = 0.f;
    if (row < rows_total) {
      const std::int64_t tok = sq.first_token + row / group, head = std::int64_t(kvh) * group + row % group;
      x = p.q[(tok * p.n_heads + head) * HeadDim + d] * p.scale;
    }
    q_s[r][d] = x;
  }

  // The warp's rows: their query positions (-1: no row) and running state.
  int qpos[rows_per_warp];
  float m[rows_per_warp], l[rows_per_warp], acc[rows_per_warp][dpl];
#pragma unroll
  for (int i = 0; i < rows_per_warp; ++i) {
    const std::int64_t row = row0 + warp * rows_per_warp + i;
    qpos[i] = row < rows_total ? sq.start_pos + int(row / group) : -1;
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int d = 0; d < dpl; ++d) acc[i][d] = 0.f;
  }
  const std::int64_t last_row = min(row0 + tile_rows, rows_total) - 1;
  const int kv_end = sq.start_pos + int(last_row / group) + 1;

  for (int kt0 = 0; kt0 < kv_end; kt0 += keys) {
    __syncthreads();  // the previous tile is fully read (and q_s written, the first time)
    for (int e = tid; e < keys * (HeadDim / 8); e += threads) {
      const int j = e / (HeadDim / 8), c = e % (HeadDim / 8);
      const int pos = kt0 + j;
      uint4 kr = make_uint4(0, 0, 0, 0), vr = make_uint4(0, 0, 0, 0);
      if (pos < kv_end) {
        const std::int64_t slot = std::int64_t(table[pos / bs]) * bs + pos % bs;
        const std::int64_t off = slot * kv_row + std::int64_t(kvh) * HeadDim + c * 8;
        const std::int64_t row = slot * p.cache.n_kv_heads + kvh;
        kr = staged8<T>(p.cache.k, p.cache.k_scales, off, row);
        vr = staged8<T>(p.cache.v, p.cache.v_scales, off, row);
      }
      *reinterpret_cast<uint4*>(&k_s[j][c * 8]) = kr;
      *reinterpret_cast<uint4*>(&v_s[j][c * 8]) = vr;
    }
    __syncthreads();

    // Scores of key (kt0 + lane) for the warp's rows.
    float s[rows_per_warp];
#pragma unroll
    for (int i = 0; i < rows_per_warp; ++i) s[i] = 0.f;
#pragma unroll 4
    for (int c = 0; c < HeadDim / 8; ++c) {
      float kf[8];
      gpu::half8_to_float(*reinterpret_cast<const uint4*>(&k_s[lane][c * 8]), kf);
#pragma unroll
      for (int i = 0; i < rows_per_warp; ++i) {
        const float* qr = &q_s[warp * rows_per_warp + i][c * 8];
#pragma unroll
        for (int t = 0; t < 8; ++t) s[i] += qr[t] * kf[t];
      }
    }

    // Online softmax update.
    float pr[rows_per_warp];
#pragma unroll
    for (int i = 0; i < rows_per_warp; ++i) {
      const bool masked = kt0 + lane > qpos[i];  // also every key of a missing row (qpos -1)
      const float si = masked ? -INFINITY : s[i];
      const float m_new = fmaxf(m[i], gpu::warp_reduce_max(si));
      const bool none = m_new == -INFINITY;  // no key so far: leave the state alone
      const float alpha = none ? 1.f : expf(m[i] - m_new);
      pr[i] = masked || none ? 0.f : expf(si - m_new);
      l[i] = l[i] * alpha + gpu::warp_reduce_sum(pr[i]);
      m[i] = m_new;
#pragma unroll
      for (int d = 0; d < dpl; ++d) acc[i][d] *= alpha;
    }

    // P·V.
    for (int j = 0; j < keys; ++j) {
      float vf[dpl];
#pragma unroll
      for (int d = 0; d < dpl; ++d) vf[d] = gpu::half_to_float(v_s[j][lane + d * ws]);
#pragma unroll
      for (int i = 0; i < rows_per_warp; ++i) {
        const float pj = gpu::shfl(pr[i], j);
#pragma unroll
        for (int d = 0; d < dpl; ++d) acc[i][d] += pj * vf[d];
      }
    }
  }

#pragma unroll
  for (int i = 0; i < rows_per_warp; ++i) {
    if (qpos[i] < 0) continue;
    const std::int64_t row = row0 + warp * rows_per_warp + i;
    const std::int64_t tok = sq.first_token + row / group, head = std::int64_t(kvh) * group + row % group;
    float* o = p.out + (tok * p.n_heads + head) * HeadDim;
    const float inv = 1.f / l[i];
#pragma unroll
    for (int d = 0; d < dpl; ++d) o[lane + d * ws] = acc[i][d] * inv;
  }
}

template <kv_dtype T>
void launch(const attention_prefill_params& p, dim3 grid, hipStream_t stream) {
  if (p.cache.head_dim == 64) {
    prefill_kernel<T, 64><<<grid, threads, 0, stream>>>(p);
  } else {
    prefill_kernel<T, 128><<<grid, threads, 0, stream>>>(p);
  }
}

using gpu::aligned16;

}  // namespace

hipError_t launch_attention_prefill(const attention_prefill_params& p, hipStream_t stream) {
  if (p.n_seqs == 0 || p.max_seq_tokens == 0) return hipSuccess;
  const std::int64_t hd = p.cache.head_dim, n_kv = p.cache.n_kv_heads;
  if (p.n_seqs < 0 || p.n_seqs > 65535 || p.max_seq_tokens < 0 || (hd != 64 && hd != 128) || n_kv <= 0 ||
      n_kv > 65535 || p.n_heads <= 0 || p.n_heads % n_kv != 0 || p.cache.block_size <= 0) {
    return hipErrorInvalidValue;
  }
  if (!aligned16(p.cache.k) || !aligned16(p.cache.v)) return hipErrorInvalidValue;
  if (kv_is_8bit(p.cache.dtype) && (p.cache.k_scales == nullptr || p.cache.v_scales == nullptr)) return hipErrorInvalidValue;
  const std::int64_t tiles = (p.max_seq_tokens * (p.n_heads / n_kv) + tile_rows - 1) / tile_rows;
  if (tiles > 0x7fffffff) return hipErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(n_kv), static_cast<unsigned>(p.n_seqs));
  switch (p.cache.dtype) {
    case kv_dtype::f16: launch<kv_dtype::f16>(p, grid, stream); break;
    case kv_dtype::int8: launch<kv_dtype::int8>(p, grid, stream); break;
    case kv_dtype::fp8: launch<kv_dtype::fp8>(p, grid, stream); break;
  }
  return hipGetLastError();
}

}  // namespace anvil::kernels
