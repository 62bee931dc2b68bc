// The gated product of the feed-forward block on the device, for the kernels that compute it:
// SwiGLU's three forms (kernels/swiglu.h, the reference swiglu_ref): silu(g) * u; gpt-oss's clamped
// variant when limit > 0; GeGLU (gelu with the tanh approximation) for act gelu_tanh. Device code
// only: included by .hip files (kernels/swiglu.hip, kernels/gemv.hip), never by host C++.
#pragma once

#include "kernels/gpu_runtime.h"
#include "kernels/swiglu.h"

namespace anvil::kernels {

__device__ __forceinline__ float glu_product(float g, float u, float limit, float alpha, glu_activation act) {
  if (act == glu_activation::gelu_tanh) {
    return 0.5f * g * (1.f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g))) * u;
  }
  if (limit > 0.f) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
    return g / (1.f + expf(-alpha * g)) * (u + 1.f);
  }
  return g / (1.f + expf(-g)) * u;
}

}  // namespace anvil::kernels
