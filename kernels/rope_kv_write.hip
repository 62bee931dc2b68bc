// RoPE + KV write. A 2-D grid: x over tokens, y over groups of heads — the token's q heads, then
// its kv heads — so that one token's work spreads over many multiprocessors (a decode step has
// one token per sequence; a block per token left a whole layer's rotation to one multiprocessor).
// Each thread takes (head, pair) elements and computes its pair's angle itself — in double, like
// rope_ref, so a position of 100k does not lose the angle to float rounding — then rotates q in
// place, or rotates k into the f16 cache. A block holding kv heads also stores their dimensions
// past rot_dim and copies their v into the cache.
#include "kernels/rope_kv_write.h"

namespace anvil::kernels {
namespace {

constexpr int block_size = 128;

__device__ __forceinline__ void pair_index(rope_style style, int i, int half, int& a, int& b) {
  a = style == rope_style::normal ? 2 * i : i;
  b = style == rope_style::normal ? 2 * i + 1 : i + half;
}

// Heads per block: enough pairs to give every thread one (at least one head).
int heads_per_block(std::int64_t half) { return half > 0 && half < block_size ? int(block_size / half) : 1; }

__global__ void __launch_bounds__(block_size) rope_kv_write_kernel(rope_kv_write_params p, int group) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const std::int64_t t = blockIdx.x;
  const int half = int(p.rot_dim / 2), hd = int(p.cache.head_dim);
  const int n_q = int(p.n_heads), n_kv = int(p.cache.n_kv_heads);
  const int h0 = int(blockIdx.y) * group, h1 = min(h0 + group, n_q + n_kv);
  const std::int64_t slot = p.slots[t];  // < 0: a padding token, q rotated, nothing cached
  const std::int64_t row = std::int64_t(n_kv) * hd;
  const double pos = double(p.positions[t]) * double(p.freq_scale);
  float* q = p.q + t * p.n_heads * hd;
  const float* k = p.k + t * row;
  const float* v = p.v + t * row;
  gpu::half_bits* kc = p.cache.k + (slot < 0 ? 0 : slot) * row;
  gpu::half_bits* vc = p.cache.v + (slot < 0 ? 0 : slot) * row;

  for (int e = threadIdx.x; e < (h1 - h0) * half; e += block_size) {
    const int h = h0 + e / half, i = e % half;
    if (h >= n_q && slot < 0) continue;
    double theta = pos * pow(double(p.freq_base), -2.0 * double(i) / double(p.rot_dim));
    if (p.freq_factors) theta /= double(p.freq_factors[i]);
    double s, c;
    sincos(theta, &s, &c);
    int a, b;
    pair_index(p.style, i, half, a, b);
    if (h < n_q) {
      float* x = q + std::int64_t(h) * hd;
      const double x0 = x[a], x1 = x[b];
      x[a] = float(x0 * c - x1 * s);
      x[b] = float(x0 * s + x1 * c);
    } else {
      const std::int64_t base = std::int64_t(h - n_q) * hd;
      const double x0 = k[base + a], x1 = k[base + b];
      // Round to float first, as rope_ref stores float, then to f16.
      kc[base + a] = gpu::float_to_half(float(x0 * c - x1 * s));
      kc[base + b] = gpu::float_to_half(float(x0 * s + x1 * c));
    }
  }
  if (slot < 0) return;
  const int pass = hd - int(p.rot_dim);
  for (int h = max(h0, n_q); h < h1; ++h) {
    const std::int64_t base = std::int64_t(h - n_q) * hd;
    for (int e = threadIdx.x; e < pass; e += block_size) {
      kc[base + p.rot_dim + e] = gpu::float_to_half(k[base + p.rot_dim + e]);
    }
    for (int e = threadIdx.x; e < hd; e += block_size) vc[base + e] = gpu::float_to_half(v[base + e]);
  }
}

}  // namespace

hipError_t launch_rope_kv_write(const rope_kv_write_params& p, hipStream_t stream) {
  if (p.n_tokens == 0) return hipSuccess;
  const std::int64_t hd = p.cache.head_dim;
  if (p.n_tokens < 0 || p.n_tokens > 0x7fffffff || p.n_heads <= 0 || p.cache.n_kv_heads <= 0 || hd <= 0 ||
      p.rot_dim < 0 || p.rot_dim % 2 != 0 || p.rot_dim > hd || p.rot_dim > rope_max_rot_dim) {
    return hipErrorInvalidValue;
  }
  const int group = heads_per_block(p.rot_dim / 2);
  const std::int64_t groups = (p.n_heads + p.cache.n_kv_heads + group - 1) / group;
  if (groups > 65535 || p.n_heads > 0x7fffffff) return hipErrorInvalidValue;
  gpu::launch_dependent(rope_kv_write_kernel, dim3(static_cast<unsigned>(p.n_tokens), static_cast<unsigned>(groups)),
                        dim3(block_size), stream, p, group);
  return hipGetLastError();
}

}  // namespace anvil::kernels
