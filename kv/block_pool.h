// block_pool: the logical block ids of the KV pool and where each one is — free (empty), cached
// (no sequence holds it; its KV is kept for prefix reuse and evicted least-recently-used first)
// or in use (held by refcount > 0 references from block tables).
//
// Every operation is O(1) and allocation-free: free ids sit on a stack and cached ids on an
// intrusive doubly linked list threaded through per-block links, all sized once at construction.
// The pool knows nothing about hashes: the caller says, when a block's last reference goes,
// whether its contents are worth keeping (indexed in the prefix cache), and learns from take()
// when a cached block was evicted so it can drop it from the index.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace anvil::kv {

using block_id = std::int32_t;
inline constexpr block_id no_block = -1;

class block_pool {
 public:
  explicit block_pool(std::int32_t n_blocks);

  std::int32_t size() const noexcept { return static_cast<std::int32_t>(ref_.size()); }
  std::int64_t free_count() const noexcept { return static_cast<std::int64_t>(free_.size()); }
  std::int64_t cached_count() const noexcept { return lru_size_; }
  std::int64_t in_use_count() const noexcept { return in_use_; }
  // Blocks take() can hand out: free ones, then cached ones (by eviction).
  std::int64_t available() const noexcept { return free_count() + cached_count(); }

  std::int32_t refcount(block_id b) const noexcept { return ref_[static_cast<std::size_t>(b)]; }
  bool is_cached(block_id b) const noexcept { return in_lru_[static_cast<std::size_t>(b)] != 0; }

  struct taken {
    block_id id = no_block;
    bool evicted = false;  // it was a cached block: the caller must forget its old contents
  };
  // A block with refcount 1: a free one if any, else the least recently used cached one.
  // Precondition: available() > 0.
  taken take();
  // One more reference. A cached block leaves the LRU and is in use again.
  void ref(block_id b);
  // One reference fewer. At zero the block becomes the most recently used cached block when
  // `keep_cached` (its contents are indexed for reuse), else free.
  void unref(block_id b, bool keep_cached);
  // A cached block whose contents are no longer wanted becomes free. Precondition: is_cached(b).
  void drop_cached(block_id b);

  // Structural self-check for kv_core::check(): free stack and LRU list well formed, disjoint,
  // holding only unreferenced blocks, counters matching. Returns an error message or "".
  std::string check() const;

 private:
  void lru_push_back(block_id b);
  void lru_remove(block_id b);

  std::vector<std::int32_t> ref_;     // per block: references from live block tables
  std::vector<block_id> free_;        // stack of free ids; capacity n_blocks, so push never reallocates
  std::vector<block_id> prev_;        // per block: LRU neighbour towards the head (less recent)
  std::vector<block_id> next_;        // per block: LRU neighbour towards the tail (more recent)
  std::vector<std::uint8_t> in_lru_;  // per block: 1 while cached
  block_id head_ = no_block;          // least recently used cached block: evicted first
  block_id tail_ = no_block;          // most recently used cached block
  std::int64_t lru_size_ = 0;
  std::int64_t in_use_ = 0;           // blocks with refcount > 0
};

}  // namespace anvil::kv
