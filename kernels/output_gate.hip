// The attention output gate (kernels/output_gate.h): a thread per element, rows in the grid's y.
#include "kernels/output_gate.h"

#include <algorithm>

namespace anvil::kernels {
namespace {

constexpr int block_size = 256;
constexpr unsigned max_grid_y = 65535;

__global__ void __launch_bounds__(block_size) output_gate_kernel(output_gate_params p) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const std::int64_t width = p.heads * p.head_dim;
  const std::int64_t e = std::int64_t(blockIdx.x) * block_size + threadIdx.x;
  if (e >= width) return;
  const std::int64_t h = e / p.head_dim, i = e % p.head_dim;
  for (std::int64_t t = blockIdx.y; t < p.rows; t += gridDim.y) {
    const float g = p.gate[t * p.gate_row_stride + h * p.gate_head_stride + i];
    p.x[t * width + e] *= 1.f / (1.f + expf(-g));
  }
}

}  // namespace

hipError_t launch_output_gate(const output_gate_params& p, hipStream_t stream) {
  if (p.rows == 0 || p.heads == 0 || p.head_dim == 0) return hipSuccess;
  if (p.rows < 0 || p.heads < 0 || p.head_dim < 0 || p.gate_head_stride < p.head_dim ||
      p.gate_row_stride < (p.heads - 1) * p.gate_head_stride + p.head_dim) {
    return hipErrorInvalidValue;
  }
  const std::int64_t blocks_x = (p.heads * p.head_dim + block_size - 1) / block_size;
  if (blocks_x > 0x7fffffff) return hipErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(std::min<std::int64_t>(p.rows, max_grid_y)));
  gpu::launch_dependent(output_gate_kernel, grid, dim3(block_size), stream, p);
  return hipGetLastError();
}

}  // namespace anvil::kernels
