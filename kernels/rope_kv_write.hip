// RoPE + KV write. A 2-D grid: x over tokens, y over groups of heads — the token's q heads, then
// its kv heads — so that one token's work spreads over many multiprocessors (a decode step has
// one token per sequence; a block per token left a whole layer's rotation to one multiprocessor).
// Each thread takes (head, pair) elements and reads its pair's (sin, cos) from the step's table
// (launch_rope_angles, computed in double like rope_ref, so a position of 100k does not lose the
// angle to float rounding), then rotates q in place, or rotates k into the f16 cache. A block
// holding kv heads also stores their dimensions past rot_dim and copies their v into the cache.
// With an 8-bit cache a kv head takes a block of its own, which needs the whole rotated row
// before it can scale it. Given the Q/K norm weights, a block first finds its heads' RMSNorm
// scales (a warp per head) and rotates the normalised values; with v_norm it finds the v heads'
// scales the same way and stores the normalised v.
#include "kernels/rope_kv_write.h"

#include "kernels/rope_device.h"

namespace anvil::kernels {
namespace {

using rope_device::rotate;

constexpr int block_size = 128;

__device__ __forceinline__ void pair_index(rope_style style, int i, int half, int& a, int& b) {
  a = style == rope_style::normal ? 2 * i : i;
  b = style == rope_style::normal ? 2 * i + 1 : i + half;
}

// Pair i's (sin, cos) for token t, from the step's table.
__device__ __forceinline__ void angle(const rope_kv_write_params& p, std::int64_t t, int i, double& s, double& c) {
  const double* a = p.angles + (t * (p.rot_dim / 2) + i) * 2;
  s = a[0];
  c = a[1];
}

// The table: a thread per (token, pair), in double like rope_ref.
__global__ void __launch_bounds__(block_size) rope_angles_kernel(rope_angles_params p) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const std::int64_t half = p.rot_dim / 2;
  const std::int64_t e = std::int64_t(blockIdx.x) * block_size + threadIdx.x;
  if (e >= p.n_tokens * half) return;
  const std::int64_t t = e / half;
  const int i = int(e % half);
  const double pos = double(p.positions[t]) * double(p.freq_scale);
  double theta = pos * pow(double(p.freq_base), -2.0 * double(i) / double(p.rot_dim));
  if (p.freq_factors) theta /= double(p.freq_factors[i]);
  double s, c;
  sincos(theta, &s, &c);
  p.out[2 * e] = s;
  p.out[2 * e + 1] = c;
  if (p.q_scales && i == 0) p.q_scales[t] = attn_temperature(p.positions[t], p.attn_temp_scale, p.attn_temp_floor);
}

// Heads per block: enough pairs to give every thread one (at least one head).
int heads_per_block(std::int64_t half) { return half > 0 && half < block_size ? int(block_size / half) : 1; }

// The RMSNorm scale of one head's row x of hd, by a warp (every lane gets it), with
// rms_norm_short_rows_kernel's arithmetic (kernels/rms_norm.hip: each lane sums its strided squares
// in order, then the warp's xor reduction), so that the normalised values are the floats that op
// writes.
__device__ __forceinline__ float head_scale(const float* x, int hd, float eps, int lane) {
  float sum_sq = 0.f;
  for (int c = lane; c < hd; c += gpu::warp_size) sum_sq += x[c] * x[c];
  sum_sq = gpu::warp_reduce_sum(sum_sq);
  return rsqrtf(sum_sq / float(hd) + eps);
}

// Elements from one head of q's input to the next.
__device__ __forceinline__ std::int64_t q_head_stride(const rope_kv_write_params& p) {
  return p.q_in && p.q_in_head_stride ? p.q_in_head_stride : p.cache.head_dim;
}

// head_scale of each head in [h0, h1) of one token (q heads, then kv heads) into sc, and with
// v_norm of each kv head's v into vsc, a warp per head in turn. Ends with a barrier: every thread
// of the block must call it.
__device__ void head_scales(const rope_kv_write_params& p, const float* qi, const float* k, const float* v, int h0,
                            int h1, float* sc, float* vsc) {
  constexpr int warps = block_size / gpu::warp_size;
  const int lane = int(threadIdx.x) % gpu::warp_size, hd = int(p.cache.head_dim), n_q = int(p.n_heads);
  for (int h = h0 + int(threadIdx.x) / gpu::warp_size; h < h1; h += warps) {
    const float* x = h < n_q ? qi + std::int64_t(h) * q_head_stride(p) : k + std::int64_t(h - n_q) * hd;
    const float scale = head_scale(x, hd, p.norm_eps, lane);
    if (lane == 0) sc[h - h0] = scale;
    if (p.v_norm && h >= n_q) {
      const float v_scale = head_scale(v + std::int64_t(h - n_q) * hd, hd, p.norm_eps, lane);
      if (lane == 0) vsc[h - h0] = v_scale;
    }
  }
  __syncthreads();
}

// Element c of a head's row, normalised (x * scale * weight, as the norm kernels write it) where
// the op has that head's norm weight.
__device__ __forceinline__ float normed(const float* x, int c, float scale, const float* weight) {
  return weight ? x[c] * scale * weight[c] : x[c];
}

// Rotates heads [h0, h1) of token t — q heads, then (f16 cache only) kv heads, whose rotated k
// and plain v it stores.
__device__ void rope_heads(const rope_kv_write_params& p, std::int64_t t, int h0, int h1) {
  const int half = int(p.rot_dim / 2), hd = int(p.cache.head_dim);
  const int n_q = int(p.n_heads), n_kv = int(p.cache.n_kv_heads);
  const std::int64_t slot = p.q_only ? -1 : p.slots[t];  // < 0: a padding token, q rotated, nothing cached
  const std::int64_t row = std::int64_t(n_kv) * hd;
  float* q = p.q + t * p.n_heads * hd;
  const float* qi = p.q_in ? p.q_in + t * p.q_in_stride : q;
  const float* k = p.k + t * (p.k_stride ? p.k_stride : row);
  const float* v = p.v + t * (p.v_stride ? p.v_stride : row);
  gpu::half_bits* kc = static_cast<gpu::half_bits*>(p.cache.k) + (slot < 0 ? 0 : slot) * row;
  gpu::half_bits* vc = static_cast<gpu::half_bits*>(p.cache.v) + (slot < 0 ? 0 : slot) * row;
  __shared__ float sc[block_size], vsc[block_size];  // the heads' norm scales: at most a head per thread
  if (p.q_norm || p.k_norm || p.v_norm) head_scales(p, qi, k, v, h0, h1, sc, vsc);

  for (int e = threadIdx.x; e < (h1 - h0) * half; e += block_size) {
    const int h = h0 + e / half, i = e % half;
    if (h >= n_q && slot < 0) continue;
    double s, c;
    angle(p, t, i, s, c);
    int a, b;
    pair_index(p.style, i, half, a, b);
    if (h < n_q) {
      const std::int64_t base = std::int64_t(h) * hd;
      const float* x = qi + std::int64_t(h) * q_head_stride(p);
      float y0, y1;  // float first, as rope_ref stores float, then the temperature
      rotate(normed(x, a, sc[h - h0], p.q_norm), normed(x, b, sc[h - h0], p.q_norm), s, c, y0, y1);
      const float temp = p.q_scales ? p.q_scales[t] : 1.f;
      q[base + a] = y0 * temp;
      q[base + b] = y1 * temp;
    } else {
      const std::int64_t base = std::int64_t(h - n_q) * hd;
      const float* x = k + base;
      float y0, y1;  // float first, as rope_ref stores float, then f16
      rotate(normed(x, a, sc[h - h0], p.k_norm), normed(x, b, sc[h - h0], p.k_norm), s, c, y0, y1);
      kc[base + a] = gpu::float_to_half(y0);
      kc[base + b] = gpu::float_to_half(y1);
    }
  }
  if (p.q_in || p.q_norm) {  // q's dimensions past rot_dim: out of the fused row, or normalised
    for (int h = h0; h < min(h1, n_q); ++h) {
      const std::int64_t base = std::int64_t(h) * hd;
      const float* x = qi + std::int64_t(h) * q_head_stride(p);
      for (int e = int(p.rot_dim) + threadIdx.x; e < hd; e += block_size) q[base + e] = normed(x, e, sc[h - h0], p.q_norm);
    }
  }
  if (slot < 0) return;
  for (int h = max(h0, n_q); h < h1; ++h) {
    const std::int64_t base = std::int64_t(h - n_q) * hd;
    for (int e = int(p.rot_dim) + threadIdx.x; e < hd; e += block_size) {
      kc[base + e] = gpu::float_to_half(normed(k + base, e, sc[h - h0], p.k_norm));
    }
    const float v_scale = p.v_norm ? vsc[h - h0] : 1.f;  // the norm's x * scale * 1 (a weight of ones)
    for (int e = threadIdx.x; e < hd; e += block_size) vc[base + e] = gpu::float_to_half(v[base + e] * v_scale);
  }
}

__global__ void __launch_bounds__(block_size) rope_kv_write_kernel(rope_kv_write_params p, int group) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const int h0 = int(blockIdx.y) * group;
  rope_heads(p, blockIdx.x, h0, min(h0 + group, int(p.n_heads + (p.q_only ? 0 : p.cache.n_kv_heads))));
}

