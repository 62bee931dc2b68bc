// CPU references of the mixture-of-experts ops (kernels/moe.h).
#include <algorithm>
#include <cmath>

#include "kernels/moe.h"

namespace anvil::kernels {

void moe_route_ref(const moe_route_params& p) {
  const std::int64_t n_expert = p.n_expert, k = p.k;
  for (std::int64_t t = 0; t < p.n_tokens; ++t) {
    const float* l = p.logits + t * n_expert;
    const float top = *std::max_element(l, l + n_expert);
    float sum = 0.f;
    for (std::int64_t e = 0; e < n_expert; ++e) sum += std::exp(l[e] - top);
    // Computed where needed rather than stored: the reference allocates nothing.
    const auto prob = [&](std::int64_t e) { return std::exp(l[e] - top) / sum; };
    std::int32_t* ids = p.ids + t * k;
    float* wt = p.weights + t * k;
    for (std::int64_t j = 0; j < k; ++j) {
      std::int32_t best = -1;
      float best_p = 0.f;
      for (std::int64_t e = 0; e < n_expert; ++e) {
        if (std::find(ids, ids + j, std::int32_t(e)) != ids + j) continue;
        const float pe = prob(e);
        if (best < 0 || pe > best_p) best = std::int32_t(e), best_p = pe;
      }
      ids[j] = best;
      wt[j] = best_p;
    }
    if (p.normalize) {
      float chosen = 0.f;
      for (std::int64_t j = 0; j < k; ++j) chosen += wt[j];
      for (std::int64_t j = 0; j < k; ++j) wt[j] /= chosen;
    }
    if (p.expert_scale != nullptr) {
      for (std::int64_t j = 0; j < k; ++j) wt[j] *= p.expert_scale[ids[j]];
    }
  }
}

void moe_combine_ref(const moe_combine_params& p) {
  const std::int64_t d = p.cols;
  for (std::int64_t t = 0; t < p.n_tokens; ++t) {
    float* out = p.out + t * d;
    std::fill(out, out + d, 0.f);
    for (std::int64_t j = 0; j < p.k; ++j) {
      const float w = p.weights[t * p.k + j];
      const float* y = p.y + (t * p.k + j) * d;
      for (std::int64_t i = 0; i < d; ++i) out[i] += w * y[i];
    }
    if (p.shared == nullptr) continue;
    float g = 1.f;
    if (p.shared_gate != nullptr) {
      float dot = 0.f;
      for (std::int64_t i = 0; i < d; ++i) dot += p.x[t * d + i] * p.shared_gate[i];
      g = 1.f / (1.f + std::exp(-dot));
    }
    for (std::int64_t i = 0; i < d; ++i) out[i] += g * p.shared[t * d + i];
  }
}

}  // namespace anvil::kernels
