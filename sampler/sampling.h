// Token choice from a step's logits: penalties, temperature, top-k, top-p, min-p and a seeded
// draw. Pure functions over plain numbers: the sampler actor (per-request state, candidates from
// the GPU worker) is built on them, and `anvil generate` uses them directly.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>

namespace anvil::sampler {

struct sampling_params {
  float temperature = 0.f;          // 0 picks the most likely token (greedy); else in (0, 100]
  std::int32_t top_k = 0;           // keep the k most likely tokens; 0 keeps all
  float top_p = 1.f;                // keep the smallest set whose probability reaches top_p; (0, 1]
  float min_p = 0.f;                // drop tokens less likely than min_p * the most likely; [0, 1)
  float repetition_penalty = 1.f;   // > 0; logits of seen tokens are divided (positive) or multiplied (negative)
  float presence_penalty = 0.f;     // [-2, 2]; subtracted once from every seen token
  float frequency_penalty = 0.f;    // [-2, 2]; subtracted once per occurrence
  std::uint64_t seed = 0;           // the request's RNG seed: same seed, same choices
};

// nullopt when valid, else a message naming the parameter and its allowed range.
std::optional<std::string> validate(const sampling_params& p);

// Chooses a token. `history` is what the penalties count (prompt and generated tokens);
// `rng` is the request's own generator, advanced by exactly one draw when sampling.
std::int32_t sample_token(std::span<const float> logits, const sampling_params& p,
                          std::span<const std::int32_t> history, std::mt19937_64& rng);

}  // namespace anvil::sampler
