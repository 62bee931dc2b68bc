// SwiGLU gate of the feed-forward block: out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + e^-x).
#pragma once

#include <cstdint>

namespace anvil::kernels {

struct swiglu_params {
  const float* gate = nullptr;  // [n]
  const float* up = nullptr;    // [n]
  float* out = nullptr;         // [n]; may alias gate or up
  std::int64_t n = 0;
};

void swiglu_ref(const swiglu_params& p);

}  // namespace anvil::kernels
