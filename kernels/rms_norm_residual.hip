// Fused residual add + RMSNorm: one block per row. Each thread adds delta (or the weighted sum of
// the row's experts' rows, delta_at) to its strided slice of h, writes h back and accumulates the
// squares; after the block reduction it re-reads only what it wrote itself (no barrier needed for
// that) and writes y. 16-byte accesses when all rows are 16-byte aligned.
//
// Rows of up to 16384 aligned floats (every model we serve) take the register path instead: each
// thread loads its (at most four) float4s at once, keeps them in registers across the reduction
// and writes h and y from there — one round trip to memory instead of one per strided step,
// which is what a decode step's single row waits on. That path can also write y rounded to 8
// bits for the quantized GEMV (gpu_quant_dot.h quantize_x8).
//
// With delta_weight, both paths first reduce delta's squares (a pass of their own over delta in
// the strided kernel; the registers' values in the register one) and add the normed delta. The
// sum is multiplied by h_scale (1: exactly the sum) before it is stored and normed.
#include "kernels/rms_norm_residual.h"

#include "kernels/gpu_quant_dot.h"
#include "kernels/norm_device.h"

namespace anvil::kernels {
namespace {

constexpr int block_size = 256;

// Row `row`'s delta at float i (D = float) or float4 i (D = float4): delta's own row, or with
// pair_weights its k experts' rows summed in combine's order (moe.hip combine_kernel).
template <class D>
__device__ __forceinline__ D delta_at(const rms_norm_residual_params& p, std::int64_t row, std::int64_t i) {
  const std::int64_t n = p.cols / std::int64_t(sizeof(D) / sizeof(float));
  const D* d = reinterpret_cast<const D*>(p.delta);
  if (p.pair_weights == nullptr) return d[row * n + i];
  const float* w = p.pair_weights + row * p.k;
  if constexpr (sizeof(D) == sizeof(float)) {
    float s = 0.f;
    for (std::int64_t j = 0; j < p.k; ++j) s += w[j] * d[(row * p.k + j) * n + i];
    return s;
  } else {
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (std::int64_t j = 0; j < p.k; ++j) {
      const float4 y = d[(row * p.k + j) * n + i];
      s = make_float4(s.x + w[j] * y.x, s.y + w[j] * y.y, s.z + w[j] * y.z, s.w + w[j] * y.w);
    }
    return s;
  }
}

template <bool Vec4, bool HasDelta>
__global__ void __launch_bounds__(block_size) rms_norm_residual_kernel(rms_norm_residual_params p) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const std::int64_t row = blockIdx.x;
  float* h = p.h + row * p.cols;
  float* y = p.y + row * p.cols;

