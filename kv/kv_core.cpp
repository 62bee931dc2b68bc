#include "kv/kv_core.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

namespace anvil::kv {

namespace {

[[noreturn]] void caller_bug(const char* op, std::uint64_t seq_id, const std::string& what) {
  throw std::logic_error(std::string("kv_core::") + op + " seq " + std::to_string(seq_id) + ": " + what);
}

std::int32_t checked_pool_size(const kv_config& c) {
  if (c.n_blocks < 1 || c.n_blocks > std::numeric_limits<std::int32_t>::max()) {
    throw std::invalid_argument("kv_config: n_blocks must be in [1, 2^31), got " + std::to_string(c.n_blocks));
  }
  if (c.block_size < 1 || c.block_size > (std::int64_t{1} << 20)) {
    throw std::invalid_argument("kv_config: block_size must be in [1, 2^20], got " + std::to_string(c.block_size));
  }
  return static_cast<std::int32_t>(c.n_blocks);
}

}  // namespace

kv_core::kv_core(const kv_config& config, block_hasher hasher)
    : config_(config), block_size_(config.block_size), pool_(checked_pool_size(config)) {
  if (config_.window < 0) throw std::invalid_argument("kv_config: negative window " + std::to_string(config_.window));
  if (config_.window > 0) {
    if (config_.prefix_caching) throw std::invalid_argument("kv_config: a window pool needs prefix caching off");
    if (config_.n_window_blocks < 1 || config_.n_window_blocks > std::numeric_limits<std::int32_t>::max()) {
      throw std::invalid_argument("kv_config: n_window_blocks must be in [1, 2^31), got " +
                                  std::to_string(config_.n_window_blocks));
    }
    window_pool_.emplace(static_cast<std::int32_t>(config_.n_window_blocks));
  }
  if (config_.n_state_slots < 0 || config_.n_state_slots > std::numeric_limits<std::int32_t>::max()) {
    throw std::invalid_argument("kv_config: n_state_slots must be in [0, 2^31), got " + std::to_string(config_.n_state_slots));
  }
  if (config_.n_state_slots > 0) {
    state_pool_.emplace(static_cast<std::int32_t>(config_.n_state_slots));
    snapshot_serial_.assign(static_cast<std::size_t>(config_.n_state_slots), no_serial);
  }
  if (config_.prefix_caching) {
    cache_.emplace(pool_.size(), static_cast<std::int32_t>(block_size_), hasher);
  }
}

kv_core::sequence& kv_core::live_seq(std::uint64_t seq_id, const char* op) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) caller_bug(op, seq_id, "no such live sequence");
  return it->second;
}

const kv_core::sequence& kv_core::live_seq(std::uint64_t seq_id, const char* op) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) caller_bug(op, seq_id, "no such live sequence");
  return it->second;
}

std::int64_t kv_core::blocks_for(std::int64_t n_tokens) const noexcept {
  return (n_tokens + block_size_ - 1) / block_size_;
}

block_id kv_core::take_block() {
  const block_pool::taken t = pool_.take();
  if (t.evicted) {
    // The block's old KV is about to be overwritten: it must no longer answer prefix lookups,
    // and the state after the prefix it ended is of no use without it.
    if (state_pool_) forget_snapshot(cache_->serial(t.id));
    cache_->erase(t.id);
    ++stats_.evictions;
  }
  return t.id;
}

std::int32_t kv_core::take_slot() {
  const block_pool::taken t = state_pool_->take();
  if (t.evicted) {
    auto& serial = snapshot_serial_[static_cast<std::size_t>(t.id)];
    snapshots_.erase(serial);
    serial = no_serial;
  }
  return t.id;
}

void kv_core::forget_snapshot(std::uint64_t serial) {
  const auto it = snapshots_.find(serial);
  if (it == snapshots_.end()) return;
  // A pinned snapshot's prefix is held by the sequence that pinned it: its blocks are not evicted.
  assert(state_pool_->is_cached(it->second) && "kv_core: the prefix of a pinned snapshot was evicted");
  state_pool_->drop_cached(it->second);
  snapshot_serial_[static_cast<std::size_t>(it->second)] = no_serial;
  snapshots_.erase(it);
}

