// Seeded random test data shared by the suites.
#pragma once

#include <random>
#include <vector>

namespace anvil::test_support {

// n values drawn from N(0, scale^2), the same for the same seed.
inline std::vector<float> randn(std::size_t n, unsigned seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace anvil::test_support
