// RMSNorm kernel: one block per row (short rows, such as qwen3's Q/K norm over head_dim: one
// warp per row, so a block does not idle most of its threads). Each thread accumulates the squares of a strided slice of
// the row (16-byte loads when the row is 16-byte aligned), the block reduces them, then every
// thread writes its slice scaled. The second read of x mostly hits L1/L2 (a row is a few KB).
#include "kernels/rms_norm.h"

namespace anvil::kernels {
namespace {

constexpr int block_size = 256;

template <bool Vec4>
__global__ void __launch_bounds__(block_size) rms_norm_kernel(rms_norm_params p) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const std::int64_t row = blockIdx.x;
  const float* x = p.x + rms_norm_row_at(p, row);
  float* y = p.y + rms_norm_row_at(p, row);
  const float* w = p.weight;

  float sum_sq = 0.f;
  if constexpr (Vec4) {
    const std::int64_t n4 = p.cols / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (std::int64_t i = threadIdx.x; i < n4; i += block_size) {
      const float4 v = x4[i];
      sum_sq += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (std::int64_t i = threadIdx.x; i < p.cols; i += block_size) sum_sq += x[i] * x[i];
  }
  sum_sq = gpu::block_reduce_sum<block_size>(sum_sq);
  const float scale = rsqrtf(sum_sq / float(p.cols) + p.eps);

  if constexpr (Vec4) {
    const std::int64_t n4 = p.cols / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    float4* y4 = reinterpret_cast<float4*>(y);
    for (std::int64_t i = threadIdx.x; i < n4; i += block_size) {
      const float4 v = x4[i];
      const float4 g = w4[i];
      y4[i] = make_float4(v.x * scale * g.x, v.y * scale * g.y, v.z * scale * g.z, v.w * scale * g.w);
    }
  } else {
    for (std::int64_t i = threadIdx.x; i < p.cols; i += block_size) y[i] = x[i] * scale * w[i];
  }
}

// One warp per row, for rows of at most short_row_max columns (Q/K norm: rows = tokens * heads).
constexpr std::int64_t short_row_max = 512;

// A block takes rows_per_block rows (fixed, so the host need not know the warp size); its warps
// take them in turn (8 warps of 32 one each, 4 warps of 64 two each).
constexpr int rows_per_block = block_size / 32;

__global__ void __launch_bounds__(block_size) rms_norm_short_rows_kernel(rms_norm_params p) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  constexpr int warps = block_size / gpu::warp_size;
  const int lane = threadIdx.x % gpu::warp_size;
  for (int r = threadIdx.x / gpu::warp_size; r < rows_per_block; r += warps) {
    const std::int64_t row = std::int64_t(blockIdx.x) * rows_per_block + r;
    if (row >= p.rows) break;  // uniform across the warp: the shuffles stay convergent
    const float* x = p.x + rms_norm_row_at(p, row);
    float* y = p.y + rms_norm_row_at(p, row);
    float v[short_row_max / 32];
    float sum_sq = 0.f;
#pragma unroll
    for (int j = 0; j < short_row_max / 32; ++j) {
      const std::int64_t c = lane + std::int64_t(j) * gpu::warp_size;
      v[j] = c < p.cols ? x[c] : 0.f;
      sum_sq += v[j] * v[j];
    }
    sum_sq = gpu::warp_reduce_sum(sum_sq);
    const float scale = rsqrtf(sum_sq / float(p.cols) + p.eps);
#pragma unroll
    for (int j = 0; j < short_row_max / 32; ++j) {
      const std::int64_t c = lane + std::int64_t(j) * gpu::warp_size;
      if (c < p.cols) y[c] = v[j] * scale * p.weight[c];
    }
  }
}

using gpu::aligned16;

}  // namespace

hipError_t launch_rms_norm(const rms_norm_params& p, hipStream_t stream) {
  if (p.rows == 0) return hipSuccess;
  if (p.rows < 0 || p.rows > 0x7fffffff || p.cols <= 0 || p.group_rows < 0 ||
      (p.group_rows > 0 && p.group_stride < p.group_rows * p.cols)) {
    return hipErrorInvalidValue;
  }
  if (p.cols <= short_row_max && p.rows > 1) {
    const dim3 grid(static_cast<unsigned>((p.rows + rows_per_block - 1) / rows_per_block));
    gpu::launch_dependent(rms_norm_short_rows_kernel, grid, dim3(block_size), stream, p);
    return hipGetLastError();
  }
  const bool vec4 = p.cols % 4 == 0 && p.group_stride % 4 == 0 && aligned16(p.x) && aligned16(p.y) && aligned16(p.weight);
  const dim3 grid(static_cast<unsigned>(p.rows));
  if (vec4) {
    gpu::launch_dependent(rms_norm_kernel<true>, grid, dim3(block_size), stream, p);
  } else {
    gpu::launch_dependent(rms_norm_kernel<false>, grid, dim3(block_size), stream, p);
  }
  return hipGetLastError();
}

}  // namespace anvil::kernels
