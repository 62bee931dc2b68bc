// block_index: the prefix cache's map from a block's chain hash to the block holding it.
//
// Open addressing with linear probing in a table sized once (a power of two, at least twice the
// number of blocks, so the load factor stays <= 1/2): find, insert and erase never allocate,
// unlike std::unordered_map's node per entry. Erase shifts the rest of the probe run back
// instead of leaving tombstones, so long runs of commits and evictions never degrade lookups.
// At most one entry per key: two blocks whose hashes collide cannot both be indexed (the prefix
// cache leaves the second one out).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kv/block_pool.h"

namespace anvil::kv {

class block_index {
 public:
  explicit block_index(std::int32_t max_entries);

  // The block indexed under `key`, or no_block.
  block_id find(std::uint64_t key) const noexcept;
  // Precondition: `key` is absent and size() < max_entries.
  void insert(std::uint64_t key, block_id b);
  // Precondition: `key` is present.
  void erase(std::uint64_t key);
  std::int64_t size() const noexcept { return size_; }

  // Visits every (key, block) entry, for check().
  template <class F>
  void for_each(F&& f) const {
    for (const slot& s : slots_) {
      if (s.block != no_block) f(s.key, s.block);
    }
  }

 private:
  struct slot {
    std::uint64_t key = 0;
    block_id block = no_block;  // no_block: empty slot
  };
  std::size_t home(std::uint64_t key) const noexcept;
  std::size_t find_slot(std::uint64_t key) const noexcept;  // the key's slot, or its empty slot

  std::vector<slot> slots_;
  std::size_t mask_ = 0;
  int shift_ = 63;  // 64 - log2(capacity): home() keeps the product's top bits
  std::int64_t size_ = 0;
  std::int64_t max_entries_ = 0;
};

}  // namespace anvil::kv
