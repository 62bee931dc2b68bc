// kv_core::check: the audit the scheduler runs after every step in debug builds. It trusts no
// counter: refcounts are recounted from every live block table, the pool's lists are walked, and
// the prefix index is compared with the block states. The first problem found is returned.
#include <algorithm>
#include <string>
#include <vector>

#include "kv/kv_core.h"

namespace anvil::kv {

namespace {

std::string block_str(block_id b) { return "block " + std::to_string(b); }
std::string seq_str(std::uint64_t id) { return "seq " + std::to_string(id); }

}  // namespace

std::string kv_core::check() const {
  if (std::string e = pool_.check(); !e.empty()) return "block pool: " + e;
  if (cache_) {
    if (std::string e = cache_->check(); !e.empty()) return "prefix cache: " + e;
  }
  const std::int32_t n = pool_.size();
  std::vector<std::int32_t> refs(static_cast<std::size_t>(n), 0);
  std::vector<std::int64_t> last_holder(static_cast<std::size_t>(n), -1);  // catches a block twice in one table
  std::int64_t holder = 0;
  for (const auto& [id, s] : seqs_) {
    const auto n_table = static_cast<std::int64_t>(s.table.size());
    if (s.computed < 0 || s.computed > s.reserved || s.reserved > n_table * block_size_) {
      return seq_str(id) + ": computed " + std::to_string(s.computed) + " / reserved " + std::to_string(s.reserved) +
             " outside its " + std::to_string(n_table) + " blocks";
    }
    const std::int64_t full = s.computed / block_size_;
    if (s.hashed != (cache_ ? full : 0)) return seq_str(id) + ": full blocks not offered to the prefix cache";
    for (std::int64_t k = 0; k < n_table; ++k) {
      const block_id b = s.table[static_cast<std::size_t>(k)];
      if (b < 0 || b >= n) return seq_str(id) + " holds out-of-range " + block_str(b);
      const auto i = static_cast<std::size_t>(b);
      if (last_holder[i] == holder) return seq_str(id) + " holds " + block_str(b) + " twice";
      last_holder[i] = holder;
      ++refs[i];
    }
    ++holder;
  }
  for (block_id b = 0; b < n; ++b) {
    const auto i = static_cast<std::size_t>(b);
    if (refs[i] != pool_.refcount(b)) {
      return block_str(b) + ": refcount " + std::to_string(pool_.refcount(b)) + " but live tables hold it " +
             std::to_string(refs[i]) + " times";
    }
    const bool indexed = cache_ && cache_->indexed(b);
    if (pool_.is_cached(b) && !indexed) return block_str(b) + " is cached but not in the prefix index (unreachable)";
    if (indexed && refs[i] == 0 && !pool_.is_cached(b)) return block_str(b) + " is indexed but free";
  }
  const kv::ledger l = ledger();
  if (l.free + l.cached + l.in_use != l.total || l.total != n) return "ledger does not sum to the pool size";
  if (std::string e = check_window(); !e.empty()) return e;
  return check_state_slots();
}

// The state slots: each live sequence's in range and its own, the free ones the rest, once each.
std::string kv_core::check_state_slots() const {
  const std::int64_t n = config_.n_state_slots;
  std::vector<std::int8_t> seen(static_cast<std::size_t>(n), 0);
  for (const auto& [id, s] : seqs_) {
    if (s.state_slot < 0) {
      if (n > 0 && s.reserved > s.computed) return seq_str(id) + " reserved a step without a state slot";
      continue;
    }
    if (s.state_slot >= n) return seq_str(id) + " holds out-of-range state slot " + std::to_string(s.state_slot);
    if (seen[static_cast<std::size_t>(s.state_slot)]++) return "state slot " + std::to_string(s.state_slot) + " held twice";
  }
  for (std::int32_t f : free_slots_) {
    if (f < 0 || f >= n) return "out-of-range free state slot " + std::to_string(f);
    if (seen[static_cast<std::size_t>(f)]++) return "state slot " + std::to_string(f) + " is free and held, or free twice";
  }
  for (std::int64_t i = 0; i < n; ++i) {
    if (!seen[static_cast<std::size_t>(i)]) return "state slot " + std::to_string(i) + " is neither free nor held";
  }
  return {};
}

// The window pool: each table as long as the main one, given back exactly up to the next query's
// window, refcounts recounted, nothing cached.
std::string kv_core::check_window() const {
  if (!window_pool_) {
    for (const auto& [id, s] : seqs_) {
      if (!s.window.empty() || s.trimmed != 0) return seq_str(id) + " has a window table without a window pool";
    }
    return {};
  }
  if (std::string e = window_pool_->check(); !e.empty()) return "window pool: " + e;
  const std::int32_t n = window_pool_->size();
  std::vector<std::int32_t> refs(static_cast<std::size_t>(n), 0);
  std::vector<std::int64_t> last_holder(static_cast<std::size_t>(n), -1);
  std::int64_t holder = 0;
  for (const auto& [id, s] : seqs_) {
    ++holder;
    if (s.window.size() != s.table.size()) {
      return seq_str(id) + ": " + std::to_string(s.window.size()) + " window blocks for " + std::to_string(s.table.size()) +
             " blocks";
    }
    const std::int64_t want_trimmed = std::min(gpu_worker::first_window_block(s.computed, config_.window, block_size_),
                                               static_cast<std::int64_t>(s.window.size()));
    if (s.trimmed != want_trimmed) {
      return seq_str(id) + ": window blocks given back up to " + std::to_string(s.trimmed) + ", the window needs " +
             std::to_string(want_trimmed);
    }
    for (std::int64_t k = 0; k < static_cast<std::int64_t>(s.window.size()); ++k) {
      const block_id b = s.window[static_cast<std::size_t>(k)];
      if (k < s.trimmed) {
        if (b != no_block) return seq_str(id) + " keeps window " + block_str(b) + " it gave back";
        continue;
      }
      if (b < 0 || b >= n) return seq_str(id) + " holds out-of-range window " + block_str(b);
      const auto i = static_cast<std::size_t>(b);
      if (last_holder[i] == holder) return seq_str(id) + " holds window " + block_str(b) + " twice";
      last_holder[i] = holder;
      ++refs[i];
    }
  }
  for (block_id b = 0; b < n; ++b) {
    const std::int32_t held = refs[static_cast<std::size_t>(b)];
    if (held != window_pool_->refcount(b)) {
      return "window " + block_str(b) + ": refcount " + std::to_string(window_pool_->refcount(b)) +
             " but live tables hold it " + std::to_string(held) + " times";
    }
    if (window_pool_->is_cached(b)) return "window " + block_str(b) + " is cached";
  }
  return {};
}

}  // namespace anvil::kv
