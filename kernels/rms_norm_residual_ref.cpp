#include "kernels/rms_norm_residual.h"

#include "kernels/rms_norm.h"

namespace anvil::kernels {

void rms_norm_residual_ref(const rms_norm_residual_params& p) {
  if (p.delta) {
    for (std::int64_t i = 0; i < p.rows * p.cols; ++i) p.h[i] += p.delta[i];
  }
  rms_norm_ref({.x = p.h, .weight = p.weight, .y = p.y, .rows = p.rows, .cols = p.cols, .eps = p.eps});
}

}  // namespace anvil::kernels
