// kv_core: the KV-cache manager's pure core — logical block ids, per-sequence block tables,
// refcounts, the prefix cache and the block ledger. Plain synchronous C++ (no Asio, no logging):
// the kv_manager actor wraps it, and tests drive it directly.
//
// A sequence's life (see kv_messages.h): begin (take the longest cached prefix of the prompt),
// reserve before each step that grows it (allocate; copy-on-write for blocks it will write into
// that another table shares or the prefix cache vouches for), commit after the step (newly full blocks enter the prefix cache), release at the end.
// fork shares a sequence's blocks with a new one. Running out of blocks is an ordinary answer;
// misuse (an unknown or already-live sequence id, committing past what was reserved) is a caller
// bug and throws std::logic_error before changing anything. Internal invariants assert.
//
// Costs: every op is O(blocks it touches) — begin O(prompt), reserve O(new blocks + blocks
// written), commit O(newly full blocks x block_size), release/fork O(table) — with no scans of
// the pool; check() is the O(pool + tables) audit the scheduler runs after each step in debug.
//
// With a window pool (kv_config::window), each sequence also has a window table over the same
// positions: reserve grows both (all or nothing, copy-on-write in both), and commit gives back
// the window blocks wholly before the window of the next query (at position `computed`: it sees
// [computed - window + 1, computed]), leaving -1 (no_block) in their entries.
//
// With state slots (kv_config::n_state_slots), each sequence also holds one slot from its first
// reserve (all or nothing with its blocks) to its release. The slots are a block_pool of their own:
// free, cached (a prefix's snapshot, kept for sequences that share the prefix, evicted LRU) or in
// use (a sequence's state, a snapshot being written, or a snapshot a begun sequence resumes from).
// With prefix caching a snapshot is named by the prefix cache's serial of the prefix it ends, and
// dies with that prefix's last block.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv/block_pool.h"
#include "messages/kv_messages.h"
#include "kv/prefix_cache.h"

namespace anvil::kv {

struct reserve_result {
  bool ok = true;                               // false: no room, nothing changed
  std::vector<gpu_worker::block_copy> copies;   // copy-on-write copies the worker must do first
  std::int32_t state_from = -1;                 // the snapshot to copy into the sequence's slot first
  std::int32_t snapshot_slot = -1;              // the slot to copy the sequence's state into after the step
};

class kv_core {
 public:
  // Throws std::invalid_argument for a config it cannot run (no blocks, block_size < 1, a pool
  // beyond int32 block ids, a window pool with prefix caching). `hasher` is the prefix cache's
  // chain hash (tests inject weak ones).
  explicit kv_core(const kv_config& config, block_hasher hasher = default_block_hash);

  // Starts seq_id with its prompt. With prefix caching, takes the longest run of cached full
  // blocks matching the prompt, capped so the last prompt token is always computed — and, with
  // state slots, at the last of them with a state snapshot, which the sequence then pins until
  // its first reserve copies it. Returns the prompt tokens whose KV is already there (a multiple
  // of block_size).
  std::int64_t begin(std::uint64_t seq_id, std::span<const std::int32_t> prompt);
  // Makes the table cover positions [0, n_tokens); the step writes [computed, n_tokens), so
  // shared or indexed blocks in that range are swapped for copies (reported). All or nothing.
  // `snapshot` (kv_op::snapshot): also take a spare state slot for the state after the step, when
  // there is one; it becomes the prefix's snapshot at the commit of exactly n_tokens.
  [[nodiscard]] reserve_result reserve(std::uint64_t seq_id, std::int64_t n_tokens, bool snapshot = false);
  // The KV of `tokens` (the sequence's whole token list so far) is computed. Needs
  // tokens.size() between the computed count and what this sequence's reserves covered.
  void commit(std::uint64_t seq_id, std::span<const std::int32_t> tokens);
  // Drops the sequence and its references; blocks with indexed contents stay cached.
  void release(std::uint64_t seq_id);
  // seq_id (new) shares from's computed blocks (those holding positions [0, computed)) and its
  // computed count; blocks `from` reserved ahead stay its own.
  void fork(std::uint64_t seq_id, std::uint64_t from);

  // Executes a batch in order; see kv_messages.h and apply.cpp for preemption.
  kv_batch_result apply(const kv_batch& batch);

  bool live(std::uint64_t seq_id) const { return seqs_.contains(seq_id); }
  std::span<const block_id> block_table(std::uint64_t seq_id) const;
  std::span<const block_id> window_table(std::uint64_t seq_id) const;  // empty without a window pool
  std::int32_t state_slot(std::uint64_t seq_id) const;  // -1 without state slots or before its first reserve
  std::int64_t computed(std::uint64_t seq_id) const;
  std::int64_t live_count() const noexcept { return static_cast<std::int64_t>(seqs_.size()); }

