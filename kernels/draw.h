// The token draw from a step's candidates, written once for the host and the device: the cut
// (top_k, then top_p, then min_p) and the seeded draw that sampler_core::choose applies to the
// worker's summary of a distribution (sampler/sampler_core.h states the rules and where they are
// exact). The worker draws with it right after the candidates op (kernels/candidates.h,
// gpu_worker::draw_params), so a step planned ahead can feed the token without a trip through
// the host; the sampler draws with the same function, so both give the same token for a seed.
//
// The uniform u comes from draw_uniform(seed, position) (kernels/candidates.h): counter-based, so
// the token at a position depends on the seed and the distribution alone, never on batches,
// interleaving, or on which side drew it. On the device the probabilities come from the device's
// double exp, which may differ from the host's in the last bit: the two sides can then disagree
// only for a u within ~1e-16 of a boundary between two tokens.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace anvil::kernels {

// The uniform of the token draw at `position`, in [0, 1): counter-based like the tail draw's
// (kernels/candidates.h tail_uniform: splitmix64 of seed ^ position * golden ratio, top 53 bits),
// from that key xor a constant, so the token drawn and the tail token are not correlated.
// `position` is the position the drawn token will take. Host only (the worker uploads it).
inline double draw_uniform(std::uint64_t seed, std::int64_t position) noexcept {
  std::uint64_t x = (seed ^ (std::uint64_t(position) * 0x9E3779B97F4A7C15ull)) ^ 0xD1B54A32D192ED03ull;
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return double(x >> 11) * 0x1.0p-53;
}

// The sampler's parameters the draw reads (plain numbers, for the device too).
struct draw_cut {
  bool greedy = true;      // gpu_worker::is_greedy(temperature): the first candidate, no draw
  std::int32_t top_k = 0;  // 0 keeps all
  float top_p = 1.f;       // (0, 1]
  float min_p = 0.f;       // [0, 1)
};

// The index of the drawn candidate in [0, k), or k for the tail token. prob[i] = exp(logit(top[i])
// - log_normalizer) for the k candidates, descending; tail = the tail mass when there is a tail
// token, else 0; u in [0, 1). Sums run in index order, as the sampler's reference does.
ANVIL_HOST_DEVICE inline std::int32_t draw_pick(const double* prob, std::int32_t k, double tail, const draw_cut& c,
                                            double u) {
  if (c.greedy || k <= 0) return 0;
  const bool k_inside = c.top_k > 0 && c.top_k <= k;
  std::int32_t n = k_inside ? c.top_k : k;
  bool with_tail = !k_inside && tail > 0;
  if (c.top_p < 1.f) {
    // top_p is relative to the kept set's mass: the top-k set's when top_k cut inside the
    // candidates, else the whole distribution's.
    double z = 0;
    for (std::int32_t i = 0; i < n; ++i) z += prob[i];
    z += with_tail ? tail : 0.0;
    double cum = 0;
    for (std::int32_t i = 0; i < n; ++i) {
      cum += prob[i];
      if (cum >= double(c.top_p) * z) {
        n = i + 1;
        with_tail = false;
        break;
      }
    }
  }
  if (c.min_p > 0.f) {
    // Every tail token is at most as likely as the last candidate: if that one falls below the
    // floor the cut is inside the candidates; if not, the tail may reach it and stays in.
    const double floor = double(c.min_p) * prob[0];
    std::int32_t m = n;
    while (m > 1 && prob[m - 1] < floor) --m;
    if (m < n || prob[n - 1] < floor) {
      n = m;
      with_tail = false;
    }
  }
  // Normalising by what is kept (not by 1) also absorbs the float rounding of the log-normaliser.
  double total = 0;
  for (std::int32_t i = 0; i < n; ++i) total += prob[i];
  total += with_tail ? tail : 0.0;
  double r = u * total;
  for (std::int32_t i = 0; i < n; ++i) {
    r -= prob[i];
    if (r < 0) return i;
  }
  return with_tail ? k : n - 1;  // the tail entry, or (rounding) the last kept candidate
}

}  // namespace anvil::kernels

#if !defined(__CUDACC__) && !defined(__HIPCC__)
#include <cmath>
#include <vector>

#include "messages/step.h"

namespace anvil::kernels {

// The draw from a step's summary of one distribution, on the host: the worker's CPU twin
// (candidates_ref's seq_output::drawn) and the sampler (sampler_core::choose) both call it. The
// index of the drawn candidate in out.top, or out.top.size() for the tail token; out.top non-empty.
inline std::size_t draw_index(const gpu_worker::seq_output& out, const draw_cut& c, double u) {
  const std::size_t k = out.top.size();
  std::vector<double> prob(k);
  for (std::size_t i = 0; i < k; ++i) prob[i] = std::exp(double(out.top[i].logit) - double(out.log_normalizer));
  const double tail = out.tail.token >= 0 ? double(out.tail_mass) : 0.0;
  return std::size_t(draw_pick(prob.data(), std::int32_t(k), tail, c, u));
}

}  // namespace anvil::kernels
#endif
