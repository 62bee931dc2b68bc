// Paged prefill attention; see kernels/attention_prefill.h for the design.
//
// Block: 256 threads, 32 query rows (16 at head size 256; row = (token, head of the kv head's
// group), token-major), q pre-scaled in shared memory as f32. Per key tile (warp_size keys, f16 in
// shared memory, K rows padded by 16 bytes so the lanes' 16-byte reads hit distinct banks):
//   scores: lane j takes key j and dots it with the warp's rows (K read once for all of them);
//   online softmax per row: tile max and sum by warp reductions, f32;
//   P·V: lane d owns dims d, d + warp_size, ...; p_j is broadcast by a shuffle.
// An 8-bit cache is decoded and scaled as it is staged (kernels/kv_cache_read.h).
// Masked keys (past the row's own position, or before its window) weigh exactly 0, and rows past
// the sequence's tokens are computed but never stored. A window starts the key loop at the tile of
// the first key the block's earliest row sees (first_key_tile); the sink joins each row's
// denominator at the end, l + exp(s - m). Without them the arithmetic is today's.
#include "kernels/attention_prefill.h"

#include "kernels/host_device.h"
#include "kernels/kv_cache_read.h"
#include "kernels/tensor_core.h"

namespace anvil::kernels {
namespace {

// Fixed on the host side (the host pass does not know the device's warp size under HIP):
// 256 threads and 32 rows per block; 8 warps of 4 rows with 32-wide warps, 4 of 8 with 64. Head
// size 256 takes 16 rows and 512 takes 8 (a row per warp), so that q (f32) and a key tile, staged
// 128 dims at a time, fit 48 KB of shared memory (64 KB with 64-wide warps).
constexpr int threads = 256;
ANVIL_HOST_DEVICE constexpr int tile_rows_for(std::int64_t head_dim) {
  return head_dim > 256 ? 8 : head_dim > 128 ? 16 : 32;
}

// The first key a query at position qpos sees under a window of W positions (0: none).
__device__ __forceinline__ int window_first_key(std::int64_t window, int qpos) {
  return window > 0 && window <= qpos ? qpos - int(window) + 1 : 0;
}

// Where a block's key loop starts: the tile (of `keys`, from 0) holding the first key its earliest
// query, at position q0, sees.
__device__ __forceinline__ int first_key_tile(std::int64_t window, int q0, int keys) {
  return window_first_key(window, q0) / keys * keys;
}

// Eight 8-bit codes decoded and scaled, as f16 (one more rounding than the f32 reference). fp8
// on sm_89+ takes the conversion instruction, two codes at a time (their own values, so the scale
// loses kv_row_scale's 2^8 exactly): the same bits as the bit-move decode, 8% faster at a chunk
// of 2048 after 6000 positions (bench/GPU_NOTES.md, session 18).
template <kv_dtype T>
__device__ __forceinline__ uint4 decoded8(typename kv_vec8<T>::raw r, float sc) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (T == kv_dtype::fp8) {
    const float s = sc / fp8_half_decode_factor;
    unsigned h[4], o[4];
    fp8x8_to_half2x4_cvt(r, h);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      o[i] = gpu::floats_to_half2_bits(gpu::half_bits_to_float(static_cast<unsigned short>(h[i] & 0xffffu)) * s,
                                       gpu::half_bits_to_float(static_cast<unsigned short>(h[i] >> 16)) * s);
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
  }
#endif
  float f[8];
  kv_vec8<T>::to_float(r, f);
  return make_uint4(gpu::floats_to_half2_bits(f[0] * sc, f[1] * sc), gpu::floats_to_half2_bits(f[2] * sc, f[3] * sc),
                    gpu::floats_to_half2_bits(f[4] * sc, f[5] * sc), gpu::floats_to_half2_bits(f[6] * sc, f[7] * sc));
}

// Eight elements of a cache row as halves in shared memory: f16 rows as they are, 8-bit rows
// decoded and scaled.
template <kv_dtype T>
__device__ __forceinline__ uint4 staged8(const void* base, const float* scales, std::int64_t elem, std::int64_t row) {
  if constexpr (T == kv_dtype::f16) {
    return kv_vec8<T>::load(base, elem);
  } else {
    return decoded8<T>(kv_vec8<T>::load(base, elem), kv_row_scale<T>(scales, row));
  }
}

template <kv_dtype T, int HeadDim>
__global__ void __launch_bounds__(threads) prefill_kernel(attention_prefill_params p) {
  constexpr int ws = gpu::warp_size, keys = ws, dpl = HeadDim / ws;
  constexpr int tile_rows = tile_rows_for(HeadDim);
  constexpr int warps = threads / ws, rows_per_warp = tile_rows / warps;
  // A key tile is staged 128 dims at a time (head size 256: two chunks of K for the scores, then
  // two of V for P·V), so that 64-wide warps' tiles fit 64 KB; up to 128 dims, K and V at once.
  constexpr int dc = HeadDim > 128 ? 128 : HeadDim, chunks = HeadDim / dc, dpc = dc / ws;
  constexpr int k_stride = dc + 8;  // halfs; 16 bytes of padding per row
  __shared__ float q_s[tile_rows][HeadDim];
  __shared__ __align__(16) gpu::half_bits k_s[keys][k_stride];
  __shared__ __align__(16) gpu::half_bits v_s[keys][dc];

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

  // The warp's rows: their query positions (-1: no row), first keys and running state.
  int qpos[rows_per_warp], qlo[rows_per_warp];
  float m[rows_per_warp], l[rows_per_warp], acc[rows_per_warp][dpl];
#pragma unroll
  for (int i = 0; i < rows_per_warp; ++i) {
    const std::int64_t row = row0 + warp * rows_per_warp + i;
    qpos[i] = row < rows_total ? sq.start_pos + int(row / group) : -1;
    qlo[i] = window_first_key(p.window, qpos[i]);
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int d = 0; d < dpl; ++d) acc[i][d] = 0.f;
  }
  const std::int64_t last_row = min(row0 + tile_rows, rows_total) - 1;
  const int kv_end = sq.start_pos + int(last_row / group) + 1;

