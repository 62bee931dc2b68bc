// Greedy tokens of one prompt on the reference forward pass, run alone: what the engine must give
// for the same request (engine_test, the fault suites); and the logits after a context, to tell a
// near tie where a GPU run parts from them (gpu_worker_test, engine_test on a GPU machine).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "model/arch/cpu_forward.h"

namespace anvil::model::testing {

// One sequence alone on the reference forward pass: a cache of blocks 0.. for `positions`
// positions, and the state slot its recurrent layers use (0; -1 for a model without them).
struct alone_on_reference {
  std::int32_t slot;
  kv_cache_storage cache;
  std::vector<std::int32_t> table;
  cpu_forward fwd;
  std::vector<float> logits;  // the last run's

  alone_on_reference(const llm& m, std::int64_t positions, kernels::kv_dtype kv_cache_dtype)
      : slot(m.hp.has_recurrent() ? 0 : -1),
        cache(m.hp, (positions + 15) / 16, 16, kv_cache_dtype, std::pmr::get_default_resource(), 0, slot + 1),
        table(static_cast<std::size_t>((positions + 15) / 16)),
        fwd(m) {
    for (std::size_t i = 0; i < table.size(); ++i) table[i] = std::int32_t(i);
  }
  // Feeds `tokens` at positions from `start`; logits holds the last one's.
  void run(std::span<const std::int32_t> tokens, std::int64_t start) {
    const forward_seq step{.tokens = tokens, .start_pos = start, .block_table = table, .state_slot = slot};
    fwd.run(std::span(&step, 1), cache, logits);
  }
};

inline std::vector<std::int32_t> reference_greedy(const llm& m, const std::vector<std::int32_t>& prompt, std::int64_t n,
                                                  kernels::kv_dtype kv_cache_dtype = kernels::kv_dtype::f16) {
  alone_on_reference r(m, std::int64_t(prompt.size()) + n, kv_cache_dtype);
  std::vector<std::int32_t> seq = prompt, out;
  r.run(seq, 0);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto next = std::int32_t(std::max_element(r.logits.begin(), r.logits.end()) - r.logits.begin());
    out.push_back(next);
    seq.push_back(next);
    if (i + 1 == n) break;
    r.run(std::span(&seq.back(), 1), std::int64_t(seq.size()) - 1);
  }
  return out;
}

// The reference forward pass's logits after `tokens` (the last position's).
inline std::vector<float> reference_logits(const llm& m, const std::vector<std::int32_t>& tokens,
                                           kernels::kv_dtype kv_cache_dtype = kernels::kv_dtype::f16) {
  alone_on_reference r(m, std::int64_t(tokens.size()), kv_cache_dtype);
  r.run(tokens, 0);
  return std::move(r.logits);
}

}  // namespace anvil::model::testing
