// token_logprob: one block per row; the row's maximum, then the sum of exp(l - max), both by
// block reductions over a strided pass; thread 0 writes l[target] - max - log(sum).
#include "kernels/token_logprob.h"

#include <cmath>

namespace anvil::kernels {
namespace {

constexpr int block_size = 256;

__device__ float block_reduce_max(float v) {
  __shared__ float partial[block_size / 32];  // enough for warps of 32 and 64
  const int lane = threadIdx.x % gpu::warp_size, warp = threadIdx.x / gpu::warp_size;
  const int warps = block_size / gpu::warp_size;
  v = gpu::warp_reduce_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const float m = lane < warps ? partial[lane] : -INFINITY;
  return gpu::warp_reduce_max(m);
}

__global__ void __launch_bounds__(block_size) token_logprob_kernel(token_logprob_params p) {
  const float* row = p.logits + std::int64_t(blockIdx.x) * p.vocab;
  float m = -INFINITY;
  for (std::int64_t i = threadIdx.x; i < p.vocab; i += block_size) m = fmaxf(m, row[i]);
  m = block_reduce_max(m);
  float s = 0.f;
  for (std::int64_t i = threadIdx.x; i < p.vocab; i += block_size) s += expf(row[i] - m);
  s = gpu::block_reduce_sum<block_size>(s);
  if (threadIdx.x == 0) {
    const std::int32_t t = p.targets[blockIdx.x];
    p.out[blockIdx.x] = t >= 0 && t < p.vocab ? row[t] - m - logf(s) : NAN;
  }
}

}  // namespace

hipError_t launch_token_logprob(const token_logprob_params& p, hipStream_t stream) {
  if (p.rows < 0 || p.vocab < 0 || p.rows > 0x7fffffff) return hipErrorInvalidValue;
  if (p.rows == 0) return hipSuccess;
  if (p.vocab == 0 || !p.logits || !p.targets || !p.out) return hipErrorInvalidValue;
  token_logprob_kernel<<<dim3(static_cast<unsigned>(p.rows)), block_size, 0, stream>>>(p);
  return hipGetLastError();
}

}  // namespace anvil::kernels
