// all_reduce_p2p_ref: the sum in rank order that the one-shot all-reduce gives every rank.
#include <stdexcept>

#include "kernels/all_reduce_p2p.h"

namespace anvil::kernels {

void all_reduce_p2p_ref(std::span<std::vector<float>> xs) {
  if (xs.empty()) return;
  const std::size_t n = xs[0].size();
  for (const auto& x : xs) {
    if (x.size() != n) throw std::invalid_argument("all_reduce_p2p_ref: every rank's part has the same length");
  }
  std::vector<float> sum(n, 0.f);
  for (const auto& x : xs) {
    for (std::size_t i = 0; i < n; ++i) sum[i] += x[i];
  }
  for (auto& x : xs) x = sum;
}

}  // namespace anvil::kernels
