// The logits → candidates reduction: what the GPU worker returns instead of a vocabulary of
// logits (DESIGN.md, Actors). One sequence's raw logits are processed with the request's
// whole-vocabulary parameters (logit bias, then penalties, then temperature) and summarised
// exactly: the top-K processed logits, the log-normaliser over the whole vocabulary, the mass
// outside the top-K, and one token drawn from that outside ("tail") distribution. With these the
// sampler can draw from the full processed distribution without seeing it (sampler/sampler_core.h).
//
// candidates_ref() is the definition of the op (CPU, double accumulation); the GPU kernel that
// comes later is tested against it. Its precise rules:
//   - logit_bias and token_counts ids must lie in the vocabulary, token_counts ids must be
//     distinct and counts >= 0, top_k >= 1: the scheduler validates requests, so anything else is
//     a caller bug and throws std::invalid_argument. So does a NaN or +inf raw logit, or a
//     vocabulary in which no token has a finite processed logit (-inf masks are fine otherwise).
//   - bias: l += b (repeated ids add up). Penalties, for each (token, n > 0): repetition first
//     (l > 0 ? l / r : l * r), then l -= presence + frequency * n — the order sampling.cpp uses.
//     Temperature t > 0: l /= t; t <= 0 leaves the logits alone (greedy). All in float.
//   - top: min(top_k, vocab) tokens, logit descending, ties to the lower token id.
//   - log_normalizer = log sum_t exp(l_t), in double around the maximum (stable for |l| ~ 1e4
//     and -inf), rounded to float. Note: a float log_normalizer near 1e4 carries ~1e-3 absolute
//     error, so p = exp(l - log_normalizer) is good to ~1e-3 relative there; real logits are
//     within a few hundred, where the error is ~1e-5.
//   - tail_mass = 1 - sum of top probabilities, computed as the sum over the tail itself (no
//     cancellation when it is tiny); in [0, 1]; exactly 0 when top covers the vocabulary.
//   - tail: token -1 (logit 0) when float(tail_mass) == 0. Otherwise, with u = tail_uniform(seed,
//     position) and weights w_t = exp(l_t - max) over the tokens outside top, the smallest token
//     id t whose cumulative weight in ascending id order exceeds u * sum(w); its logit is l_t.
//     A scan in id order is what a GPU prefix sum computes, so the kernel can follow it exactly
//     up to rounding at the boundaries.
#pragma once

#include <cstdint>
#include <span>

#include "gpu_worker/step.h"

namespace anvil::kernels {

// The counter-based generator of the tail draw: a double in [0, 1) that depends only on the
// request's seed and the position, never on what else is in the batch or on how many draws came
// before (splitmix64 of seed ^ position * golden ratio, top 53 bits). `position` is the position
// the chosen token will occupy (start_pos + tokens.size() of the step), so a recomputed step
// (after preemption) draws the same tail token.
double tail_uniform(std::uint64_t seed, std::int64_t position) noexcept;

// Processes one sequence's raw logits (the whole vocabulary) and reduces them to candidates.
// The result's seq_id is left 0 for the caller to fill.
gpu_worker::seq_output candidates_ref(std::span<const float> logits, const gpu_worker::logit_params& p,
                                      std::int64_t position);

}  // namespace anvil::kernels
