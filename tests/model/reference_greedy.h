// Greedy tokens of one prompt on the reference forward pass, run alone: what the engine must give
// for the same request (engine_test, the fault suites); and the logits after a context, to tell a
// near tie where a GPU run parts from them (gpu_worker_test, engine_test on a GPU machine).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "model/arch/cpu_forward.h"

namespace anvil::model::testing {

inline std::vector<std::int32_t> reference_greedy(const llm& m, const std::vector<std::int32_t>& prompt, std::int64_t n,
                                                  kernels::kv_dtype kv_cache_dtype = kernels::kv_dtype::f16) {
  const std::int64_t blocks = (std::int64_t(prompt.size()) + n + 15) / 16;
  const std::int32_t slot = m.hp.has_recurrent() ? 0 : -1;  // recurrent layers: their state in slot 0
  kv_cache_storage cache(m.hp, blocks, 16, kv_cache_dtype, std::pmr::get_default_resource(), 0, slot + 1);
  std::vector<std::int32_t> table(static_cast<std::size_t>(blocks));
  for (std::int64_t i = 0; i < blocks; ++i) table[std::size_t(i)] = std::int32_t(i);
  cpu_forward fwd(m);
  std::vector<float> logits;
  std::vector<std::int32_t> seq = prompt, out;
  forward_seq step{.tokens = seq, .start_pos = 0, .block_table = table, .state_slot = slot};
  fwd.run(std::span(&step, 1), cache, logits);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto next = std::int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    seq.push_back(next);
    if (i + 1 == n) break;
    step = {.tokens = std::span(&seq.back(), 1), .start_pos = std::int64_t(seq.size()) - 1, .block_table = table,
            .state_slot = slot};
    fwd.run(std::span(&step, 1), cache, logits);
  }
  return out;
}

// The reference forward pass's logits after `tokens` (the last position's).
inline std::vector<float> reference_logits(const llm& m, const std::vector<std::int32_t>& tokens,
                                           kernels::kv_dtype kv_cache_dtype = kernels::kv_dtype::f16) {
  const std::int64_t blocks = (std::int64_t(tokens.size()) + 15) / 16;
  const std::int32_t slot = m.hp.has_recurrent() ? 0 : -1;  // recurrent layers: their state in slot 0
  kv_cache_storage cache(m.hp, blocks, 16, kv_cache_dtype, std::pmr::get_default_resource(), 0, slot + 1);
  std::vector<std::int32_t> table(static_cast<std::size_t>(blocks));
  for (std::int64_t i = 0; i < blocks; ++i) table[std::size_t(i)] = std::int32_t(i);
  cpu_forward fwd(m);
  std::vector<float> logits;
  const forward_seq step{.tokens = tokens, .start_pos = 0, .block_table = table, .state_slot = slot};
  fwd.run(std::span(&step, 1), cache, logits);
  return logits;
}

}  // namespace anvil::model::testing
