// SwiGLU: out = silu(gate) * up (or gpt-oss's clamped variant, kernels/swiglu.h), elementwise over strided rows. A 2-D grid: y over rows (in
// chunks when there are more than the grid allows), x over the columns of a row, so the row
// arithmetic is done once per thread and no division by cols is needed. With yq set, each output
// is also rounded to 8 bits for the quantized GEMV (gpu_quant_dot.h quantize_x8): 256 threads
// per block keep the 32-element groups inside a block.
#include "kernels/swiglu.h"

#include <algorithm>

#include "kernels/glu_device.h"
#include "kernels/gpu_quant_dot.h"

namespace anvil::kernels {
namespace {

constexpr int block_size = 256;
constexpr unsigned max_grid_y = 65535;

template <bool Vec4, bool Quant>
__global__ void __launch_bounds__(block_size) swiglu_kernel(swiglu_rows_params p) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const std::int64_t n = Vec4 ? p.cols / 4 : p.cols;
  const std::int64_t c = std::int64_t(blockIdx.x) * block_size + threadIdx.x;
  if (!Quant && c >= n) return;  // quantizing lanes stay for quantize_x8's shuffles
  const bool valid = c < n;
  for (std::int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const float* g = p.gate + r * p.gate_stride;
    const float* u = p.up + r * p.up_stride;
    float* o = p.out + r * p.out_stride;
    if constexpr (Vec4) {
      float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
      if (valid) {
        const float4 a = reinterpret_cast<const float4*>(g)[c];
        const float4 b = reinterpret_cast<const float4*>(u)[c];
        const float lim = p.limit, al = p.alpha;
        const glu_activation act = p.act;
        y = make_float4(glu_product(a.x, b.x, lim, al, act), glu_product(a.y, b.y, lim, al, act),
                        glu_product(a.z, b.z, lim, al, act), glu_product(a.w, b.w, lim, al, act));
        reinterpret_cast<float4*>(o)[c] = y;
      }
      if constexpr (Quant) {
        gpu_quant::quantize_x8(y, 4 * c, valid, p.yq + r * p.cols, reinterpret_cast<float2*>(p.yq_scales) + r * (p.cols / 16));
      }
    } else {
      o[c] = glu_product(g[c], u[c], p.limit, p.alpha, p.act);
    }
  }
}

using gpu::aligned16;

}  // namespace

hipError_t launch_swiglu(const swiglu_rows_params& p, hipStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return hipSuccess;
  if (p.rows < 0 || p.cols < 0 || p.gate_stride < p.cols || p.up_stride < p.cols || p.out_stride < p.cols ||
      (p.act != glu_activation::silu && p.limit > 0)) {
    return hipErrorInvalidValue;
  }
  const bool vec4 = p.cols % 4 == 0 && p.gate_stride % 4 == 0 && p.up_stride % 4 == 0 && p.out_stride % 4 == 0 &&
                    aligned16(p.gate) && aligned16(p.up) && aligned16(p.out);
  const std::int64_t n = vec4 ? p.cols / 4 : p.cols;
  const std::int64_t blocks_x = (n + block_size - 1) / block_size;
  if (blocks_x > 0x7fffffff) return hipErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(std::min<std::int64_t>(p.rows, max_grid_y)));
  if (p.yq != nullptr) {
    if (!vec4 || p.cols % 32 != 0 || p.yq_scales == nullptr || reinterpret_cast<std::uintptr_t>(p.yq) % 4 != 0 ||
        reinterpret_cast<std::uintptr_t>(p.yq_scales) % 8 != 0) {
      return hipErrorInvalidValue;
    }
    gpu::launch_dependent(swiglu_kernel<true, true>, grid, dim3(block_size), stream, p);
  } else if (vec4) {
    gpu::launch_dependent(swiglu_kernel<true, false>, grid, dim3(block_size), stream, p);
  } else {
    gpu::launch_dependent(swiglu_kernel<false, false>, grid, dim3(block_size), stream, p);
  }
  return hipGetLastError();
}

}  // namespace anvil::kernels
