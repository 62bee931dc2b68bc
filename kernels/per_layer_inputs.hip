// Gemma 4 E2B / E4B's per-layer inputs (kernels/per_layer_inputs.h): a group of 32 threads per
// (token, layer) row, its values in registers, the mean square by shuffles within the group.
#include "kernels/per_layer_inputs.h"

#include <algorithm>

namespace anvil::kernels {
namespace {

constexpr int threads = 256;
constexpr int rows_per_block = threads / 32;
constexpr int max_dim = 1024;
constexpr int per_lane = max_dim / 32;

__global__ void __launch_bounds__(threads) per_layer_inputs_kernel(per_layer_inputs_params p) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const std::int64_t row = std::int64_t(blockIdx.x) * rows_per_block + threadIdx.x / 32;
  if (row >= p.n_tokens * p.n_layers) return;  // a whole group of 32 returns together
  const int lane = int(threadIdx.x) % 32, dim = int(p.dim);
  float* y = p.y + row * p.dim;
  const float* tok = p.tok + row * p.dim;
  float v[per_lane];
  float ss = 0.f;
#pragma unroll
  for (int m = 0; m < per_lane; ++m) {
    const int c = lane + 32 * m;
    v[m] = c < dim ? y[c] * p.proj_scale : 0.f;
    ss += v[m] * v[m];
  }
#pragma unroll
  for (int m = 16; m > 0; m /= 2) ss += gpu::shfl_xor(ss, m);  // within the aligned group of 32
  const float inv = rsqrtf(ss / float(dim) + p.eps);
#pragma unroll
  for (int m = 0; m < per_lane; ++m) {
    const int c = lane + 32 * m;
    if (c < dim) y[c] = (v[m] * inv * p.norm[c] + tok[c]) * p.sum_scale;
  }
}

}  // namespace

hipError_t launch_per_layer_inputs(const per_layer_inputs_params& p, hipStream_t stream) {
  if (p.n_tokens < 0 || p.n_layers < 0 || p.dim < 1 || p.dim > max_dim) return hipErrorInvalidValue;
  const std::int64_t rows = p.n_tokens * p.n_layers;
  if (rows == 0) return hipSuccess;
  const std::int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  if (blocks > (std::int64_t(1) << 31) - 1) return hipErrorInvalidValue;
  gpu::launch_dependent(per_layer_inputs_kernel, dim3(static_cast<unsigned>(blocks)), dim3(threads), stream, p);
  return hipGetLastError();
}

}  // namespace anvil::kernels