  // Keys before the earliest row's window are never read (their blocks may be given back: a
  // window pool's table holds -1 there); they are masked for every row anyway.
  const int kv_lo = window_first_key(p.window, sq.start_pos + int(row0 / group));
  // Dims [dc ch, dc (ch + 1)) of the tile's keys into k_s (with_k) and v_s (with_v).
  const auto stage = [&](int kt0, int ch, bool with_k, bool with_v) {
    for (int e = tid; e < keys * (dc / 8); e += threads) {
      const int j = e / (dc / 8), c = e % (dc / 8);
      const int pos = kt0 + j;
      uint4 kr = make_uint4(0, 0, 0, 0), vr = make_uint4(0, 0, 0, 0);
      if (pos < kv_end && pos >= kv_lo) {
        const std::int64_t slot = std::int64_t(table[pos / bs]) * bs + pos % bs;
        const std::int64_t off = slot * kv_row + std::int64_t(kvh) * HeadDim + ch * dc + c * 8;
        const std::int64_t row = slot * p.cache.n_kv_heads + kvh;
        if (with_k) kr = staged8<T>(p.cache.k, p.cache.k_scales, off, row);
        if (with_v) vr = staged8<T>(p.cache.v, p.cache.v_scales, off, row);
      }
      if (with_k) *reinterpret_cast<uint4*>(&k_s[j][c * 8]) = kr;
      if (with_v) *reinterpret_cast<uint4*>(&v_s[j][c * 8]) = vr;
    }
  };

