#include <algorithm>
#include <cmath>

#include "kernels/swiglu.h"

namespace anvil::kernels {

void swiglu_ref(const swiglu_params& p) {
  if (p.act == glu_activation::gelu_tanh) {
    for (std::int64_t i = 0; i < p.n; ++i) {
      const float g = p.gate[i];
      p.out[i] = 0.5f * g * (1.f + std::tanh(0.7978845608f * (g + 0.044715f * g * g * g))) * p.up[i];
    }
    return;
  }
  if (p.limit > 0) {
    for (std::int64_t i = 0; i < p.n; ++i) {
      const float g = std::min(p.gate[i], p.limit), u = std::clamp(p.up[i], -p.limit, p.limit);
      p.out[i] = g / (1.f + std::exp(-p.alpha * g)) * (u + 1.f);
    }
    return;
  }
  for (std::int64_t i = 0; i < p.n; ++i) {
    const float g = p.gate[i];
    p.out[i] = g / (1.f + std::exp(-g)) * p.up[i];
  }
}

void swiglu_rows_ref(const swiglu_rows_params& p) {
  for (std::int64_t r = 0; r < p.rows; ++r) {
    swiglu_ref({.gate = p.gate + r * p.gate_stride,
                .up = p.up + r * p.up_stride,
                .out = p.out + r * p.out_stride,
                .n = p.cols,
                .limit = p.limit,
                .alpha = p.alpha,
                .act = p.act});
  }
}

}  // namespace anvil::kernels
