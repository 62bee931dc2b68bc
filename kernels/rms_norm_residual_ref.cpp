#include "kernels/rms_norm_residual.h"

#include <algorithm>
#include <vector>

#include "kernels/rms_norm.h"

namespace anvil::kernels {

void rms_norm_residual_ref(const rms_norm_residual_params& p) {
  if (p.delta && p.pair_weights) {
    std::vector<float> sum(static_cast<std::size_t>(p.cols));
    for (std::int64_t r = 0; r < p.rows; ++r) {
      std::fill(sum.begin(), sum.end(), 0.f);
      for (std::int64_t j = 0; j < p.k; ++j) {
        const float w = p.pair_weights[r * p.k + j];
        const float* y = p.delta + (r * p.k + j) * p.cols;
        for (std::int64_t i = 0; i < p.cols; ++i) sum[std::size_t(i)] += w * y[i];
      }
      for (std::int64_t i = 0; i < p.cols; ++i) p.h[r * p.cols + i] += sum[std::size_t(i)];
    }
  } else if (p.delta && p.delta_weight) {  // as model/arch/cpu_forward.cpp norms a block's output
    std::vector<float> normed(static_cast<std::size_t>(p.rows * p.cols));
    rms_norm_ref({.x = p.delta, .weight = p.delta_weight, .y = normed.data(), .rows = p.rows, .cols = p.cols, .eps = p.eps});
    for (std::int64_t i = 0; i < p.rows * p.cols; ++i) p.h[i] += normed[std::size_t(i)];
  } else if (p.delta) {
    for (std::int64_t i = 0; i < p.rows * p.cols; ++i) p.h[i] += p.delta[i];
  }
  if (p.delta && p.h_scale != 1.f) {
    for (std::int64_t i = 0; i < p.rows * p.cols; ++i) p.h[i] *= p.h_scale;
  }
  rms_norm_ref({.x = p.h, .weight = p.weight, .y = p.y, .rows = p.rows, .cols = p.cols, .eps = p.eps});
}

}  // namespace anvil::kernels
