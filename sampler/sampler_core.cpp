#include "sampler/sampler_core.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "kernels/draw.h"

namespace anvil::sampler {
namespace {

using gpu_worker::candidate;
using gpu_worker::seq_output;

// A token the distribution gives no probability at all (a -inf mask, or a logit saturated far
// below the rest) reports the lowest float rather than -inf, which JSON cannot carry.
float logprob_of(const candidate& c, double log_normalizer) {
  return float(std::max(double(c.logit) - log_normalizer, double(std::numeric_limits<float>::lowest())));
}

}  // namespace

std::optional<std::string> check_candidates(const seq_output& out) {
  if (out.top.empty()) return "no candidates";
  for (std::size_t i = 0; i < out.top.size(); ++i) {
    const candidate& c = out.top[i];
    if (c.token < 0) return "a candidate has a negative token id";
    if (std::isnan(c.logit) || c.logit == INFINITY) return "a candidate logit is NaN or +inf";
    if (i > 0) {
      const candidate& prev = out.top[i - 1];
      if (c.logit > prev.logit || (c.logit == prev.logit && c.token <= prev.token)) {
        return "candidates are not sorted by logit descending, ties by lower token id";
      }
    }
  }
  if (!std::isfinite(out.log_normalizer)) return "log_normalizer is not finite";
  if (!(out.tail_mass >= 0.f && out.tail_mass <= 1.f)) return "tail_mass is outside [0, 1]";
  if (out.tail_mass > 0.f && out.tail.token < 0) return "tail_mass > 0 but no tail token";
  if (out.tail_mass > 0.f && (std::isnan(out.tail.logit) || out.tail.logit == INFINITY)) {
    return "the tail logit is NaN or +inf";
  }
  return std::nullopt;
}

namespace {

// The n_logprobs alternatives, and the chosen candidate (its index into top, or top.size() for the tail).
choice report(const seq_output& out, std::size_t index, std::int32_t n_logprobs) {
  const double lse = out.log_normalizer;
  choice ch;
  const std::size_t n_alt = std::min(std::size_t(n_logprobs), out.top.size());
  ch.top_logprobs.reserve(n_alt);
  for (std::size_t i = 0; i < n_alt; ++i) ch.top_logprobs.push_back({out.top[i].token, logprob_of(out.top[i], lse)});
  ch.from_tail = index >= out.top.size();
  const candidate& c = ch.from_tail ? out.tail : out.top[index];
  ch.token = c.token;
  ch.logprob = logprob_of(c, lse);
  return ch;
}

void check_choose(const seq_output& out, std::int32_t n_logprobs) {
  if (const auto why = check_candidates(out)) throw std::invalid_argument("choose: " + *why);
  if (n_logprobs < 0 || n_logprobs > max_logprobs) throw std::invalid_argument("choose: n_logprobs must be in [0, 20]");
}

}  // namespace

choice choose(const seq_output& out, const sampling_params& p, double u, std::int32_t n_logprobs) {
  check_choose(out, n_logprobs);
  const kernels::draw_cut cut{.greedy = gpu_worker::is_greedy(p.temperature), .top_k = p.top_k, .top_p = p.top_p, .min_p = p.min_p};
  return report(out, kernels::draw_index(out, cut, u), n_logprobs);
}

choice choose(const seq_output& out, const sampling_params& p, std::mt19937_64& rng, std::int32_t n_logprobs) {
  check_choose(out, n_logprobs);
  return choose(out, p, gpu_worker::is_greedy(p.temperature) ? 0.0 : uniform01(rng), n_logprobs);
}

choice take_drawn(const seq_output& out, std::int32_t n_logprobs) {
  check_choose(out, n_logprobs);
  for (std::size_t i = 0; i < out.top.size(); ++i) {
    if (out.top[i].token == out.drawn) return report(out, i, n_logprobs);
  }
  if (out.drawn >= 0 && out.tail.token == out.drawn && out.tail_mass > 0.f) return report(out, out.top.size(), n_logprobs);
  throw std::invalid_argument("take_drawn: the drawn token is neither a candidate nor the tail token");
}

error_code sampler_core::open(std::uint64_t request_id, const sampling_params& p) {
  if (validate(p)) return make_error_code(sampler_errc::invalid_params);
  if (requests_.contains(request_id)) return make_error_code(sampler_errc::already_open);
  requests_.emplace(request_id, request_state{p});
  return {};
}

sample_outcome sampler_core::sample(const sample_request& r) {
  const auto it = requests_.find(r.request_id);
  if (it == requests_.end()) return make_error_code(sampler_errc::unknown_request);
  // Checked before choose() so a bad entry costs its request no draw.
  if (check_candidates(r.candidates) || r.n_logprobs < 0 || r.n_logprobs > max_logprobs) {
    return make_error_code(sampler_errc::invalid_candidates);
  }
  if (r.candidates.drawn >= 0) {
    try {
      return take_drawn(r.candidates, r.n_logprobs);
    } catch (const std::invalid_argument&) {
      return make_error_code(sampler_errc::invalid_candidates);
    }
  }
  const sampling_params& p = it->second.params;
  return choose(r.candidates, p, kernels::draw_uniform(p.seed, r.candidates.position), r.n_logprobs);
}

std::vector<sample_outcome> sampler_core::sample(std::span<const sample_request> batch) {
  std::vector<sample_outcome> out;
  out.reserve(batch.size());
  for (const sample_request& r : batch) out.push_back(sample(r));
  return out;
}

error_code sampler_core::close(std::uint64_t request_id) {
  if (requests_.erase(request_id) == 0) return make_error_code(sampler_errc::unknown_request);
  return {};
}

}  // namespace anvil::sampler