// Largest magnitude over the block (NaN-propagating, kernels/kv_quant.h); every thread gets it.
__device__ float block_amax(float a, float* red) {
  __syncthreads();  // red may still be read by the previous call
  red[threadIdx.x] = a;
  __syncthreads();
  for (int s = block_size / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) red[threadIdx.x] = kv_amax_step(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  return red[0];
}

// The 8-bit cache: blocks y < q_groups rotate q heads as above; block q_groups + h takes kv head h
// of the token: its rotated k and its v to shared memory, each row's amax, then the codes and the
// scales (kernels/kv_quant.h, the same arithmetic as kv_quantize_row). (A warp per kv head, four
// to a block, in registers and without barriers, measured slower: bench/GPU_NOTES.md, session 17.)
template <kv_dtype T>
__global__ void __launch_bounds__(block_size) rope_kv_write8_kernel(rope_kv_write_params p, int group, int q_groups) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const std::int64_t t = blockIdx.x;
  if (int(blockIdx.y) < q_groups) {
    const int h0 = int(blockIdx.y) * group;
    rope_heads(p, t, h0, min(h0 + group, int(p.n_heads)));
    return;
  }
  __shared__ float kr[rope_max_rot_dim], vr[rope_max_rot_dim], red[block_size];
  const std::int64_t slot = p.slots[t];
  if (slot < 0) return;  // uniform: a padding token caches nothing
  const int kvh = int(blockIdx.y) - q_groups, half = int(p.rot_dim / 2), hd = int(p.cache.head_dim);
  const std::int64_t row_len = p.cache.n_kv_heads * hd;
  const float* k = p.k + t * (p.k_stride ? p.k_stride : row_len) + std::int64_t(kvh) * hd;
  const float* v = p.v + t * (p.v_stride ? p.v_stride : row_len) + std::int64_t(kvh) * hd;
  __shared__ float k_sc, v_sc;  // this head's norm scales, where the op has k_norm (v_norm)
  if (p.k_norm || p.v_norm) {
    if (threadIdx.x < gpu::warp_size) {
      const float scale = p.k_norm ? head_scale(k, hd, p.norm_eps, int(threadIdx.x)) : 1.f;
      const float v_scale = p.v_norm ? head_scale(v, hd, p.norm_eps, int(threadIdx.x)) : 1.f;
      if (threadIdx.x == 0) k_sc = scale, v_sc = v_scale;
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < half; i += block_size) {
    double s, c;
    angle(p, t, i, s, c);
    int a, b;
    pair_index(p.style, i, half, a, b);
    rotate(normed(k, a, k_sc, p.k_norm), normed(k, b, k_sc, p.k_norm), s, c, kr[a], kr[b]);
  }
  float ka = 0.f, va = 0.f;
  for (int e = threadIdx.x; e < hd; e += block_size) {
    if (e >= p.rot_dim) kr[e] = normed(k, e, k_sc, p.k_norm);
    vr[e] = p.v_norm ? v[e] * v_sc : v[e];
    va = kv_amax_step(va, vr[e]);
  }
  __syncthreads();  // kr complete
  for (int e = threadIdx.x; e < hd; e += block_size) ka = kv_amax_step(ka, kr[e]);
  const float k_scale = kv_scale_of(block_amax(ka, red), T);
  const float v_scale = kv_scale_of(block_amax(va, red), T);
  const float k_inv = kv_inv_scale(k_scale), v_inv = kv_inv_scale(v_scale);
  const std::int64_t row = slot * p.cache.n_kv_heads + kvh;
  auto* kc = static_cast<std::uint8_t*>(p.cache.k) + row * hd;
  auto* vc = static_cast<std::uint8_t*>(p.cache.v) + row * hd;
  for (int e = threadIdx.x; e < hd; e += block_size) {
    kc[e] = kv_encode(kr[e], k_inv, T);
    vc[e] = kv_encode(vr[e], v_inv, T);
  }
  if (threadIdx.x == 0) {
    p.cache.k_scales[row] = k_scale;
    p.cache.v_scales[row] = v_scale;
  }
}

}  // namespace