void kv_core::settle_snapshots(sequence& s) {
  std::size_t done = 0;
  for (; done < s.snapshots.size() && s.snapshots[done].second <= s.computed; ++done) {
    const auto [slot, at] = s.snapshots[done];
    // The worker wrote the state after `at` positions: it names a prefix only when this commit
    // covered exactly those and their blocks are indexed.
    const bool exact = s.computed == at && s.hashed * block_size_ == at && s.chain_serial != no_serial;
    if (!exact || snapshots_.contains(s.chain_serial)) {
      state_pool_->unref(slot, false);
      continue;
    }
    snapshots_.emplace(s.chain_serial, slot);
    snapshot_serial_[static_cast<std::size_t>(slot)] = s.chain_serial;
    state_pool_->unref(slot, true);
    ++stats_.state_snapshots;
  }
  s.snapshots.erase(s.snapshots.begin(), s.snapshots.begin() + static_cast<std::ptrdiff_t>(done));
}

void kv_core::drop_block(block_id b) { pool_.unref(b, cache_ && cache_->indexed(b)); }

bool kv_core::must_copy(block_id b) const noexcept {
  // Indexed but held by this sequence alone happens after a fork raced a commit: the source
  // filled and committed a block the fork still shares, then let go of it. Its KV belongs to the
  // source's tokens and may serve prefix hits: never overwrite it.
  return pool_.refcount(b) > 1 || (cache_ && cache_->indexed(b));
}

std::int64_t kv_core::begin(std::uint64_t seq_id, std::span<const std::int32_t> prompt) {
  if (seqs_.contains(seq_id)) caller_bug("begin", seq_id, "sequence is already live");
  sequence s;
  if (cache_) {
    // Never hand out the block holding the last prompt token: that token must be computed to get
    // the next-token distribution, and a block that is written into must not be a shared one.
    const auto n = static_cast<std::int64_t>(prompt.size());
    const std::int64_t max_blocks = n > 0 ? (n - 1) / block_size_ : 0;
    const auto bs = static_cast<std::size_t>(block_size_);
    s.table.reserve(static_cast<std::size_t>(blocks_for(n)));
    // With state slots, the blocks up to the last one ending in a snapshot: (blocks, hash, serial).
    std::tuple<std::size_t, std::uint64_t, std::uint64_t> resumable{0, root_hash, root_serial};
    std::int32_t resume = -1;
    for (std::int64_t i = 0; i < max_blocks; ++i) {
      const auto toks = prompt.subspan(static_cast<std::size_t>(i) * bs, bs);
      const std::uint64_t h = cache_->hash(s.chain_hash, toks);
      const block_id b = cache_->find(h, s.chain_serial, toks);
      if (b == no_block) break;
      pool_.ref(b);
      s.table.push_back(b);
      s.chain_hash = h;
      s.chain_serial = cache_->serial(b);
      if (const auto snap = snapshots_.find(s.chain_serial); snap != snapshots_.end()) {
        resumable = {s.table.size(), s.chain_hash, s.chain_serial};
        resume = snap->second;
      }
    }
    if (state_pool_) {
      // The recurrent layers need the state after the prefix: without it the KV alone is no use.
      const std::size_t keep = std::get<0>(resumable);
      stats_.prefix_state_misses += static_cast<std::int64_t>(s.table.size() - keep) * block_size_;
      while (s.table.size() > keep) {
        drop_block(s.table.back());
        s.table.pop_back();
      }
      std::tie(std::ignore, s.chain_hash, s.chain_serial) = resumable;
      if (resume >= 0) {
        state_pool_->ref(resume);
        s.resume_slot = resume;
      }
    }
    s.hashed = static_cast<std::int64_t>(s.table.size());
    s.computed = s.reserved = s.hashed * block_size_;
    stats_.prefix_queries += n;
    stats_.prefix_hits += s.computed;
  }
  const std::int64_t cached = s.computed;
  seqs_.emplace(seq_id, std::move(s));
  return cached;
}

std::int64_t kv_core::blocks_needed(const sequence& s, std::int64_t n_tokens) const noexcept {
  const auto have = static_cast<std::int64_t>(s.table.size());
  const std::int64_t want = blocks_for(n_tokens);
  std::int64_t need = std::max<std::int64_t>(0, want - have);
  if (n_tokens > s.computed) {
    // Existing blocks the step writes into: from the one holding position `computed` on.
    for (std::int64_t k = s.computed / block_size_; k < std::min(have, want); ++k) {
      if (must_copy(s.table[static_cast<std::size_t>(k)])) ++need;
    }
  }
  return need;
}

