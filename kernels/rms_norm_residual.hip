// Fused residual add + RMSNorm: one block per row. Each thread adds delta to its strided slice of
// h, writes h back and accumulates the squares; after the block reduction it re-reads only what
// it wrote itself (no barrier needed for that) and writes y. 16-byte accesses when all rows are
// 16-byte aligned.
#include "kernels/rms_norm_residual.h"

namespace anvil::kernels {
namespace {

constexpr int block_size = 256;

template <bool Vec4, bool HasDelta>
__global__ void __launch_bounds__(block_size) rms_norm_residual_kernel(rms_norm_residual_params p) {
  const std::int64_t row = blockIdx.x;
  float* h = p.h + row * p.cols;
  const float* d = p.delta + (HasDelta ? row * p.cols : 0);
  float* y = p.y + row * p.cols;

  float sum_sq = 0.f;
  if constexpr (Vec4) {
    const std::int64_t n4 = p.cols / 4;
    float4* h4 = reinterpret_cast<float4*>(h);
    for (std::int64_t i = threadIdx.x; i < n4; i += block_size) {
      float4 v = h4[i];
      if constexpr (HasDelta) {
        const float4 e = reinterpret_cast<const float4*>(d)[i];
        v = make_float4(v.x + e.x, v.y + e.y, v.z + e.z, v.w + e.w);
        h4[i] = v;
      }
      sum_sq += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (std::int64_t i = threadIdx.x; i < p.cols; i += block_size) {
      float v = h[i];
      if constexpr (HasDelta) {
        v += d[i];
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

bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }

template <bool HasDelta>
void launch(const rms_norm_residual_params& p, bool vec4, hipStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.rows));
  if (vec4) {
    rms_norm_residual_kernel<true, HasDelta><<<grid, block_size, 0, stream>>>(p);
  } else {
    rms_norm_residual_kernel<false, HasDelta><<<grid, block_size, 0, stream>>>(p);
  }
}

}  // namespace

hipError_t launch_rms_norm_residual(const rms_norm_residual_params& p, hipStream_t stream) {
  if (p.rows == 0) return hipSuccess;
  if (p.rows < 0 || p.rows > 0x7fffffff || p.cols <= 0) return hipErrorInvalidValue;
  const bool vec4 = p.cols % 4 == 0 && aligned16(p.h) && aligned16(p.y) && aligned16(p.weight) &&
                    (p.delta == nullptr || aligned16(p.delta));
  if (p.delta) {
    launch<true>(p, vec4, stream);
  } else {
    launch<false>(p, vec4, stream);
  }
  return hipGetLastError();
}

}  // namespace anvil::kernels
