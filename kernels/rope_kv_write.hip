// RoPE + KV write: one block per token. The block first computes cos/sin of the token's
// rot_dim/2 angles into shared memory — in double, like rope_ref, so a position of 100k does not
// lose the angle to float rounding; it is only rot_dim/2 values per token, shared by every head —
// then rotates the pairs of all q heads in place, rotates k into the f16 cache and copies v there.
#include "kernels/rope_kv_write.h"

namespace anvil::kernels {
namespace {

constexpr int block_size = 128;

__device__ __forceinline__ void pair_index(rope_style style, int i, int half, int& a, int& b) {
  a = style == rope_style::normal ? 2 * i : i;
  b = style == rope_style::normal ? 2 * i + 1 : i + half;
}

__global__ void __launch_bounds__(block_size) rope_kv_write_kernel(rope_kv_write_params p) {
  __shared__ double cos_s[rope_max_rot_dim / 2], sin_s[rope_max_rot_dim / 2];
  const std::int64_t t = blockIdx.x;
  const int half = int(p.rot_dim / 2), hd = int(p.cache.head_dim);
  const double pos = double(p.positions[t]) * double(p.freq_scale);
  for (int i = threadIdx.x; i < half; i += block_size) {
    double theta = pos * pow(double(p.freq_base), -2.0 * double(i) / double(p.rot_dim));
    if (p.freq_factors) theta /= double(p.freq_factors[i]);
    double s, c;
    sincos(theta, &s, &c);
    cos_s[i] = c;
    sin_s[i] = s;
  }
  __syncthreads();

  // q: every (head, pair) in place; the dimensions past rot_dim stay as they are.
  float* q = p.q + t * p.n_heads * hd;
  for (std::int64_t e = threadIdx.x; e < p.n_heads * half; e += block_size) {
    const int h = int(e / half), i = int(e % half);
    int a, b;
    pair_index(p.style, i, half, a, b);
    float* x = q + std::int64_t(h) * hd;
    const double x0 = x[a], x1 = x[b], c = cos_s[i], s = sin_s[i];
    x[a] = float(x0 * c - x1 * s);
    x[b] = float(x0 * s + x1 * c);
  }

  const std::int64_t slot = p.slots[t];
  if (slot < 0) return;  // a padding token: q rotated, nothing cached (uniform over the block)
  const std::int64_t row = p.cache.n_kv_heads * hd;
  const float* k = p.k + t * row;
  const float* v = p.v + t * row;
  gpu::half_bits* kc = p.cache.k + slot * row;
  gpu::half_bits* vc = p.cache.v + slot * row;
  for (std::int64_t e = threadIdx.x; e < p.cache.n_kv_heads * half; e += block_size) {
    const int h = int(e / half), i = int(e % half);
    int a, b;
    pair_index(p.style, i, half, a, b);
    const std::int64_t base = std::int64_t(h) * hd;
    const double x0 = k[base + a], x1 = k[base + b], c = cos_s[i], s = sin_s[i];
    // Round to float first, as rope_ref stores float, then to f16.
    kc[base + a] = gpu::float_to_half(float(x0 * c - x1 * s));
    kc[base + b] = gpu::float_to_half(float(x0 * s + x1 * c));
  }
  const int pass = hd - int(p.rot_dim);
  for (std::int64_t e = threadIdx.x; e < p.cache.n_kv_heads * pass; e += block_size) {
    const std::int64_t idx = (e / pass) * hd + p.rot_dim + e % pass;
    kc[idx] = gpu::float_to_half(k[idx]);
  }
  for (std::int64_t e = threadIdx.x; e < row; e += block_size) vc[e] = gpu::float_to_half(v[e]);
}

}  // namespace

hipError_t launch_rope_kv_write(const rope_kv_write_params& p, hipStream_t stream) {
  if (p.n_tokens == 0) return hipSuccess;
  const std::int64_t hd = p.cache.head_dim;
  if (p.n_tokens < 0 || p.n_tokens > 0x7fffffff || p.n_heads <= 0 || p.cache.n_kv_heads <= 0 || hd <= 0 ||
      p.rot_dim < 0 || p.rot_dim % 2 != 0 || p.rot_dim > hd || p.rot_dim > rope_max_rot_dim) {
    return hipErrorInvalidValue;
  }
  rope_kv_write_kernel<<<dim3(static_cast<unsigned>(p.n_tokens)), block_size, 0, stream>>>(p);
  return hipGetLastError();
}

}  // namespace anvil::kernels
