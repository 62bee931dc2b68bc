// The RMSNorm of one row on the device, for the kernels that compute it: the fused residual norm's
// register path (kernels/rms_norm_residual.hip) and the GEMVs that norm their own input
// (kernels/gemv.hip, gemv_norm_input). Both reach the same floats bit for bit:
//   - a row of n4 <= 256 float4s is summed as the norm's register path sums it: one float4 a
//     thread in a block of 256 threads, each float4's squares added in one fixed order (sum_sq4),
//     the threads' sums meeting in block_reduce_sum's order
//     (a butterfly in each warp, then one over the warps' sums);
//   - y = (v * scale) * g element by element, each product rounded.
// A block of another size stands in for that block: its thread t takes the norm's threads t,
// t + Threads, ... and reduces each one's warp apart, so the warps' sums are the same numbers.
// Device code only: included by .hip files, never by host C++.
#pragma once

#include "kernels/gpu_quant_dot.h"
#include "kernels/gpu_runtime.h"

namespace anvil::kernels::norm_device {

// v.x^2 + v.y^2 + v.z^2 + v.w^2 as fused multiply-adds in a fixed order: y^2 rounded, then x^2,
// z^2 and w^2 added each in one rounding (what nvcc made of the plain expression before this
// was spelled out, so the norm's results did not move).
__device__ __forceinline__ float sum_sq4(float4 v) {
  return fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.x, v.x, gpu::mul_rn(v.y, v.y))));
}

// (v * scale) * g element by element, every product rounded.
__device__ __forceinline__ float4 scaled4(float4 v, float scale, float4 g) {
  return make_float4(gpu::mul_rn(gpu::mul_rn(v.x, scale), g.x), gpu::mul_rn(gpu::mul_rn(v.y, scale), g.y),
                     gpu::mul_rn(gpu::mul_rn(v.z, scale), g.z), gpu::mul_rn(gpu::mul_rn(v.w, scale), g.w));
}

// Rows of up to max_cols floats: the register path's blocks of them are reg_block threads of one
// float4 each (wider rows go to blocks of 1024 threads there, which the GEMVs do not stand in for:
// holding a quarter of such a row a thread costs the GEMV the registers its loads need).
inline constexpr int reg_block = 256;
inline constexpr int max_cols = 4 * reg_block;

// The norm's threads block thread t stands in for: t + m * Threads for m < slots<Threads>.
template <int Threads>
inline constexpr int slots = (reg_block + Threads - 1) / Threads;

// The gain g of the row's float4s this thread takes: a model constant, loaded before the kernel
// waits for the one before it (gpu_runtime.h).
template <int Threads>
__device__ __forceinline__ void load_gain(const float* weight, int cols, float4 (&g)[slots<Threads>]) {
  const int n4 = cols / 4;
#pragma unroll
  for (int m = 0; m < slots<Threads>; ++m) {
    const int j = int(threadIdx.x) + m * Threads;
    g[m] = j < n4 ? reinterpret_cast<const float4*>(weight)[j] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// The RMSNorm of h (+ delta, when not null) with gain g (load_gain), rounded to 8 bits in the
// GEMV's form (gpu_quant::quantize_x8) into xq[cols] and ds[cols / 16] — shared memory the whole
// block reads after the barrier this ends with. Every thread of the block calls it. With h_out,
// h (+ delta) is also stored there. cols % 32 == 0, cols <= max_cols, rows 16-byte aligned.
template <int Threads>
__device__ void rms_norm_x8_row(const float* h, const float* delta, const float4 (&g)[slots<Threads>], float* h_out,
                                int cols, float eps, gpu_quant::i8* xq, float2* ds) {
  static_assert(Threads % 32 == 0 && Threads <= 1024, "whole warps");
  constexpr int block = reg_block;
  __shared__ float partial[block / 32];
  const int n4 = cols / 4, tid = int(threadIdx.x), lane = tid % gpu::warp_size;
  const auto* h4 = reinterpret_cast<const float4*>(h);
  const auto* d4 = reinterpret_cast<const float4*>(delta);
  float4 v[slots<Threads>];
#pragma unroll
  for (int m = 0; m < slots<Threads>; ++m) {
    const int j = tid + m * Threads;
    v[m] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (j < n4) {
      v[m] = h4[j];
      if (delta != nullptr) {
        const float4 e = d4[j];
        v[m] = make_float4(v[m].x + e.x, v[m].y + e.y, v[m].z + e.z, v[m].w + e.w);
      }
    }
    const float s = gpu::warp_reduce_sum(sum_sq4(v[m]));
    if (lane == 0 && j < block) partial[j / gpu::warp_size] = s;
  }
  __syncthreads();
  const float sum = gpu::warp_reduce_sum(lane < block / gpu::warp_size ? partial[lane] : 0.f);
  const float scale = rsqrtf(sum / float(cols) + eps);
  auto* out4 = reinterpret_cast<float4*>(h_out);
#pragma unroll
  for (int m = 0; m < slots<Threads>; ++m) {
    const int j = tid + m * Threads;  // every lane of a warp rounds its group together
    const bool valid = j < n4;
    gpu_quant::quantize_x8(scaled4(v[m], scale, g[m]), 4 * std::int64_t(j), valid, xq, ds);
    if (out4 != nullptr && valid) out4[j] = v[m];
  }
  __syncthreads();
}

}  // namespace anvil::kernels::norm_device
