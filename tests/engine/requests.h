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

}  // namespace anvil::testing