  for (int kt0 = first_key_tile(p.window, sq.start_pos + int(row0 / group), keys); kt0 < kv_end; kt0 += keys) {
    // Scores of key (kt0 + lane) for the warp's rows, chunk by chunk.
    float s[rows_per_warp];
#pragma unroll
    for (int i = 0; i < rows_per_warp; ++i) s[i] = 0.f;
#pragma unroll
    for (int ch = 0; ch < chunks; ++ch) {
      __syncthreads();  // the previous chunk or tile is fully read (and q_s written, the first time)
      stage(kt0, ch, true, chunks == 1);
      __syncthreads();
#pragma unroll 4
      for (int c = 0; c < dc / 8; ++c) {
        float kf[8];
        gpu::half8_to_float(*reinterpret_cast<const uint4*>(&k_s[lane][c * 8]), kf);
#pragma unroll
        for (int i = 0; i < rows_per_warp; ++i) {
          const float* qr = &q_s[warp * rows_per_warp + i][ch * dc + c * 8];
#pragma unroll
          for (int t = 0; t < 8; ++t) s[i] += qr[t] * kf[t];
        }
      }
    }

    // Online softmax update.
    float pr[rows_per_warp];
#pragma unroll
    for (int i = 0; i < rows_per_warp; ++i) {
      const bool masked = kt0 + lane > qpos[i] || kt0 + lane < qlo[i];  // also every key of a missing row (qpos -1)
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

    // P·V, chunk by chunk (V of a single chunk came with K).
#pragma unroll
    for (int ch = 0; ch < chunks; ++ch) {
      if constexpr (chunks > 1) {
        __syncthreads();  // the previous chunk of V is fully read
        stage(kt0, ch, false, true);
        __syncthreads();
      }
      for (int j = 0; j < keys; ++j) {
        float vf[dpc];
#pragma unroll
        for (int d = 0; d < dpc; ++d) vf[d] = gpu::half_to_float(v_s[j][lane + d * ws]);
#pragma unroll
        for (int i = 0; i < rows_per_warp; ++i) {
          const float pj = gpu::shfl(pr[i], j);
#pragma unroll
          for (int d = 0; d < dpc; ++d) acc[i][ch * dpc + d] += pj * vf[d];
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < rows_per_warp; ++i) {
    if (qpos[i] < 0) continue;
    const std::int64_t row = row0 + warp * rows_per_warp + i;
    const std::int64_t tok = sq.first_token + row / group, head = std::int64_t(kvh) * group + row % group;
    float* o = p.out + (tok * p.n_heads + head) * HeadDim;
    // The sink's share beside the keys'; m finite: the row has a key.
    const float inv = 1.f / (p.sinks != nullptr ? l[i] + expf(p.sinks[head] - m[i]) : l[i]);
#pragma unroll
    for (int d = 0; d < dpl; ++d) o[lane + d * ws] = acc[i][d] * inv;
  }
}

#if defined(ANVIL_GPU_CUDA)
// ---- Tensor cores (NVIDIA sm_80+): the same attention, FlashAttention-2 style on mma.sync ----
// Block: 8 warps, 128 query rows (16 per warp, rows as above), one kv head (8 warps measured
// 1.15-1.25x faster than 4: each K/V tile staged serves twice the rows; bench/GPU_NOTES.md).
// Per tile of 64 keys (K and V staged as f16 in shared memory, rows padded by 16 bytes, in two
// buffers: the next tile is fetched while this one is computed): S = Q K^T on m16n8k16 tensor
// core instructions (Q in f16 registers, pre-scaled; f32 accumulate), the online softmax on the
// accumulators (each row's four lanes reduce by shuffles; scores in base 2, exp2), P rounded to
// f16 in registers as the A operand of O += P V. The B operands come four 8x8 matrices per
// ldmatrix (K's as they lie, V's transposed). Q and P are rounded to f16 — the CUDA-core kernel
// above keeps them in f32.
//
// Head size 256: O's accumulators alone take 128 registers a lane, so Q's fragments stay in shared
// memory (f16, pre-scaled, rows padded by 16 bytes), read by ldmatrix once per 16-dim slice and
// tile, and a tile holds 32 keys (shared memory: 2 x 33 KB of tiles beside Q's 66 KB).
namespace prefill_tc {
constexpr int warps = 8, threads = 32 * warps, rows = 16 * warps;
template <int HeadDim>
inline constexpr bool q_in_smem = HeadDim > 128;
template <int HeadDim>
inline constexpr int keys = q_in_smem<HeadDim> ? 32 : 64;  // per tile
// One tile of keys as f16 in shared memory, rows padded by 16 bytes.
template <int HeadDim>
struct tile {
  __align__(16) gpu::half_bits k[keys<HeadDim>][HeadDim + 8];
  __align__(16) gpu::half_bits v[keys<HeadDim>][HeadDim + 8];
};
// Q of the block's rows, when q_in_smem.
template <int HeadDim>
inline constexpr int q_bytes = q_in_smem<HeadDim> ? rows * (HeadDim + 8) * 2 : 0;
// 8 bits: a tile's codes and row scales as they land, piece i of thread t at [i][t].
template <kv_dtype T, int PerThread>
struct codes {
  typename kv_vec8<T>::raw k[PerThread][threads], v[PerThread][threads];
  float k_scale[PerThread][threads], v_scale[PerThread][threads];
};
// The shared memory of a block: two tiles, Q (q_in_smem), and for 8 bits the staging area.
template <kv_dtype T, int HeadDim>
inline constexpr int smem_bytes =
    2 * int(sizeof(tile<HeadDim>)) + q_bytes<HeadDim> +
    (T == kv_dtype::f16 ? 0 : int(sizeof(codes<T, keys<HeadDim> * HeadDim / 8 / threads>)));
}  // namespace prefill_tc


template <kv_dtype T, int HeadDim>
__global__ void __launch_bounds__(prefill_tc::threads) prefill_tc_kernel(attention_prefill_params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int keys = prefill_tc::keys<HeadDim>;
  constexpr bool q_in_smem = prefill_tc::q_in_smem<HeadDim>;
  constexpr int ksteps = HeadDim / 16, dtiles = HeadDim / 8, ntiles = keys / 8;
  constexpr int q_stride = HeadDim + 8;  // halfs, q_in_smem
  using tile_t = prefill_tc::tile<HeadDim>;
  // Two tiles (the one computed, the next one landing), then Q, then the 8-bit staging area.
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  tile_t* const tiles = reinterpret_cast<tile_t*>(dyn_smem);
  gpu::half_bits* const q_s = reinterpret_cast<gpu::half_bits*>(tiles + 2);

  const attention_prefill_seq sq = p.seqs[blockIdx.z];
  const int kvh = blockIdx.y, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, c = lane % 4;  // the fragment's row (and row + 8) and column pair
  const int group = int(p.n_heads / p.cache.n_kv_heads);
  const std::int64_t rows_total = std::int64_t(sq.n_tokens) * group;
  const std::int64_t row0 = std::int64_t(blockIdx.x) * prefill_tc::rows;
  if (row0 >= rows_total) return;  // uniform over the block
  const std::int32_t* table = p.block_tables + std::int64_t(blockIdx.z) * p.block_table_stride;
  const std::int64_t bs = p.cache.block_size, kv_row = p.cache.n_kv_heads * HeadDim;

  // The lane's two rows (g and g + 8 of the warp's 16): positions (-1: no row) and q, as the
  // A operand of S = Q K^T for each 16-wide slice of the head.
  int qpos[2], qlo[2];  // and the first key each row's window holds
  const float* qrow[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const std::int64_t row = row0 + warp * 16 + g + 8 * h;
    const bool valid = row < rows_total;
    const std::int64_t tok = sq.first_token + row / group, head = std::int64_t(kvh) * group + row % group;
    qpos[h] = valid ? sq.start_pos + int(row / group) : -1;
    qlo[h] = window_first_key(p.window, qpos[h]);
    qrow[h] = valid ? p.q + (tok * p.n_heads + head) * HeadDim : nullptr;
  }
  // Scores in the base-2 domain: q carries scale x log2(e), so the softmax takes exp2 (one
  // instruction) of the same differences expf would take of the scores.
  const float qscale = p.scale * 1.4426950408889634f;
  const auto q_pair = [&](int h, int col) -> unsigned {
    if (qrow[h] == nullptr) return 0u;
    const float2 v = *reinterpret_cast<const float2*>(qrow[h] + col);
    return gpu::floats_to_half2_bits(v.x * qscale, v.y * qscale);
  };
  unsigned qa[q_in_smem ? 1 : ksteps][4];
  if constexpr (q_in_smem) {
    // The warp's 16 rows into q_s: lane (g, c) writes the pairs its fragments would hold.
    gpu::half_bits* const wq = q_s + warp * 16 * q_stride;
    for (int ks = 0; ks < ksteps; ++ks) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const int col = ks * 16 + 8 * hi + 2 * c;
          *reinterpret_cast<unsigned*>(wq + (g + 8 * h) * q_stride + col) = q_pair(h, col);
        }
      }
    }
  } else {
#pragma unroll
    for (int ks = 0; ks < ksteps; ++ks) {
      qa[ks][0] = q_pair(0, ks * 16 + 2 * c);
      qa[ks][1] = q_pair(1, ks * 16 + 2 * c);
      qa[ks][2] = q_pair(0, ks * 16 + 8 + 2 * c);
      qa[ks][3] = q_pair(1, ks * 16 + 8 + 2 * c);
    }
  }
  float o[dtiles][4];
#pragma unroll
  for (int dt = 0; dt < dtiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  const std::int64_t last_row = min(row0 + prefill_tc::rows, rows_total) - 1;
  const int kv_end = sq.start_pos + int(last_row / group) + 1;
  // Staging a tile of keys [kt0, kt0 + keys), keys past kv_end as zeros, by cp.async so that the
  // next tile lands while this one is computed: f16 rows straight into tiles[b]; 8-bit rows (and
  // their scales) into a staging area where each thread finds the pieces it copied itself, which
  // it decodes and scales into tiles[b] once they have landed (no barrier between).
  constexpr int pieces = keys * (HeadDim / 8);  // 8 elements each
  constexpr int per_thread = pieces / prefill_tc::threads;
  static_assert(pieces % prefill_tc::threads == 0, "whole pieces per thread");
  prefill_tc::codes<T, per_thread>* const staged =
      reinterpret_cast<prefill_tc::codes<T, per_thread>*>(dyn_smem + 2 * sizeof(tile_t) + prefill_tc::q_bytes<HeadDim>);
  // Keys before the earliest row's window are not fetched (zeros; their blocks may be given back:
  // a window pool's table holds -1 there); they are masked for every row anyway.
  const int kv_lo = window_first_key(p.window, sq.start_pos + int(row0 / group));
  const auto fetch = [&](int kt0, int b) {
#pragma unroll
    for (int i = 0; i < per_thread; ++i) {
      const int e = tid + i * prefill_tc::threads, j = e / (HeadDim / 8), cc = e % (HeadDim / 8);
      const int pos = kt0 + j;
      const bool valid = pos < kv_end && pos >= kv_lo;
      const std::int64_t slot = valid ? std::int64_t(table[pos / bs]) * bs + pos % bs : 0;
      const std::int64_t off = slot * kv_row + std::int64_t(kvh) * HeadDim + cc * 8;  // elements
      if constexpr (T == kv_dtype::f16) {
        tc::cp_async16(&tiles[b].k[j][cc * 8], static_cast<const gpu::half_bits*>(p.cache.k) + off, valid);
        tc::cp_async16(&tiles[b].v[j][cc * 8], static_cast<const gpu::half_bits*>(p.cache.v) + off, valid);
      } else {
        const std::int64_t row = slot * p.cache.n_kv_heads + kvh;
        tc::cp_async8(&staged->k[i][tid], static_cast<const unsigned char*>(p.cache.k) + off, valid);
        tc::cp_async8(&staged->v[i][tid], static_cast<const unsigned char*>(p.cache.v) + off, valid);
        tc::cp_async4(&staged->k_scale[i][tid], p.cache.k_scales + row, valid);
        tc::cp_async4(&staged->v_scale[i][tid], p.cache.v_scales + row, valid);
      }
    }
    tc::cp_async_commit();
  };
  const auto decode = [&](int b) {  // 8 bits: this thread's staged pieces, landed, into tiles[b]
    if constexpr (T != kv_dtype::f16) {
      tc::cp_async_wait<0>();
#pragma unroll
      for (int i = 0; i < per_thread; ++i) {
        const int e = tid + i * prefill_tc::threads, j = e / (HeadDim / 8), cc = e % (HeadDim / 8);
        *reinterpret_cast<uint4*>(&tiles[b].k[j][cc * 8]) =
            decoded8<T>(staged->k[i][tid], kv_row_scale<T>(&staged->k_scale[i][tid], 0));
        *reinterpret_cast<uint4*>(&tiles[b].v[j][cc * 8]) =
            decoded8<T>(staged->v[i][tid], kv_row_scale<T>(&staged->v_scale[i][tid], 0));
      }
    }
  };
  const int kt_first = first_key_tile(p.window, sq.start_pos + int(row0 / group), keys);
  fetch(kt_first, 0);
  decode(0);
  for (int kt0 = kt_first, b = 0; kt0 < kv_end; kt0 += keys, b ^= 1) {
    const bool more = kt0 + keys < kv_end;
    if (more) fetch(kt0 + keys, b ^ 1);  // tiles[b ^ 1] was last read before the previous barrier
    if constexpr (T == kv_dtype::f16) {
      if (more) {
        tc::cp_async_wait<1>();  // this tile's group has landed; the next one may still fly
      } else {
        tc::cp_async_wait<0>();
      }
    }
    __syncthreads();  // tiles[b] is complete for every warp
    const auto& k_s = tiles[b].k;
    const auto& v_s = tiles[b].v;

    // S = Q K^T for the tile's 8 groups of 8 keys: lane (g, c) holds keys 2c, 2c + 1 of each group
    // for rows g (s[nt][0..1]) and g + 8 (s[nt][2..3]). The B operands of two key groups at once
    // by ldmatrix: lane l names row l % 8 of group nt + l / 16, half (l / 8) % 2 of the 16 dims.
    float s[ntiles][4];
#pragma unroll
    for (int nt = 0; nt < ntiles; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
    if constexpr (q_in_smem) {
      // Q's slice ks once for all key groups: lane l names row l % 16, half l / 16 of the slice.
#pragma unroll
      for (int ks = 0; ks < ksteps; ++ks) {
        unsigned a[4];
        tc::ldmatrix_x4(q_s + (warp * 16 + lane % 16) * q_stride + ks * 16 + (lane / 16) * 8, a);
#pragma unroll
        for (int nt = 0; nt < ntiles; nt += 2) {
          unsigned b[4];
          tc::ldmatrix_x4(&k_s[(nt + lane / 16) * 8 + lane % 8][ks * 16 + ((lane / 8) % 2) * 8], b);
          tc::mma_16816(s[nt], a, b[0], b[1]);
          tc::mma_16816(s[nt + 1], a, b[2], b[3]);
        }
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < ntiles; nt += 2) {
#pragma unroll
        for (int ks = 0; ks < ksteps; ++ks) {
          unsigned b[4];
          tc::ldmatrix_x4(&k_s[(nt + lane / 16) * 8 + lane % 8][ks * 16 + ((lane / 8) % 2) * 8], b);
          tc::mma_16816(s[nt], qa[ks], b[0], b[1]);
          tc::mma_16816(s[nt + 1], qa[ks], b[2], b[3]);
        }
      }
    }
    // Online softmax per row; keys past the row's position or before its window (and every key of a
    // missing row) weigh 0 — checked only on the tiles that reach past either.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
      const bool masked = kt0 + keys - 1 > qpos[h] || kt0 < qlo[h];
#pragma unroll
      for (int nt = 0; nt < ntiles; ++nt) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float& x = s[nt][2 * h + j];
          const int key = kt0 + nt * 8 + 2 * c + j;
          if (masked && (key > qpos[h] || key < qlo[h])) x = -INFINITY;
          mx = fmaxf(mx, x);
        }
      }
      mx = fmaxf(mx, gpu::shfl_xor(mx, 1));
      mx = fmaxf(mx, gpu::shfl_xor(mx, 2));
      const float m_new = fmaxf(m[h], mx);
      const bool none = m_new == -INFINITY;
      const float alpha = none ? 1.f : exp2f(m[h] - m_new);
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < ntiles; ++nt) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float& x = s[nt][2 * h + j];
          x = none || x == -INFINITY ? 0.f : exp2f(x - m_new);
          sum += x;
        }
      }
      sum += gpu::shfl_xor(sum, 1);
      sum += gpu::shfl_xor(sum, 2);
      l[h] = l[h] * alpha + sum;
      m[h] = m_new;