std::int64_t kv_core::window_blocks_needed(const sequence& s, std::int64_t n_tokens) const noexcept {
  if (!window_pool_) return 0;
  const auto have = static_cast<std::int64_t>(s.window.size());
  const std::int64_t want = blocks_for(n_tokens);
  std::int64_t need = std::max<std::int64_t>(0, want - have);
  if (n_tokens > s.computed) {
    // Window blocks are never indexed: only a fork shares them.
    for (std::int64_t k = std::max(s.trimmed, s.computed / block_size_); k < std::min(have, want); ++k) {
      if (window_pool_->refcount(s.window[static_cast<std::size_t>(k)]) > 1) ++need;
    }
  }
  return need;
}

reserve_result kv_core::reserve(std::uint64_t seq_id, std::int64_t n_tokens, bool snapshot) {
  sequence& s = live_seq(seq_id, "reserve");
  if (n_tokens < 0) caller_bug("reserve", seq_id, "negative n_tokens " + std::to_string(n_tokens));
  if (blocks_needed(s, n_tokens) > pool_.available()) return {false, {}};
  if (window_pool_ && window_blocks_needed(s, n_tokens) > window_pool_->available()) return {false, {}};
  const bool needs_slot = state_pool_ && s.state_slot < 0 && n_tokens > s.computed;  // its first step
  if (needs_slot && state_pool_->available() == 0) return {false, {}};

  reserve_result r;
  const auto have = static_cast<std::int64_t>(s.table.size());
  const std::int64_t want = blocks_for(n_tokens);
  if (n_tokens > s.computed) {
    for (std::int64_t k = s.computed / block_size_; k < std::min(have, want); ++k) {
      block_id& slot = s.table[static_cast<std::size_t>(k)];
      if (must_copy(slot)) {
        // Copy-on-write: typically a fork's shared partial block.
        const block_id dst = take_block();
        r.copies.push_back({slot, dst});
        drop_block(slot);
        slot = dst;
      }
      assert(!must_copy(slot) && "kv_core::reserve: about to write into a shared or indexed block");
    }
  }
  for (std::int64_t k = have; k < want; ++k) s.table.push_back(take_block());
  if (window_pool_) {
    const auto whave = static_cast<std::int64_t>(s.window.size());
    if (n_tokens > s.computed) {
      for (std::int64_t k = std::max(s.trimmed, s.computed / block_size_); k < std::min(whave, want); ++k) {
        block_id& slot = s.window[static_cast<std::size_t>(k)];
        if (window_pool_->refcount(slot) > 1) {
          const block_id dst = window_pool_->take().id;
          r.copies.push_back({.src = slot, .dst = dst, .window = true});
          window_pool_->unref(slot, false);
          slot = dst;
        }
      }
    }
    for (std::int64_t k = whave; k < want; ++k) s.window.push_back(window_pool_->take().id);
  }
  if (needs_slot) {
    s.state_slot = take_slot();
    if (s.resume_slot >= 0) {
      // Its first step continues the cached prefix: the snapshot's state comes first.
      r.state_from = std::exchange(s.resume_slot, -1);
      state_pool_->unref(r.state_from, true);  // its copy happens before any later step writes the slot
    }
  }
  if (snapshot && cache_ && state_pool_ && n_tokens > s.computed && n_tokens % block_size_ == 0 &&
      (s.snapshots.empty() || s.snapshots.back().second < n_tokens) && state_pool_->available() > 0) {
    r.snapshot_slot = take_slot();
    s.snapshots.emplace_back(r.snapshot_slot, n_tokens);
  }
  s.reserved = std::max(s.reserved, n_tokens);
  return r;
}

void kv_core::commit(std::uint64_t seq_id, std::span<const std::int32_t> tokens) {
  sequence& s = live_seq(seq_id, "commit");
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (n > s.reserved) {
    caller_bug("commit", seq_id, std::to_string(n) + " tokens but only " + std::to_string(s.reserved) + " positions reserved");
  }
  if (n < s.computed) {
    caller_bug("commit", seq_id, std::to_string(n) + " tokens but " + std::to_string(s.computed) + " already computed");
  }
  s.computed = n;
  if (cache_) index_full_blocks(s, tokens);
  if (window_pool_) trim_window(s);
  if (!s.snapshots.empty()) settle_snapshots(s);
}

void kv_core::trim_window(sequence& s) {
  // The next query sits at position `computed` and sees [computed - window + 1, computed].
  const std::int64_t keep_from = std::min(gpu_worker::first_window_block(s.computed, config_.window, block_size_),
                                          static_cast<std::int64_t>(s.window.size()));
  for (; s.trimmed < keep_from; ++s.trimmed) {
    block_id& b = s.window[static_cast<std::size_t>(s.trimmed)];
    window_pool_->unref(b, false);
    b = no_block;
  }
}

