// Requests the engine suites build (engine_test, the fault suites, the GPU suites): prompts of
// byte tokens of the synthetic vocabulary, and greedy requests that ignore end-of-generation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace anvil::testing {

inline std::vector<std::int32_t> random_prompt(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = std::int32_t(rng() % 256);  // byte tokens of the synthetic vocabulary
  return t;
}

inline generate_request greedy_request(std::vector<std::int32_t> prompt, std::int64_t max_tokens) {
  generate_request r;
  r.prompt_tokens = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

// Request `i` of the one-rule tests' mixed traffic (the CPU arena's, engine_test; the GPU
// runtime's, gpu_worker_test): greedy, but every third sampled with top-p, penalties and a bias on
// token `biased`, and every seventh asking for logprobs.
inline generate_request mixed_request(std::vector<std::int32_t> prompt, std::int64_t max_tokens, int i,
                                      std::int32_t biased) {
  generate_request r = greedy_request(std::move(prompt), max_tokens);
  if (i % 3 == 1) {
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.9f;
    r.sampling.seed = std::uint64_t(i);
    r.sampling.repetition_penalty = 1.1f;
    r.sampling.frequency_penalty = 0.2f;
    r.sampling.logit_bias = {{biased, 3.f}};
  }
  if (i % 7 == 0) r.sampling.logprobs = 5;
  return r;
}

// Request `i` of the overlapped-step suites (engine_test, gpu_worker_test): every kind of draw the
// worker makes for a step planned ahead — greedy, temperature alone, top-k, top-p, min-p, a logit
// bias, logprobs — and every fifth with a presence penalty (which keeps its steps serial); seeded
// by `i`, lengths 5..20, ending at end-of-generation tokens where the model draws them.
inline generate_request sampling_kinds_request(std::vector<std::int32_t> prompt, int i) {
  generate_request r;
  r.prompt_tokens = std::move(prompt);
  r.max_tokens = 5 + (i * 7) % 16;
  r.sampling.seed = std::uint64_t(1000 + i);
  switch (i % 6) {
    case 0: break;  // greedy
    case 1: r.sampling.temperature = 1.2f; break;
    case 2: r.sampling.temperature = 0.9f; r.sampling.top_k = 8; break;
    case 3: r.sampling.temperature = 0.8f; r.sampling.top_p = 0.85f; break;
    case 4: r.sampling.temperature = 1.0f; r.sampling.min_p = 0.05f; r.sampling.logit_bias = {{7, 2.f}}; break;
    case 5: r.sampling.temperature = 0.7f; r.sampling.logprobs = 3; break;
  }
  if (i % 5 == 4) r.sampling.presence_penalty = 0.5f;
  return r;
}

}  // namespace anvil::testing
