// Logit soft-capping (Gemma 4's final_logit_softcapping): every element squashed into (-cap, cap),
//   x[i] = cap * tanh(x[i] / cap)
// in place, over the head's logit rows before anything reads them (the candidates op, scoring).
// softcap_ref() is the definition (CPU, what model/arch/cpu_forward.cpp runs); launch_softcap()
// the GPU kernel (softcap.hip).
#pragma once

#include <cstdint>

namespace anvil::kernels {

struct softcap_params {
  float* x = nullptr;  // [n], capped in place
  std::int64_t n = 0;
  float cap = 0.f;     // > 0
};

void softcap_ref(const softcap_params& p);

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// A thread per element (grid-stride). Rejects (hipErrorInvalidValue) n < 0 and cap <= 0.
hipError_t launch_softcap(const softcap_params& p, hipStream_t stream);
}  // namespace anvil::kernels
#endif
