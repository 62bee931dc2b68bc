// Logit soft-capping (kernels/softcap.h): a thread per element, grid-stride over long rows.
#include "kernels/softcap.h"

#include <algorithm>

namespace anvil::kernels {
namespace {

constexpr int block_size = 256;
constexpr std::int64_t max_blocks = 65535;

__global__ void __launch_bounds__(block_size) softcap_kernel(softcap_params p) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  for (std::int64_t i = std::int64_t(blockIdx.x) * block_size + threadIdx.x; i < p.n;
       i += std::int64_t(gridDim.x) * block_size) {
    p.x[i] = p.cap * tanhf(p.x[i] / p.cap);
  }
}

}  // namespace

hipError_t launch_softcap(const softcap_params& p, hipStream_t stream) {
  if (p.n < 0 || !(p.cap > 0.f)) return hipErrorInvalidValue;
  if (p.n == 0) return hipSuccess;
  const std::int64_t blocks = std::min(max_blocks, (p.n + block_size - 1) / block_size);
  gpu::launch_dependent(softcap_kernel, dim3(static_cast<unsigned>(blocks)), dim3(block_size), stream, p);
  return hipGetLastError();
}

}  // namespace anvil::kernels
