// Random sampling parameters drawn from the ranges sampler::validate() accepts, weighted towards
// their edges: the bounds themselves, zero, subnormals, the smallest normal float, the greedy
// threshold and the floats beside it. The property tests (sampler core, CPU engine, GPU
// candidates) run thousands of these: no accepted set, in any combination, may produce a
// non-finite logit, probability or log-probability, or fail anything but its own request.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "messages/step.h"
#include "sampler/sampling.h"

namespace anvil::testing {

// One of the edge values of [lo, hi] (each bound included only when `lo_in` / `hi_in`), or a
// uniform or log-uniform draw inside it.
inline float edge_float(std::mt19937_64& rng, float lo, float hi, bool lo_in = true, bool hi_in = true) {
  const float specials[] = {lo,           hi,        0.f,       -0.f,      FLT_TRUE_MIN, -FLT_TRUE_MIN, FLT_MIN,
                            1e-38f,       1e-30f,    1e-20f,    1e-10f,    gpu_worker::min_temperature,
                            std::nextafter(gpu_worker::min_temperature, 0.f),
                            1e-3f,        0.5f,      1.f,       std::nextafter(1.f, 0.f), std::nextafter(hi, lo),
                            std::nextafter(lo, hi)};
  for (;;) {
    float x = 0.f;
    switch (rng() % 3) {
      case 0: x = specials[rng() % std::size(specials)]; break;
      case 1: x = std::uniform_real_distribution<float>(lo, hi)(rng); break;
      default: {  // log-uniform magnitude in [1e-40, |bound|], the sign of a bound
        const float mag = std::pow(10.f, std::uniform_real_distribution<float>(-40.f, 2.f)(rng));
        x = (lo < 0 && rng() % 2) ? -mag : mag;
      }
    }
    if (!std::isfinite(x) || x < lo || x > hi || (!lo_in && x == lo) || (!hi_in && x == hi)) continue;
    return x;
  }
}

// A parameter set validate() accepts for a vocabulary of `vocab` tokens.
inline sampler::sampling_params edge_sampling_params(std::mt19937_64& rng, std::int32_t vocab) {
  sampler::sampling_params p;
  p.temperature = rng() % 4 == 0 ? 0.f : edge_float(rng, 0.f, 100.f);
  const std::int32_t ks[] = {0, 1, 2, vocab - 1, vocab, vocab + 1, std::numeric_limits<std::int32_t>::max()};
  p.top_k = rng() % 2 ? ks[rng() % std::size(ks)] : std::int32_t(rng() % std::uint64_t(vocab + 2));
  p.top_p = rng() % 3 == 0 ? 1.f : edge_float(rng, 0.f, 1.f, false, true);
  p.min_p = rng() % 3 == 0 ? 0.f : edge_float(rng, 0.f, 1.f, true, false);
  p.repetition_penalty = rng() % 4 == 0 ? 1.f : edge_float(rng, 0.f, 10.f, false, true);
  p.presence_penalty = rng() % 3 == 0 ? 0.f : edge_float(rng, -2.f, 2.f);
  p.frequency_penalty = rng() % 3 == 0 ? 0.f : edge_float(rng, -2.f, 2.f);
  const std::uint64_t seeds[] = {0, 1, std::numeric_limits<std::uint64_t>::max(), rng()};
  p.seed = seeds[rng() % std::size(seeds)];
  p.logprobs = std::int32_t(rng() % (sampler::max_logprobs + 1));
  const std::size_t n_bias = rng() % 3 == 0 ? 0 : rng() % 12;
  for (std::size_t i = 0; i < n_bias; ++i) {
    const std::int32_t id = i > 0 && rng() % 4 == 0 ? p.logit_bias.front().first  // repeated ids add up
                                                    : std::int32_t(rng() % std::uint64_t(vocab));
    p.logit_bias.push_back({id, edge_float(rng, -100.f, 100.f)});
  }
  return p;
}

// A history for the penalties: distinct tokens with counts from 0 to far past any context.
inline std::vector<std::pair<std::int32_t, std::int32_t>> edge_token_counts(std::mt19937_64& rng, std::int32_t vocab) {
  std::vector<std::int32_t> ids(std::size_t(rng() % 24));
  for (auto& id : ids) id = std::int32_t(rng() % std::uint64_t(vocab));
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::vector<std::pair<std::int32_t, std::int32_t>> counts;
  const std::int32_t ns[] = {0, 1, 2, 7, 1 << 20, std::numeric_limits<std::int32_t>::max()};
  for (std::int32_t id : ids) counts.push_back({id, ns[rng() % std::size(ns)]});
  return counts;
}

// The candidates the engine asks the worker for (engine/engine.cpp, candidates_for), capped at
// `cap` as the GPU worker caps them (kernels::candidates_max_k).
inline std::int32_t candidates_k(const sampler::sampling_params& p, std::int32_t cap = 256) {
  return std::min(std::max({p.top_k > 0 ? p.top_k : 64, p.logprobs, 1}), cap);
}

// The worker's processing for `p`, as the engine builds it (engine/engine.cpp), with `k` candidates.
inline gpu_worker::logit_params logit_params_of(const sampler::sampling_params& p,
                                                std::vector<std::pair<std::int32_t, std::int32_t>> counts,
                                                std::int32_t k) {
  return gpu_worker::logit_params{.temperature = p.temperature,
                                  .repetition_penalty = p.repetition_penalty,
                                  .presence_penalty = p.presence_penalty,
                                  .frequency_penalty = p.frequency_penalty,
                                  .token_counts = std::move(counts),
                                  .logit_bias = p.logit_bias,
                                  .top_k = k,
                                  .seed = p.seed,
                                  .draw = {.on = true, .top_k = p.top_k, .top_p = p.top_p, .min_p = p.min_p}};
}

// Raw logits as a model might produce them, finite but of any scale: ordinary, large, near the
// float range, and with -inf masks and ties.
inline std::vector<float> edge_logits(std::mt19937_64& rng, std::int32_t vocab) {
  const float scales[] = {1.f, 30.f, 1e4f, 1e30f, FLT_MAX / 4};
  const float scale = scales[rng() % std::size(scales)];
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> l(static_cast<std::size_t>(vocab));
  for (float& x : l) {
    x = std::clamp(normal(rng), -3.f, 3.f) * scale;
    if (rng() % 50 == 0) x = -INFINITY;
    if (rng() % 200 == 0) x = rng() % 2 ? FLT_MAX : -FLT_MAX;
  }
  l[rng() % l.size()] = 0.f;  // at least one finite logit
  return l;
}

}  // namespace anvil::testing