  // delta normed first (delta_weight; uniform over the block): its scale from its own squares.
  float dscale = 1.f;
  if constexpr (HasDelta) {
    if (p.delta_weight != nullptr) {
      const float* d = p.delta + row * p.cols;
      float dsq = 0.f;
      for (std::int64_t i = threadIdx.x; i < p.cols; i += block_size) dsq += d[i] * d[i];
      dsq = gpu::block_reduce_sum<block_size>(dsq);
      dscale = rsqrtf(dsq / float(p.cols) + p.eps);
    }
  }
  float sum_sq = 0.f;
  if constexpr (Vec4) {
    const std::int64_t n4 = p.cols / 4;
    float4* h4 = reinterpret_cast<float4*>(h);
    const float4* dw4 = reinterpret_cast<const float4*>(p.delta_weight);
    for (std::int64_t i = threadIdx.x; i < n4; i += block_size) {
      float4 v = h4[i];
      if constexpr (HasDelta) {
        float4 e = delta_at<float4>(p, row, i);
        if (dw4 != nullptr) {
          const float4 g = dw4[i];
          e = make_float4(e.x * dscale * g.x, e.y * dscale * g.y, e.z * dscale * g.z, e.w * dscale * g.w);
        }
        v = make_float4(v.x + e.x, v.y + e.y, v.z + e.z, v.w + e.w);
        v = make_float4(v.x * p.h_scale, v.y * p.h_scale, v.z * p.h_scale, v.w * p.h_scale);
        h4[i] = v;
      }
      sum_sq += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (std::int64_t i = threadIdx.x; i < p.cols; i += block_size) {
      float v = h[i];
      if constexpr (HasDelta) {
        const float e = delta_at<float>(p, row, i);
        v += p.delta_weight != nullptr ? e * dscale * p.delta_weight[i] : e;
        v *= p.h_scale;
        h[i] = v;
      }
      sum_sq += v * v;
    }
  }
  sum_sq = gpu::block_reduce_sum<block_size>(sum_sq);
  const float scale = rsqrtf(sum_sq / float(p.cols) + p.eps);

  if constexpr (Vec4) {
    const std::int64_t n4 = p.cols / 4;
    const float4* h4 = reinterpret_cast<const float4*>(h);
    const float4* w4 = reinterpret_cast<const float4*>(p.weight);
    float4* y4 = reinterpret_cast<float4*>(y);
    for (std::int64_t i = threadIdx.x; i < n4; i += block_size) {
      const float4 v = h4[i];
      const float4 g = w4[i];
      y4[i] = make_float4(v.x * scale * g.x, v.y * scale * g.y, v.z * scale * g.z, v.w * scale * g.w);
    }
  } else {
    for (std::int64_t i = threadIdx.x; i < p.cols; i += block_size) y[i] = h[i] * scale * p.weight[i];
  }
}

template <int Block, int N4, bool HasDelta, bool Quant>
__global__ void __launch_bounds__(Block) rms_norm_residual_reg_kernel(rms_norm_residual_params p) {
  const std::int64_t row = blockIdx.x;
  const int n4 = int(p.cols / 4);
  float4* h4 = reinterpret_cast<float4*>(p.h + row * p.cols);
  const float4* w4 = reinterpret_cast<const float4*>(p.weight);
  float4* y4 = reinterpret_cast<float4*>(p.y + row * p.cols);
  // The norm weight is a model constant: loaded before the wait, while the kernel ahead (which
  // wrote h or delta) finishes, so that after the reduction only arithmetic is left.
  float4 g[N4];
#pragma unroll
  for (int k = 0; k < N4; ++k) {
    const int i = int(threadIdx.x) + k * Block;
    g[k] = i < n4 ? w4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  float4 v[N4];
  if constexpr (HasDelta) {
    float4 e[N4];
    float dsq = 0.f;
#pragma unroll
    for (int k = 0; k < N4; ++k) {
      const int i = int(threadIdx.x) + k * Block;
      v[k] = i < n4 ? h4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
      e[k] = i < n4 ? delta_at<float4>(p, row, i) : make_float4(0.f, 0.f, 0.f, 0.f);
      dsq += e[k].x * e[k].x + e[k].y * e[k].y + e[k].z * e[k].z + e[k].w * e[k].w;
    }
    // delta normed first (delta_weight; uniform over the block).
    const float4* dw4 = reinterpret_cast<const float4*>(p.delta_weight);
    const float dscale = dw4 != nullptr ? rsqrtf(gpu::block_reduce_sum<Block>(dsq) / float(p.cols) + p.eps) : 1.f;
#pragma unroll
    for (int k = 0; k < N4; ++k) {
      const int i = int(threadIdx.x) + k * Block;
      if (dw4 != nullptr && i < n4) {
        const float4 dg = dw4[i];
        e[k] = make_float4(e[k].x * dscale * dg.x, e[k].y * dscale * dg.y, e[k].z * dscale * dg.z, e[k].w * dscale * dg.w);
      }
      v[k] = make_float4(v[k].x + e[k].x, v[k].y + e[k].y, v[k].z + e[k].z, v[k].w + e[k].w);
      v[k] = make_float4(v[k].x * p.h_scale, v[k].y * p.h_scale, v[k].z * p.h_scale, v[k].w * p.h_scale);
    }
  } else {
#pragma unroll
    for (int k = 0; k < N4; ++k) {
      const int i = int(threadIdx.x) + k * Block;
      v[k] = i < n4 ? h4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  // The squares and the products below as kernels/norm_device.h rounds them: the GEMVs that norm
  // their own input reach the same floats.
  float sum_sq = 0.f;
#pragma unroll
  for (int k = 0; k < N4; ++k) {
    const int i = int(threadIdx.x) + k * Block;
    if constexpr (HasDelta) {
      if (i < n4) h4[i] = v[k];
    }
    sum_sq = k == 0 ? norm_device::sum_sq4(v[k]) : gpu::add_rn(sum_sq, norm_device::sum_sq4(v[k]));
  }
  sum_sq = gpu::block_reduce_sum<Block>(sum_sq);
  const float scale = rsqrtf(sum_sq / float(p.cols) + p.eps);
#pragma unroll
  for (int k = 0; k < N4; ++k) {
    const int i = int(threadIdx.x) + k * Block;
    const bool valid = i < n4;
    const float4 y = norm_device::scaled4(v[k], scale, g[k]);
    if (valid) y4[i] = y;
    if constexpr (Quant) {
      // Uniform over groups of 8 lanes: n4 % 8 == 0 when quantizing (cols % 32 == 0).
      gpu_quant::quantize_x8(y, 4 * std::int64_t(i), valid, p.yq + row * p.cols,
                             reinterpret_cast<float2*>(p.yq_scales) + row * (p.cols / 16));
    }
  }
}

using gpu::aligned16;

template <int Block, int N4, bool HasDelta>
void launch_reg(const rms_norm_residual_params& p, hipStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.rows));
  if (p.yq) {
    gpu::launch_dependent(rms_norm_residual_reg_kernel<Block, N4, HasDelta, true>, grid, dim3(Block), stream, p);
  } else {
    gpu::launch_dependent(rms_norm_residual_reg_kernel<Block, N4, HasDelta, false>, grid, dim3(Block), stream, p);
  }
}

template <bool HasDelta>
void launch(const rms_norm_residual_params& p, bool vec4, hipStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.rows));
  const std::int64_t n4 = p.cols / 4;
  if (vec4 && n4 <= 256) return launch_reg<norm_device::reg_block, 1, HasDelta>(p, stream);  // as the GEMVs norm
  if (vec4 && n4 <= 1024) return launch_reg<1024, 1, HasDelta>(p, stream);
  if (vec4 && n4 <= 2048) return launch_reg<1024, 2, HasDelta>(p, stream);
  if (vec4 && n4 <= 4096) return launch_reg<1024, 4, HasDelta>(p, stream);
  static_assert(rms_norm_residual_max_x8_cols == 4 * 4096, "the widest register path above");
  if (vec4) {
    gpu::launch_dependent(rms_norm_residual_kernel<true, HasDelta>, grid, dim3(block_size), stream, p);
  } else {
    gpu::launch_dependent(rms_norm_residual_kernel<false, HasDelta>, grid, dim3(block_size), stream, p);
  }
}

}  // namespace