hipError_t launch_rope_kv_write(const rope_kv_write_params& p, hipStream_t stream) {
  if (p.n_tokens == 0) return hipSuccess;
  const std::int64_t hd = p.cache.head_dim;
  if (p.n_tokens < 0 || p.n_tokens > 0x7fffffff || p.n_heads <= 0 || p.cache.n_kv_heads <= 0 || hd <= 0 ||
      p.rot_dim < 0 || p.rot_dim % 2 != 0 || p.rot_dim > hd || p.rot_dim > rope_max_rot_dim ||
      (p.rot_dim > 0 && p.angles == nullptr) || (p.q_scales != nullptr && p.rot_dim != hd)) {
    return hipErrorInvalidValue;
  }
  const std::int64_t kv_row = p.cache.n_kv_heads * hd;
  if ((p.k_stride != 0 && p.k_stride < kv_row) || (p.v_stride != 0 && p.v_stride < kv_row) ||
      (p.q_in != nullptr && (p.q_in_stride < p.n_heads * (p.q_in_head_stride ? p.q_in_head_stride : hd) ||
                             (p.q_in_head_stride != 0 && p.q_in_head_stride < hd)))) {
    return hipErrorInvalidValue;
  }
  const int group = heads_per_block(p.rot_dim / 2);
  if (kv_is_8bit(p.cache.dtype)) {
    if (hd > rope_max_rot_dim || p.cache.k_scales == nullptr || p.cache.v_scales == nullptr) return hipErrorInvalidValue;
    const std::int64_t q_groups = (p.n_heads + group - 1) / group, groups = q_groups + (p.q_only ? 0 : p.cache.n_kv_heads);
    if (groups > 65535) return hipErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(p.n_tokens), static_cast<unsigned>(groups));
    if (p.cache.dtype == kv_dtype::fp8) {
      gpu::launch_dependent(rope_kv_write8_kernel<kv_dtype::fp8>, grid, dim3(block_size), stream, p, group, int(q_groups));
    } else {
      gpu::launch_dependent(rope_kv_write8_kernel<kv_dtype::int8>, grid, dim3(block_size), stream, p, group, int(q_groups));
    }
    return hipGetLastError();
  }
  const std::int64_t groups = (p.n_heads + (p.q_only ? 0 : p.cache.n_kv_heads) + group - 1) / group;
  if (groups > 65535 || p.n_heads > 0x7fffffff) return hipErrorInvalidValue;
  gpu::launch_dependent(rope_kv_write_kernel, dim3(static_cast<unsigned>(p.n_tokens), static_cast<unsigned>(groups)),
                        dim3(block_size), stream, p, group);
  return hipGetLastError();
}

hipError_t launch_rope_angles(const rope_angles_params& p, hipStream_t stream) {
  if (p.n_tokens < 0 || p.rot_dim < 0 || p.rot_dim % 2 != 0 || p.rot_dim > rope_max_rot_dim ||
      (p.n_tokens > 0 && p.rot_dim > 0 && (p.out == nullptr || p.positions == nullptr)) ||
      (p.q_scales != nullptr && p.attn_temp_floor <= 0)) {
    return hipErrorInvalidValue;
  }
  const std::int64_t n = p.n_tokens * (p.rot_dim / 2);
  if (n == 0) return hipSuccess;
  if (n > std::int64_t(0x7fffffff) * block_size / 2) return hipErrorInvalidValue;
  gpu::launch_dependent(rope_angles_kernel, dim3(static_cast<unsigned>((n + block_size - 1) / block_size)),
                        dim3(block_size), stream, p);
  return hipGetLastError();
}

}  // namespace anvil::kernels
