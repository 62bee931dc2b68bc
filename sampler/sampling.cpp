#include "sampler/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>
#include <vector>

#include "messages/step.h"

namespace anvil::sampler {
namespace {

struct candidate {
  std::int32_t id;
  float logit;
};

void apply_penalties(std::vector<candidate>& c, const sampling_params& p, std::span<const std::int32_t> history) {
  if (p.repetition_penalty == 1.f && p.presence_penalty == 0.f && p.frequency_penalty == 0.f) return;
  std::unordered_map<std::int32_t, int> counts;
  for (std::int32_t t : history) counts[t]++;
  for (const auto& [id, n] : counts) {
    if (id < 0 || std::size_t(id) >= c.size()) continue;
    float& l = c[std::size_t(id)].logit;
    l = gpu_worker::penalised(l, p.repetition_penalty, p.presence_penalty, p.frequency_penalty, n);
  }
}

}  // namespace

double uniform01(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }

std::optional<std::string> validate(const sampling_params& p, std::int64_t vocab_size) {
  if (!(p.temperature >= 0.f && p.temperature <= 100.f)) return "temperature must be in [0, 100]";
  if (p.top_k < 0) return "top_k must be >= 0 (0 disables it)";
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) return "top_p must be in (0, 1]";
  if (!(p.min_p >= 0.f && p.min_p < 1.f)) return "min_p must be in [0, 1)";
  if (!(p.repetition_penalty > 0.f && p.repetition_penalty <= 10.f)) return "repetition_penalty must be in (0, 10]";
  if (!(p.presence_penalty >= -2.f && p.presence_penalty <= 2.f)) return "presence_penalty must be in [-2, 2]";
  if (!(p.frequency_penalty >= -2.f && p.frequency_penalty <= 2.f)) return "frequency_penalty must be in [-2, 2]";
  if (p.logprobs < 0 || p.logprobs > max_logprobs) return "logprobs must be in [0, 20]";
  for (const auto& [id, b] : p.logit_bias) {
    if (id < 0 || (vocab_size > 0 && id >= vocab_size)) {
      return "logit_bias token " + std::to_string(id) + " is outside the vocabulary";
    }
    if (!(b >= -100.f && b <= 100.f)) return "logit_bias values must be in [-100, 100]";
  }
  return std::nullopt;
}

std::int32_t sample_token(std::span<const float> logits, const sampling_params& p,
                          std::span<const std::int32_t> history, std::mt19937_64& rng) {
  std::vector<candidate> c(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) c[i] = {std::int32_t(i), logits[i]};
  for (const auto& [id, b] : p.logit_bias) {
    if (id < 0 || std::size_t(id) >= c.size()) continue;
    float& l = c[std::size_t(id)].logit;
    l = gpu_worker::keep_finite(l, l + b);
  }
  apply_penalties(c, p, history);

  auto more_likely = [](const candidate& a, const candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  if (gpu_worker::is_greedy(p.temperature)) return std::min_element(c.begin(), c.end(), more_likely)->id;

  std::size_t keep = c.size();
  if (p.top_k > 0 && std::size_t(p.top_k) < keep) keep = std::size_t(p.top_k);
  std::partial_sort(c.begin(), c.begin() + std::ptrdiff_t(keep), c.end(), more_likely);
  c.resize(keep);

  // Softmax at the temperature, in double.
  std::vector<double> prob(c.size());
  const double top = c[0].logit;
  double sum = 0;
  for (std::size_t i = 0; i < c.size(); ++i) sum += prob[i] = std::exp((double(c[i].logit) - top) / p.temperature);
  for (double& x : prob) x /= sum;

  std::size_t n = c.size();
  if (p.top_p < 1.f) {
    double cum = 0;
    for (std::size_t i = 0; i < n; ++i) {
      cum += prob[i];
      if (cum >= p.top_p) {
        n = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.f) {
    const double floor = p.min_p * prob[0];
    while (n > 1 && prob[n - 1] < floor) --n;
  }
  const double total = std::accumulate(prob.begin(), prob.begin() + std::ptrdiff_t(n), 0.0);
  double r = uniform01(rng) * total;
  for (std::size_t i = 0; i < n; ++i) {
    r -= prob[i];
    if (r < 0) return c[i].id;
  }
  return c[n - 1].id;
}

}  // namespace anvil::sampler
