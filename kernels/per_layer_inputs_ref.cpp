#include "kernels/per_layer_inputs.h"

#include "kernels/rms_norm.h"

namespace anvil::kernels {

void per_layer_inputs_ref(const per_layer_inputs_params& p) {
  const std::int64_t n = p.n_tokens * p.n_layers * p.dim;
  for (std::int64_t i = 0; i < n; ++i) p.y[i] *= p.proj_scale;
  rms_norm_ref({.x = p.y, .weight = p.norm, .y = p.y, .rows = p.n_tokens * p.n_layers, .cols = p.dim, .eps = p.eps});
  for (std::int64_t i = 0; i < n; ++i) p.y[i] = (p.y[i] + p.tok[i]) * p.sum_scale;
}

}  // namespace anvil::kernels
