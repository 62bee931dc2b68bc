#include "engine/metrics.h"

#include <algorithm>
#include <array>

namespace anvil {

histogram::histogram(std::span<const double> upper_bounds)
    : bounds(upper_bounds.begin(), upper_bounds.end()), counts(upper_bounds.size() + 1, 0) {}

void histogram::observe(double v) {
  const auto at = std::lower_bound(bounds.begin(), bounds.end(), v);  // first bound >= v
  ++counts[std::size_t(at - bounds.begin())];
  sum += v;
  ++count;
}

std::span<const double> latency_buckets_ms() {
  static constexpr std::array<double, 18> b{1,   2.5,  5,    10,   20,    40,    80,    160,   320,
                                            640, 1280, 2500, 5000, 10000, 20000, 40000, 80000, 160000};
  return b;
}

}  // namespace anvil