hipError_t launch_rms_norm_residual(const rms_norm_residual_params& p, hipStream_t stream) {
  if (p.rows == 0) return hipSuccess;
  if (p.rows < 0 || p.rows > 0x7fffffff || p.cols <= 0) return hipErrorInvalidValue;
  if (p.pair_weights != nullptr && (p.delta == nullptr || p.k < 1 || p.k > 64)) return hipErrorInvalidValue;
  if (p.delta_weight != nullptr && (p.delta == nullptr || p.pair_weights != nullptr)) return hipErrorInvalidValue;
  const bool vec4 = p.cols % 4 == 0 && aligned16(p.h) && aligned16(p.y) && aligned16(p.weight) &&
                    (p.delta == nullptr || aligned16(p.delta)) && (p.delta_weight == nullptr || aligned16(p.delta_weight));
  if (p.yq != nullptr &&
      (!vec4 || p.cols % 32 != 0 || p.cols > rms_norm_residual_max_x8_cols || p.yq_scales == nullptr ||
       reinterpret_cast<std::uintptr_t>(p.yq) % 4 != 0 || reinterpret_cast<std::uintptr_t>(p.yq_scales) % 8 != 0)) {
    return hipErrorInvalidValue;
  }
  if (p.delta) {
    launch<true>(p, vec4, stream);
  } else {
    launch<false>(p, vec4, stream);
  }
  return hipGetLastError();
}

}  // namespace anvil::kernels
