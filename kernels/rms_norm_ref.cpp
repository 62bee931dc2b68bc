#include "kernels/rms_norm.h"

#include <cmath>

namespace anvil::kernels {

void rms_norm_ref(const rms_norm_params& p) {
  for (std::int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + rms_norm_row_at(p, r);
    float* y = p.y + rms_norm_row_at(p, r);
    double sum_sq = 0.0;
    for (std::int64_t c = 0; c < p.cols; ++c) sum_sq += double(x[c]) * double(x[c]);
    const double scale = 1.0 / std::sqrt(sum_sq / double(p.cols) + double(p.eps));
    for (std::int64_t c = 0; c < p.cols; ++c) y[c] = float(double(x[c]) * scale * double(p.weight[c]));
  }
}

}  // namespace anvil::kernels