void kv_core::index_full_blocks(sequence& s, std::span<const std::int32_t> tokens) {
  const std::int64_t full = s.computed / block_size_;
  if (s.chain_serial == no_serial) {
    s.hashed = full;  // the prefix fell out of the index (a collision): nothing after it is reachable
    return;
  }
  const auto bs = static_cast<std::size_t>(block_size_);
  for (; s.hashed < full; ++s.hashed) {
    const auto toks = tokens.subspan(static_cast<std::size_t>(s.hashed) * bs, bs);
    const std::uint64_t h = cache_->hash(s.chain_hash, toks);
    const block_id b = s.table[static_cast<std::size_t>(s.hashed)];
    // An identical block already indexed keeps serving hits; b stays this sequence's own.
    s.chain_serial = cache_->add(b, h, s.chain_hash, s.chain_serial, toks);
    s.chain_hash = h;
    if (s.chain_serial == no_serial) {
      s.hashed = full;
      return;
    }
  }
}

void kv_core::release(std::uint64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) caller_bug("release", seq_id, "no such live sequence");
  // Last block first: it reaches the LRU first, so it is evicted before the blocks in front of
  // it. Evicting a prefix's head would strand every block after it.
  const std::vector<block_id>& table = it->second.table;
  for (auto b = table.rbegin(); b != table.rend(); ++b) drop_block(*b);
  const sequence& s = it->second;
  for (std::size_t k = static_cast<std::size_t>(s.trimmed); k < s.window.size(); ++k) window_pool_->unref(s.window[k], false);
  if (s.state_slot >= 0) state_pool_->unref(s.state_slot, false);
  if (s.resume_slot >= 0) state_pool_->unref(s.resume_slot, true);
  for (const auto& [slot, at] : s.snapshots) state_pool_->unref(slot, false);  // their steps never committed
  seqs_.erase(it);
}

void kv_core::fork(std::uint64_t seq_id, std::uint64_t from) {
  if (seqs_.contains(seq_id)) caller_bug("fork", seq_id, "sequence is already live");
  const sequence& src = live_seq(from, "fork (source)");
  if (state_pool_) caller_bug("fork", seq_id, "sequences with a recurrent state cannot share it");
  sequence copy = src;
  // Blocks `from` reserved beyond its computed positions hold nothing to share yet; sharing them
  // would only cost the fork a copy of each at its first reserve.
  copy.table.resize(static_cast<std::size_t>(blocks_for(src.computed)));
  copy.reserved = src.computed;
  for (block_id b : copy.table) pool_.ref(b);
  if (window_pool_) {
    copy.window.resize(copy.table.size());  // trimmed <= computed / block_size: the entries kept
    for (std::size_t k = static_cast<std::size_t>(copy.trimmed); k < copy.window.size(); ++k) window_pool_->ref(copy.window[k]);
  }
  seqs_.emplace(seq_id, std::move(copy));
}

std::span<const block_id> kv_core::block_table(std::uint64_t seq_id) const {
  return live_seq(seq_id, "block_table").table;
}

std::span<const block_id> kv_core::window_table(std::uint64_t seq_id) const {
  return live_seq(seq_id, "window_table").window;
}

std::int32_t kv_core::state_slot(std::uint64_t seq_id) const { return live_seq(seq_id, "state_slot").state_slot; }

std::int64_t kv_core::computed(std::uint64_t seq_id) const { return live_seq(seq_id, "computed").computed; }

kv::ledger kv_core::ledger() const noexcept {
  return {pool_.free_count(), pool_.cached_count(), pool_.in_use_count(), pool_.size()};
}

kv::ledger kv_core::window_ledger() const noexcept {
  if (!window_pool_) return {};
  return {window_pool_->free_count(), window_pool_->cached_count(), window_pool_->in_use_count(), window_pool_->size()};
}

kv::ledger kv_core::state_ledger() const noexcept {
  if (!state_pool_) return {};
  return {state_pool_->free_count(), state_pool_->cached_count(), state_pool_->in_use_count(), state_pool_->size()};
}

kv_stats kv_core::stats() const noexcept {
  kv_stats s = stats_;
  s.counts = ledger();
  s.window_counts = window_ledger();
  s.state_counts = state_ledger();
  return s;
}

}  // namespace anvil::kv
