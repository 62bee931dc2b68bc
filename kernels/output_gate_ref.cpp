#include <cmath>

#include "kernels/output_gate.h"

namespace anvil::kernels {

void output_gate_ref(const output_gate_params& p) {
  for (std::int64_t t = 0; t < p.rows; ++t) {
    for (std::int64_t h = 0; h < p.heads; ++h) {
      float* x = p.x + (t * p.heads + h) * p.head_dim;
      const float* g = p.gate + t * p.gate_row_stride + h * p.gate_head_stride;
      for (std::int64_t i = 0; i < p.head_dim; ++i) x[i] *= 1.f / (1.f + std::exp(-g[i]));
    }
  }
}

}  // namespace anvil::kernels
