#include "gpu_worker/plan_check.h"

#include <algorithm>

namespace anvil::gpu_worker {

std::string check_plan(const step_plan& plan, const memory_plan& mem) {
  if (plan.seqs.empty()) return "a step needs at least one sequence";
  if (std::int64_t(plan.seqs.size()) > mem.max_seqs) return "more sequences than max_seqs";
  std::int64_t tokens = 0;
  for (const block_copy& c : plan.copies) {
    const std::int64_t n = c.window ? mem.n_window_blocks : mem.n_blocks;
    if (c.src < 0 || c.src >= n || c.dst < 0 || c.dst >= n) return "block copy out of range";
  }
  for (const auto* list : {&plan.state_copies, &plan.state_snapshots}) {
    for (const state_copy& c : *list) {
      if (c.src < 0 || c.src >= mem.n_state_slots || c.dst < 0 || c.dst >= mem.n_state_slots || c.src == c.dst) {
        return "state copy out of range";
      }
    }
  }
  for (const seq_step& s : plan.seqs) {
    const std::string where = "seq " + std::to_string(s.seq_id) + ": ";
    if (s.tokens.empty()) return where + "no tokens";
    if (s.start_pos < 0) return where + "negative position";
    tokens += std::int64_t(s.tokens.size());
    const std::int64_t end = s.start_pos + std::int64_t(s.tokens.size());
    if (std::int64_t(s.block_table.size()) * mem.block_size < end) return where + "block table too short";
    for (std::int32_t b : s.block_table) {
      if (b < 0 || b >= mem.n_blocks) return where + "block id out of range";
    }
    if (mem.n_window_blocks > 0) {
      // The window layers read from the first fed token's window on; -1 before it.
      if (s.window_table.size() != s.block_table.size()) return where + "the window table does not match the block table";
      const std::int64_t first = first_window_block(s.start_pos, mem.window, mem.block_size);
      for (std::size_t k = 0; k < s.window_table.size(); ++k) {
        const std::int32_t b = s.window_table[k];
        if (b < (std::int64_t(k) < first ? -1 : 0) || b >= mem.n_window_blocks) return where + "window block id out of range";
      }
    } else if (!s.window_table.empty()) {
      return where + "a window table without a window pool";
    }
    if (mem.n_state_slots > 0 ? s.state_slot < 0 || s.state_slot >= mem.n_state_slots : s.state_slot != -1) {
      return where + "state slot out of range";
    }
    if (s.feed_from >= 0) {  // one placeholder, for the token the step before drew
      if (s.tokens.size() != 1) return where + "a fed sequence feeds exactly one token";
    } else {
      for (std::int32_t t : s.tokens) {
        if (t < 0 || t >= mem.n_vocab) return where + "token id out of range";
      }
    }
    if (s.want_candidates && s.logits.top_k < 1) return where + "top_k must be at least 1";
    if (!s.logits.allowed.empty() && std::int64_t(s.logits.allowed.size()) != (mem.n_vocab + 31) / 32) {
      return where + "the mask does not cover the vocabulary";
    }
    if (s.mask_deferred && (!s.want_candidates || !s.logits.allowed.empty())) {
      return where + "a deferred mask needs candidates and no mask yet";
    }
    if (!s.score_targets.empty()) {
      if (s.score_targets.size() != s.tokens.size()) return where + "score_targets must have one entry per fed token";
      for (std::int32_t t : s.score_targets) {
        if (t < -1 || t >= mem.n_vocab) return where + "score target out of range";
      }
    }
  }
  if (tokens > mem.max_batch_tokens) return "more tokens than max_batch_tokens";
  return "";
}

}  // namespace anvil::gpu_worker
