// Token choice from a step's logits: logit bias, penalties, temperature, top-k, top-p, min-p and
// a seeded draw. Pure functions over plain numbers: `anvil generate` uses them directly, and they
// are the reference the sampler actor (sampler_core.h: the same choice from the GPU worker's
// candidates) is tested against.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace anvil::sampler {

struct sampling_params {
  float temperature = 0.f;          // [0, 100]; below gpu_worker::min_temperature (1e-5) picks the most likely token (greedy)
  std::int32_t top_k = 0;           // keep the k most likely tokens; 0 keeps all
  float top_p = 1.f;                // keep the smallest set whose probability reaches top_p; (0, 1]
  float min_p = 0.f;                // drop tokens less likely than min_p * the most likely; [0, 1)
  float repetition_penalty = 1.f;   // > 0; logits of seen tokens are divided (positive) or multiplied (negative)
  float presence_penalty = 0.f;     // [-2, 2]; subtracted once from every seen token
  float frequency_penalty = 0.f;    // [-2, 2]; subtracted once per occurrence
  std::uint64_t seed = 0;           // the request's RNG seed: same seed, same choices
  std::int32_t logprobs = 0;        // most likely alternatives to report with each token, [0, 20]
  std::vector<std::pair<std::int32_t, float>> logit_bias;  // (token, added to its logit first); [-100, 100]
};

// The most alternatives a request may ask for (OpenAI's top_logprobs limit).
inline constexpr std::int32_t max_logprobs = 20;

// nullopt when valid, else a message naming the parameter and its allowed range. With a known
// vocab_size (> 0) the logit_bias token ids are checked against it too.
std::optional<std::string> validate(const sampling_params& p, std::int64_t vocab_size = 0);

// A uniform double in [0, 1) from exactly one draw (the top 53 bits), the same on every
// platform; every sampled token costs its request exactly this one draw.
double uniform01(std::mt19937_64& rng);

// Chooses a token: bias, then penalties (each through gpu_worker::keep_finite, as the worker
// applies them), then temperature, then top-k, top-p, min-p (bias ids
// outside the vocabulary are skipped; validate() rejects them). `history` is what the penalties
// count (prompt and generated tokens); `rng` is the request's own generator, advanced by exactly
// one draw when sampling.
std::int32_t sample_token(std::span<const float> logits, const sampling_params& p,
                          std::span<const std::int32_t> history, std::mt19937_64& rng);

}  // namespace anvil::sampler
