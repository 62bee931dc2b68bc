#include <cmath>

#include "kernels/rope.h"

namespace anvil::kernels {

void rope_ref(const rope_params& p) {
  const std::int64_t half = p.rot_dim / 2;
  for (std::int64_t t = 0; t < p.n_tokens; ++t) {
    const double pos = double(p.positions[t]) * double(p.freq_scale);
    for (std::int64_t h = 0; h < p.n_heads; ++h) {
      float* v = p.x + (t * p.n_heads + h) * p.head_dim;
      for (std::int64_t i = 0; i < half; ++i) {
        double theta = pos * std::pow(double(p.freq_base), -2.0 * double(i) / double(p.rot_dim));
        if (p.freq_factors) theta /= double(p.freq_factors[i]);
        const double c = std::cos(theta), s = std::sin(theta);
        const std::int64_t a = p.style == rope_style::normal ? 2 * i : i;
        const std::int64_t b = p.style == rope_style::normal ? 2 * i + 1 : i + half;
        const double x0 = v[a], x1 = v[b];
        v[a] = float(x0 * c - x1 * s);
        v[b] = float(x0 * s + x1 * c);
      }
    }
  }
}

}  // namespace anvil::kernels
