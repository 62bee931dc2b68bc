// How a worker splits its KV memory between the main pool (every layer that attends to the whole
// context) and the window pool (the sliding-window layers, kv_config::window), for models that
// have both. Pure arithmetic, shared by the CPU and GPU workers.
//
// The window pool is sized first, for the most window blocks the scheduler can ever ask of it:
// each of max_seqs sequences holds at most window_blocks_per_seq(window, 1) for a decode token,
// and a step feeds at most max_batch_tokens tokens beyond those. That bound keeps the
// window pool from being what refuses a step. It takes at most half the budget (beyond that the
// window pool can run out like the main one: an ordinary "no room"); the main pool takes the rest.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "model/arch/llm.h"

namespace anvil::gpu_worker {

struct kv_pools {
  std::int64_t n_blocks = 0;         // the main pool
  std::int64_t n_window_blocks = 0;  // the window pool (0: none)
  std::int64_t window = 0;           // the sliding layers' window, in positions (0: none)
};

// Whether the model has sliding-window layers beside layers that see the whole context, every
// sliding one with the same window: the case a window pool serves.
inline bool window_pool_fits(const model::hparams& hp) {
  bool sliding = false, global = false;
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {
    const std::int64_t w = hp.layer_window(l);
    if (w != 0 && w != hp.sliding_window) return false;
    (w > 0 ? sliding : global) = true;
  }
  return sliding && global;
}

// The state pool of a model with recurrent layers: a slot per sequence a step may hold and a
// quarter as many spare ones (at least one) for the prefix cache's state snapshots
// (kv_config::n_state_slots), taken from the budget before the KV pools, at most half of it (fewer
// sequences at once where that holds fewer slots than max_seqs). 0 for a model without recurrent
// layers (per_slot 0).
inline std::int64_t plan_state_slots(std::size_t budget, std::size_t per_slot, std::int64_t max_seqs) {
  if (per_slot == 0) return 0;
  return std::min<std::int64_t>(max_seqs + std::max<std::int64_t>(1, max_seqs / 4), std::int64_t(budget / 2 / per_slot));
}

// The most window blocks one sequence holds while it feeds `tokens` tokens: its window before the
// first of them (window - 1 positions) and the tokens themselves, laid over block boundaries (one
// partial block at each end), and one block a reserve covers ahead.
inline std::int64_t window_blocks_per_seq(std::int64_t window, std::int64_t tokens, std::int64_t block_size) {
  return (window - 1 + tokens + block_size - 1) / block_size + 2;
}

// per_block / per_window_block: the bytes of one block of the main pool's layers / the window
// pool's. window 0 (or no window pool wanted): the whole budget in the main pool.
inline kv_pools plan_kv_pools(std::size_t budget, std::size_t per_block, std::size_t per_window_block,
                              std::int64_t window, std::int64_t block_size, std::int64_t max_seqs,
                              std::int64_t max_batch_tokens) {
  if (window <= 0 || per_window_block == 0) return {.n_blocks = std::int64_t(budget / per_block)};
  const std::int64_t worst =
      max_seqs * window_blocks_per_seq(window, 1, block_size) + (max_batch_tokens + block_size - 1) / block_size;
  const std::int64_t window_blocks = std::min<std::int64_t>(worst, std::int64_t(budget / 2 / per_window_block));
  const std::size_t rest = budget - std::size_t(window_blocks) * per_window_block;
  return {.n_blocks = std::int64_t(rest / per_block), .n_window_blocks = window_blocks, .window = window};
}

}  // namespace anvil::gpu_worker
