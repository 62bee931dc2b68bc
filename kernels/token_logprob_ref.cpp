#include "kernels/token_logprob.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace anvil::kernels {

float token_logprob_ref(std::span<const float> logits, std::int32_t target) {
  if (logits.empty() || target < 0 || std::size_t(target) >= logits.size()) {
    throw std::invalid_argument("token_logprob_ref: target outside the row");
  }
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float l : logits) sum += std::exp(double(l) - max);
  return float(double(logits[std::size_t(target)]) - max - std::log(sum));
}

}  // namespace anvil::kernels