#pragma unroll
      for (int dt = 0; dt < dtiles; ++dt) {
        o[dt][2 * h] *= alpha;
        o[dt][2 * h + 1] *= alpha;
      }
    }
    // O += P V, 16 keys at a time: P's accumulators are already the A operand's layout.
#pragma unroll
    for (int kk = 0; kk < keys / 16; ++kk) {
      const unsigned pa[4] = {gpu::floats_to_half2_bits(s[2 * kk][0], s[2 * kk][1]),
                              gpu::floats_to_half2_bits(s[2 * kk][2], s[2 * kk][3]),
                              gpu::floats_to_half2_bits(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              gpu::floats_to_half2_bits(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      // V's B operands of two dims groups at once: lane l names key row (l % 8) + 8 ((l / 8) % 2)
      // of the 16, in dims group dt + l / 16.
#pragma unroll
      for (int dt = 0; dt < dtiles; dt += 2) {
        unsigned b[4];
        tc::ldmatrix_x4_trans(&v_s[kk * 16 + lane % 8 + ((lane / 8) % 2) * 8][(dt + lane / 16) * 8], b);
        tc::mma_16816(o[dt], pa, b[0], b[1]);
        tc::mma_16816(o[dt + 1], pa, b[2], b[3]);
      }
    }
    if (more) decode(b ^ 1);
    __syncthreads();  // every warp is done with tiles[b] before the next fetch overwrites it
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (qpos[h] < 0) continue;
    const std::int64_t row = row0 + warp * 16 + g + 8 * h;
    const std::int64_t tok = sq.first_token + row / group, head = std::int64_t(kvh) * group + row % group;
    float* out = p.out + (tok * p.n_heads + head) * HeadDim;
    // The sink in the scores' base-2 domain; m finite: the row has a key.
    const float inv = 1.f / (p.sinks != nullptr ? l[h] + exp2f(p.sinks[head] * 1.4426950408889634f - m[h]) : l[h]);
#pragma unroll
    for (int dt = 0; dt < dtiles; ++dt) {
      *reinterpret_cast<float2*>(out + dt * 8 + 2 * c) = make_float2(o[dt][2 * h] * inv, o[dt][2 * h + 1] * inv);
    }
  }
#else
  __trap();  // launched only on devices of compute capability 8.0 and up
#endif
}

#endif

#if defined(ANVIL_GPU_CUDA)
template <kv_dtype T, int HeadDim>
void launch_tc(const attention_prefill_params& p, dim3 grid, hipStream_t stream) {
  constexpr int smem = prefill_tc::smem_bytes<T, HeadDim>;
  gpu::allow_dynamic_smem<prefill_tc_kernel<T, HeadDim>>(smem);
  prefill_tc_kernel<T, HeadDim><<<grid, prefill_tc::threads, smem, stream>>>(p);
}
#endif

template <kv_dtype T>
void launch(const attention_prefill_params& p, dim3 grid, hipStream_t stream) {
#if defined(ANVIL_GPU_CUDA)
  if (!p.cuda_cores_only && attention_prefill_tensor_cores(p.cache.head_dim)) {
    grid.x = static_cast<unsigned>((p.max_seq_tokens * (p.n_heads / p.cache.n_kv_heads) + prefill_tc::rows - 1) / prefill_tc::rows);
    if (p.cache.head_dim == 64) {
      launch_tc<T, 64>(p, grid, stream);
    } else if (p.cache.head_dim == 128) {
      launch_tc<T, 128>(p, grid, stream);
    } else {
      launch_tc<T, 256>(p, grid, stream);
    }
    return;
  }
#endif
  if (p.cache.head_dim == 64) {
    prefill_kernel<T, 64><<<grid, threads, 0, stream>>>(p);
  } else if (p.cache.head_dim == 128) {
    prefill_kernel<T, 128><<<grid, threads, 0, stream>>>(p);
  } else if (p.cache.head_dim == 256) {
    prefill_kernel<T, 256><<<grid, threads, 0, stream>>>(p);
  } else {
    prefill_kernel<T, 512><<<grid, threads, 0, stream>>>(p);
  }
}

using gpu::aligned16;

}  // namespace

