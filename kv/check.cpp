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

// The state slots: refcounts recounted from every live sequence (its own slot, a snapshot being
// written, a snapshot it will resume from); a slot holding a snapshot is named both ways, cached
// or pinned, and its prefix is in the index; every cached slot is a snapshot.
std::string kv_core::check_state_slots() const {
  if (!state_pool_) {
    for (const auto& [id, s] : seqs_) {
      if (s.state_slot >= 0 || s.resume_slot >= 0 || !s.snapshots.empty()) return seq_str(id) + " holds a state slot without any";
    }
    return snapshots_.empty() ? std::string{} : "snapshots without state slots";
  }
  if (std::string e = state_pool_->check(); !e.empty()) return "state slots: " + e;
  const std::int32_t n = state_pool_->size();
  std::vector<std::int32_t> refs(static_cast<std::size_t>(n), 0), pins(static_cast<std::size_t>(n), 0);
  for (const auto& [id, s] : seqs_) {
    if (s.state_slot < 0 && s.reserved > s.computed) return seq_str(id) + " reserved a step without a state slot";
    if (s.state_slot >= 0 && s.resume_slot >= 0) return seq_str(id) + " holds its state slot and still a snapshot to resume from";
    std::vector<std::int32_t> held{s.state_slot, s.resume_slot};
    std::int64_t after = s.computed;
    for (const auto& [slot, at] : s.snapshots) {
      held.push_back(slot);
      if (slot < 0 || !cache_ || at <= after || at % block_size_ != 0 || at > s.reserved) {
        return seq_str(id) + ": a snapshot after " + std::to_string(at) + " positions it cannot commit";
      }
      after = at;
    }
    for (const std::int32_t slot : held) {
      if (slot < -1 || slot >= n) return seq_str(id) + " holds out-of-range state slot " + std::to_string(slot);
      if (slot >= 0) ++refs[static_cast<std::size_t>(slot)];
    }
    if (s.resume_slot >= 0) ++pins[static_cast<std::size_t>(s.resume_slot)];
  }
  std::vector<std::uint64_t> indexed_serials;
  if (cache_) {
    for (block_id b = 0; b < pool_.size(); ++b) {
      if (cache_->indexed(b)) indexed_serials.push_back(cache_->serial(b));
    }
    std::sort(indexed_serials.begin(), indexed_serials.end());
  }
  for (std::int32_t slot = 0; slot < n; ++slot) {
    const auto i = static_cast<std::size_t>(slot);
    const std::string name = "state slot " + std::to_string(slot);
    if (refs[i] != state_pool_->refcount(slot)) {
      return name + ": refcount " + std::to_string(state_pool_->refcount(slot)) + " but live sequences hold it " +
             std::to_string(refs[i]) + " times";
    }
    const std::uint64_t serial = snapshot_serial_[i];
    if (serial == no_serial) {
      if (state_pool_->is_cached(slot)) return name + " is cached but no prefix's snapshot";
      if (pins[i] > 0) return name + " is pinned but no prefix's snapshot";
      continue;
    }
    const auto it = snapshots_.find(serial);
    if (it == snapshots_.end() || it->second != slot) return name + " names a prefix whose snapshot is elsewhere";
    if (pins[i] != refs[i]) return name + " is a snapshot and a sequence's own state";
    if (refs[i] == 0 && !state_pool_->is_cached(slot)) return name + " is a snapshot but free";
    if (!std::binary_search(indexed_serials.begin(), indexed_serials.end(), serial)) {
      return name + " is the snapshot of a prefix the index no longer holds";
    }
  }
  for (const auto& [serial, slot] : snapshots_) {
    if (slot < 0 || slot >= n || snapshot_serial_[static_cast<std::size_t>(slot)] != serial) {
      return "the snapshot of prefix " + std::to_string(serial) + " names slot " + std::to_string(slot) + ", which disagrees";
    }
  }
  const kv::ledger l = state_ledger();
  if (l.free + l.cached + l.in_use != l.total || l.total != n) return "the state slots' ledger does not sum to their count";
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
