#include "sampler/sampler_core.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace anvil::sampler {
namespace {

using gpu_worker::candidate;
using gpu_worker::seq_output;

// The kept set: the first n candidates, plus the tail entry when the cut may extend past them.
struct kept {
  std::size_t n = 0;
  bool with_tail = false;
};

// Applies top_k, top_p and min_p as sample_token does (see the header for what happens when the
// cut would extend past the candidates). prob[i] = p(top[i]), sorted descending; tail = the mass
// outside the candidates (0 when there is none or no tail token to stand for it).
kept cut(const std::vector<double>& prob, double tail, const sampling_params& p) {
  const std::size_t k = prob.size();
  const bool k_inside = p.top_k > 0 && std::size_t(p.top_k) <= k;
  kept c{k_inside ? std::size_t(p.top_k) : k, !k_inside && tail > 0};

  if (p.top_p < 1.f) {
    // top_p is relative to the top-k set's mass: known when top_k cut inside the candidates,
    // else taken as the whole distribution (exact for top_k = 0 or >= vocab).
    const double z = std::accumulate(prob.begin(), prob.begin() + std::ptrdiff_t(c.n), 0.0) + (c.with_tail ? tail : 0);
    double cum = 0;
    for (std::size_t i = 0; i < c.n; ++i) {
      cum += prob[i];
      if (cum >= double(p.top_p) * z) {
        c = {i + 1, false};
        break;
      }
    }
  }
  if (p.min_p > 0.f) {
    // Every tail token is at most as likely as the last candidate: if that one falls below the
    // floor, the cut is inside the candidates; if not, the tail may reach it and stays in.
    const double floor = double(p.min_p) * prob[0];
    std::size_t n = c.n;
    while (n > 1 && prob[n - 1] < floor) --n;
    if (n < c.n || prob[c.n - 1] < floor) c = {n, false};
  }
  return c;
}

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

choice choose(const seq_output& out, const sampling_params& p, std::mt19937_64& rng, std::int32_t n_logprobs) {
  if (const auto why = check_candidates(out)) throw std::invalid_argument("choose: " + *why);
  if (n_logprobs < 0 || n_logprobs > max_logprobs) throw std::invalid_argument("choose: n_logprobs must be in [0, 20]");
  const double lse = out.log_normalizer;
  const std::size_t k = out.top.size();

  choice ch;
  const std::size_t n_alt = std::min(std::size_t(n_logprobs), k);
  ch.top_logprobs.reserve(n_alt);
  for (std::size_t i = 0; i < n_alt; ++i) ch.top_logprobs.push_back({out.top[i].token, logprob_of(out.top[i], lse)});
  auto take = [&](const candidate& c, bool from_tail) {
    ch.token = c.token;
    ch.logprob = logprob_of(c, lse);
    ch.from_tail = from_tail;
    return ch;
  };

  if (gpu_worker::is_greedy(p.temperature)) return take(out.top[0], false);

  std::vector<double> prob(k);
  for (std::size_t i = 0; i < k; ++i) prob[i] = std::exp(double(out.top[i].logit) - lse);
  const double tail = out.tail.token >= 0 ? double(out.tail_mass) : 0.0;
  const kept c = cut(prob, tail, p);

  // Normalising by what is kept (not by 1) also absorbs the float rounding of log_normalizer.
  const double total =
      std::accumulate(prob.begin(), prob.begin() + std::ptrdiff_t(c.n), 0.0) + (c.with_tail ? tail : 0.0);
  double r = uniform01(rng) * total;
  for (std::size_t i = 0; i < c.n; ++i) {
    r -= prob[i];
    if (r < 0) return take(out.top[i], false);
  }
  // Past the candidates: the tail entry, or (rounding) the last kept candidate.
  return c.with_tail ? take(out.tail, true) : take(out.top[c.n - 1], false);
}

error_code sampler_core::open(std::uint64_t request_id, const sampling_params& p) {
  if (validate(p)) return make_error_code(sampler_errc::invalid_params);
  if (requests_.contains(request_id)) return make_error_code(sampler_errc::already_open);
  requests_.emplace(request_id, request_state{p, std::mt19937_64(p.seed)});
  return {};
}

sample_outcome sampler_core::sample(const sample_request& r) {
  const auto it = requests_.find(r.request_id);
  if (it == requests_.end()) return make_error_code(sampler_errc::unknown_request);
  // Checked before choose() so a bad entry costs its request no draw.
  if (check_candidates(r.candidates) || r.n_logprobs < 0 || r.n_logprobs > max_logprobs) {
    return make_error_code(sampler_errc::invalid_candidates);
  }
  return choose(r.candidates, it->second.params, it->second.rng, r.n_logprobs);
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