  kv::ledger ledger() const noexcept;
  kv::ledger window_ledger() const noexcept;  // all 0 without a window pool
  kv::ledger state_ledger() const noexcept;   // the state slots' (all 0 without them)
  kv_stats stats() const noexcept;
  const kv_config& config() const noexcept { return config_; }

  // Recomputes everything from scratch and compares: refcounts from every live table, the
  // ledger, free list / LRU structure, prefix index <-> block states. An error message, or "".
  std::string check() const;

 private:
  friend struct kv_core_test_access;  // tests only: corrupts state to prove check() notices

  struct sequence {
    std::vector<block_id> table;             // block of positions [i*block_size, (i+1)*block_size)
    std::int64_t computed = 0;               // positions [0, computed) hold computed KV
    std::int64_t reserved = 0;               // positions [0, reserved) this sequence reserved: commit's bound
    std::int64_t hashed = 0;                 // leading full blocks already offered to the prefix cache
    std::uint64_t chain_hash = root_hash;    // hash of block hashed-1
    std::uint64_t chain_serial = root_serial;  // the index's name for blocks [0, hashed); no_serial if none
    std::vector<block_id> window;            // window pool: the same positions' blocks, no_block before `trimmed`
    std::int64_t trimmed = 0;                // window blocks [0, trimmed) are given back
    std::int32_t state_slot = -1;            // state slots: its slot from its first reserve on
    std::int32_t resume_slot = -1;           // the snapshot begin pinned for its first reserve
    // Snapshots being written, oldest first: a slot and the positions whose state it receives.
    // More than one when a step is planned before the one before it has committed.
    std::vector<std::pair<std::int32_t, std::int64_t>> snapshots;
  };

  sequence& live_seq(std::uint64_t seq_id, const char* op);
  const sequence& live_seq(std::uint64_t seq_id, const char* op) const;
  std::int64_t blocks_for(std::int64_t n_tokens) const noexcept;
  // Blocks reserve(s, n_tokens) would take from the pool (new ones plus copy-on-write copies).
  std::int64_t blocks_needed(const sequence& s, std::int64_t n_tokens) const noexcept;
  // The same from the window pool.
  std::int64_t window_blocks_needed(const sequence& s, std::int64_t n_tokens) const noexcept;
  // Gives back the window blocks the next query no longer sees.
  void trim_window(sequence& s);
  // A block the sequence is about to write into must be copied first: another table reads it,
  // or the prefix cache vouches for its contents.
  bool must_copy(block_id b) const noexcept;
  block_id take_block();
  void drop_block(block_id b);
  void index_full_blocks(sequence& s, std::span<const std::int32_t> tokens);
  // State slots: one for a sequence or a snapshot (a free one, else the LRU snapshot's).
  // Precondition: state_pool_->available() > 0.
  std::int32_t take_slot();
  // The prefix named `serial` is gone from the index: so is its snapshot, if any.
  void forget_snapshot(std::uint64_t serial);
  // The pending snapshots of s that its commit reached become their prefixes', or go back.
  void settle_snapshots(sequence& s);

  // apply() helpers (apply.cpp).
  kv_op_result apply_op(const kv_op& op, const std::vector<std::uint64_t>& victims, kv_batch_result& out,
                        std::vector<std::uint64_t>& gone);
  void tables_into(std::uint64_t seq_id, kv_op_result& r) const;  // a result's block_table and window_table
  std::string check_window() const;  // check()'s part for the window pool (check.cpp)
  std::string check_state_slots() const;  // and for the state slots
  void reserve_preempting(const kv_op& op, const std::vector<std::uint64_t>& victims, kv_batch_result& out,
                          std::vector<std::uint64_t>& gone, kv_op_result& r);

  kv_config config_;
  std::int64_t block_size_;
  block_pool pool_;
  std::optional<block_pool> window_pool_;  // engaged with a window
  std::optional<prefix_cache> cache_;  // engaged when prefix caching is on
  std::unordered_map<std::uint64_t, sequence> seqs_;
  std::optional<block_pool> state_pool_;   // engaged with state slots
  std::unordered_map<std::uint64_t, std::int32_t> snapshots_;  // prefix serial -> the slot holding the state after it
  std::vector<std::uint64_t> snapshot_serial_;                 // per slot: the prefix it is the snapshot of, or no_serial
  kv_stats stats_;
};

}  // namespace anvil::kv
