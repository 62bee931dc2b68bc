#include <cmath>

#include "kernels/swiglu.h"

namespace anvil::kernels {

void swiglu_ref(const swiglu_params& p) {
  for (std::int64_t i = 0; i < p.n; ++i) {
    const float g = p.gate[i];
    p.out[i] = g / (1.f + std::exp(-g)) * p.up[i];
  }
}

}  // namespace anvil::kernels