bool attention_prefill_tensor_cores(std::int64_t head_dim) {
#if defined(ANVIL_GPU_CUDA)
  return head_dim <= attention_tc_max_head_dim && tc::device_has_mma();
#else
  return false;
#endif
}

hipError_t launch_attention_prefill(const attention_prefill_params& p, hipStream_t stream) {
  if (p.n_seqs == 0 || p.max_seq_tokens == 0) return hipSuccess;
  const std::int64_t hd = p.cache.head_dim, n_kv = p.cache.n_kv_heads;
  if (p.n_seqs < 0 || p.n_seqs > 65535 || p.max_seq_tokens < 0 || (hd != 64 && hd != 128 && hd != 256 && hd != 512) ||
      n_kv <= 0 ||
      n_kv > 65535 || p.n_heads <= 0 || p.n_heads % n_kv != 0 || p.cache.block_size <= 0 || p.window < 0) {
    return hipErrorInvalidValue;
  }
  if (!aligned16(p.cache.k) || !aligned16(p.cache.v)) return hipErrorInvalidValue;
  if (kv_is_8bit(p.cache.dtype) && (p.cache.k_scales == nullptr || p.cache.v_scales == nullptr)) return hipErrorInvalidValue;
  const int tile_rows = tile_rows_for(hd);
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
