#include "kernels/candidates.h"
#include "kernels/draw.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace anvil::kernels {
namespace {

using gpu_worker::candidate;
using gpu_worker::logit_params;
using gpu_worker::seq_output;

void check_token(std::int32_t id, std::size_t vocab, const char* what) {
  if (id < 0 || std::size_t(id) >= vocab) {
    throw std::invalid_argument(std::string("candidates_ref: ") + what + " token " + std::to_string(id) +
                                " is outside the vocabulary of " + std::to_string(vocab));
  }
}

// Raw logits with bias, penalties and temperature applied (see the header for the rules).
std::vector<float> process(std::span<const float> logits, const logit_params& p) {
  const std::size_t vocab = logits.size();
  std::vector<float> l(logits.begin(), logits.end());
  for (float x : l) {
    if (std::isnan(x) || x == INFINITY) throw std::invalid_argument("candidates_ref: a raw logit is NaN or +inf");
  }
  if (!p.allowed.empty()) {  // constrained decoding: tokens outside the mask are -inf from the start
    if (p.allowed.size() != (vocab + 31) / 32) throw std::invalid_argument("candidates_ref: the mask does not cover the vocabulary");
    for (std::size_t t = 0; t < vocab; ++t) {
      if (!((p.allowed[t / 32] >> (t % 32)) & 1u)) l[t] = -INFINITY;
    }
  }
  for (const auto& [id, b] : p.logit_bias) {
    check_token(id, vocab, "logit_bias");
    float& x = l[std::size_t(id)];
    x = gpu_worker::keep_finite(x, x + b);
  }

  // Distinct ids, so a token is penalised once whatever the order of the pairs.
  std::vector<std::int32_t> ids;
  ids.reserve(p.token_counts.size());
  for (const auto& [id, n] : p.token_counts) {
    check_token(id, vocab, "token_counts");
    if (n < 0) throw std::invalid_argument("candidates_ref: negative count for token " + std::to_string(id));
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) {
    throw std::invalid_argument("candidates_ref: token_counts lists a token twice");
  }
  for (const auto& [id, n] : p.token_counts) {
    if (n == 0) continue;
    float& x = l[std::size_t(id)];
    x = gpu_worker::penalised(x, p.repetition_penalty, p.presence_penalty, p.frequency_penalty, n);
  }

  if (!gpu_worker::is_greedy(p.temperature)) {
    for (float& x : l) x = gpu_worker::keep_finite(x, x / p.temperature);
  }
  return l;
}

// splitmix64's output function (Steele, Lea, Flood 2014): a bijection that mixes every bit.
std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

double tail_uniform(std::uint64_t seed, std::int64_t position) noexcept {
  const std::uint64_t key = seed ^ (std::uint64_t(position) * 0x9E3779B97F4A7C15ull);
  return double(splitmix64(key) >> 11) * 0x1.0p-53;
}

std::int32_t draw_token(const seq_output& out, const logit_params& p) {
  if (!p.draw.on || out.top.empty()) return -1;
  const draw_cut cut{.greedy = gpu_worker::is_greedy(p.temperature),
                     .top_k = p.draw.top_k,
                     .top_p = p.draw.top_p,
                     .min_p = p.draw.min_p};
  const std::size_t i = draw_index(out, cut, draw_uniform(p.seed, out.position));
  return i < out.top.size() ? out.top[i].token : out.tail.token;
}

std::string unusable_logits(std::span<const float> logits) {
  bool any_finite = false;
  for (float x : logits) {
    if (std::isnan(x) || x == INFINITY) return "a logit is NaN or +inf";
    any_finite |= std::isfinite(x);
  }
  return any_finite ? std::string() : "no logit is finite";
}

namespace {

seq_output reduce(std::span<const float> logits, const logit_params& p, std::int64_t position) {
  if (logits.empty()) throw std::invalid_argument("candidates_ref: empty vocabulary");
  if (p.top_k < 1) throw std::invalid_argument("candidates_ref: top_k must be >= 1");
  const std::vector<float> l = process(logits, p);
  const std::size_t vocab = l.size();

  const float max = *std::max_element(l.begin(), l.end());
  if (!std::isfinite(max)) throw std::invalid_argument("candidates_ref: no token has a finite logit");

  // Top-K by logit descending, ties to the lower id (a strict total order, so the cut is unique).
  const std::size_t k = std::min(std::size_t(p.top_k), vocab);
  std::vector<std::int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(k), order.end(), [&](std::int32_t a, std::int32_t b) {
    return l[std::size_t(a)] > l[std::size_t(b)] || (l[std::size_t(a)] == l[std::size_t(b)] && a < b);
  });
  std::vector<bool> in_top(vocab, false);
  seq_output out;
  out.top.reserve(k);
  for (std::size_t i = 0; i < k; ++i) {
    in_top[std::size_t(order[i])] = true;
    out.top.push_back({order[i], l[std::size_t(order[i])]});
  }

  // Weights relative to the maximum: the largest is 1, so the sum is in [1, vocab] and nothing
  // overflows; -inf logits weigh exactly 0.
  double total = 0, tail = 0;
  for (std::size_t t = 0; t < vocab; ++t) {
    const double w = std::exp(double(l[t]) - double(max));
    total += w;
    if (!in_top[t]) tail += w;
  }
  // max <= FLT_MAX and log(total) <= log(vocab): the sum rounds to at most FLT_MAX.
  out.log_normalizer = float(std::min(double(max) + std::log(total), double(std::numeric_limits<float>::max())));
  out.tail_mass = float(std::clamp(tail / total, 0.0, 1.0));
  if (out.tail_mass == 0.f) return out;  // tail stays {-1, 0}

  // The tail draw: first id in ascending order whose cumulative weight exceeds u * tail. The
  // fallback (rounding left r >= 0 after the last token) is the last tail token with weight.
  double r = tail_uniform(p.seed, position) * tail;
  for (std::size_t t = 0; t < vocab; ++t) {
    if (in_top[t]) continue;
    const double w = std::exp(double(l[t]) - double(max));
    if (w == 0) continue;
    out.tail = {std::int32_t(t), l[t]};
    r -= w;
    if (r < 0) break;
  }
  return out;
}

}  // namespace

seq_output candidates_ref(std::span<const float> logits, const logit_params& p, std::int64_t position) {
  seq_output out = reduce(logits, p, position);
  out.position = position;
  out.drawn = draw_token(out, p);
  return out;
}

}  // namespace anvil::kernels
