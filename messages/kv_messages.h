// Messages between the scheduler and the KV-cache manager: one kv_batch per step, applied in
// order, answered by one kv_batch_result. Integers only: sequence ids, token ids, block ids.
//
// A sequence's life: `begin` (looks up the longest cached prefix of its prompt and takes those
// blocks), then a `reserve` before every step that grows it (allocates blocks, copy-on-write for
// shared partial blocks), `commit` after the step (full blocks enter the prefix cache), and
// `release` when it finishes, is cancelled or is preempted. `fork` makes a sequence share
// another's blocks (parallel samples). Running out of blocks is an ordinary answer ("no room"):
// a reserve marked may_preempt may release the batch's victims, in order, until it fits.
#pragma once

#include <cstdint>
#include <vector>

#include "messages/step.h"

namespace anvil::kv {

struct kv_config {
  std::int64_t n_blocks = 0;       // the pool size the worker's memory plan allows
  std::int64_t block_size = 16;    // tokens per block
  bool prefix_caching = true;      // reuse blocks of identical prefixes (by hash chain of their tokens)
  // Sliding-window layers (gemma3, gpt-oss) keep their KV in a pool of their own, the window
  // pool, in a second block table per sequence. A window block goes back to the pool once every
  // position it holds lies before the window of the sequence's next query, so a long sequence
  // holds about window / block_size of them. 0: no window pool (every layer in the main pool).
  // Needs prefix_caching off: a cached prefix would need the window's blocks before it too.
  std::int64_t window = 0;           // positions a query sees, its own included
  std::int64_t n_window_blocks = 0;  // the window pool's size (window > 0)
  // Recurrent layers (gated DeltaNet: qwen35) keep a fixed-size state per sequence instead of KV,
  // in one of n_state_slots slots the worker allocated at start-up. A sequence takes a slot at its
  // first reserve (none free: no room, like blocks) and gives it back at release; a state cannot be
  // shared, so such sequences are not forked. 0: the model has no recurrent layers.
  // With prefix caching, a cached prefix also needs the state after it: a reserve marked `snapshot`
  // takes a spare slot that the worker fills with the sequence's state after the step, and once
  // the step's blocks are committed it is that prefix's snapshot — cached, evicted least recently
  // used first (by a sequence needing a slot, or with the prefix's last block). begin hands out a
  // cached prefix only up to its last block with a snapshot; the first reserve then copies it.
  std::int64_t n_state_slots = 0;
};

// free + cached + in_use == total, always.
struct ledger {
  std::int64_t free = 0;     // empty blocks
  std::int64_t cached = 0;   // blocks no live sequence holds, kept for prefix reuse, evicted LRU
  std::int64_t in_use = 0;   // blocks held by at least one live sequence
  std::int64_t total = 0;
};

struct kv_op {
  enum class kind { begin, reserve, commit, release, fork };
  kind op = kind::reserve;
  std::uint64_t seq_id = 0;
  std::vector<std::int32_t> tokens;  // begin: the prompt; commit: every token whose KV is now computed
  std::int64_t n_tokens = 0;         // reserve: positions the sequence must hold after the step
  bool may_preempt = false;          // reserve: may release the batch's victims to make room
  std::uint64_t fork_from = 0;       // fork: the sequence whose blocks seq_id shares
  // reserve, with state slots and prefix caching: keep the state after this step (n_tokens, a
  // block boundary) as the snapshot of the prefix it ends, when a slot is spare (best effort).
  bool snapshot = false;
};

struct kv_batch {
  std::vector<kv_op> ops;              // applied in order
  std::vector<std::uint64_t> victims;  // lowest priority first: released one by one when a may_preempt reserve has no room
  std::uint64_t step = 0;              // the scheduler's step number, for logs (step=) only
};

struct kv_op_result {
  std::uint64_t seq_id = 0;
  bool ok = true;                      // reserve: false = no room (nothing was allocated for it)
  bool preempted = false;              // the sequence was released as a victim earlier in this batch
  std::int64_t cached_tokens = 0;      // begin: prompt tokens whose KV the prefix cache already holds
  std::vector<std::int32_t> block_table;           // reserve / begin / fork: the table after the op
  // With a window pool, the same positions' window blocks; entries before the window are -1.
  std::vector<std::int32_t> window_table;
  std::int32_t state_slot = -1;                    // with state slots: the sequence's (-1 before its first reserve)
  std::vector<gpu_worker::block_copy> copies;      // reserve: copy-on-write copies the worker must do first
  // reserve, the first of a sequence that began on a cached prefix: the snapshot slot whose state
  // the worker copies into state_slot before the step. -1 for none.
  std::int32_t state_from = -1;
  // reserve marked snapshot: the slot the worker copies state_slot into after the step. -1 for none.
  std::int32_t snapshot_slot = -1;
};

struct kv_batch_result {
  std::vector<kv_op_result> results;   // one per op, in order
  std::vector<std::uint64_t> preempted;  // victims released, in order
  ledger counts;                       // after the batch
  ledger window_counts;                // the window pool's (all 0 without one; never cached)
  ledger state_counts;                 // the state slots' (all 0 without them; cached: prefix snapshots)
};

struct kv_stats {
  ledger counts;
  ledger window_counts;
  ledger state_counts;
  std::int64_t prefix_queries = 0;     // prompt tokens looked up by begin
  std::int64_t prefix_hits = 0;        // of those, tokens found cached
  std::int64_t evictions = 0;          // cached blocks reused for new data
  std::int64_t preemptions = 0;        // victims released
  // State slots with prefix caching: recurrent states kept as a prefix's snapshot, and prompt
  // tokens whose KV was cached but recomputed because no snapshot held the state after them.
  std::int64_t state_snapshots = 0;
  std::int64_t prefix_state_misses = 0;
};

}  // namespace anvil::kv
