#include "bench/load/arrivals.h"

#include <cmath>
#include <random>

namespace anvil::bench {

std::vector<double> arrival_offsets(int n, double rate, double burstiness, std::uint64_t seed) {
  std::vector<double> out(static_cast<std::size_t>(n > 0 ? n : 0), 0.0);
  if (out.empty() || !std::isfinite(rate)) return out;
  // Gamma(shape k, scale theta) has mean k * theta: theta = 1 / (rate * k) gives mean 1 / rate.
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  double t = 0;
  for (std::size_t i = 1; i < out.size(); ++i) {
    t += gap(rng);
    out[i] = t;
  }
  return out;
}

}  // namespace anvil::bench
