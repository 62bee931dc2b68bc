#include "kv/block_index.h"

#include <bit>
#include <cassert>

namespace anvil::kv {

block_index::block_index(std::int32_t max_entries) : max_entries_(max_entries) {
  assert(max_entries > 0 && "block_index: needs room for at least one entry");
  const std::size_t capacity = std::bit_ceil(static_cast<std::size_t>(max_entries) * 2);
  slots_.resize(capacity);
  mask_ = capacity - 1;
  shift_ = 64 - std::countr_zero(capacity);
}

std::size_t block_index::home(std::uint64_t key) const noexcept {
  // Keys are already hashes, but a test hasher may hand out small or patterned ones: mix again
  // (Fibonacci hashing: the product's top bits) so they spread over the table.
  return static_cast<std::size_t>((key * 0x9e3779b97f4a7c15ull) >> shift_);
}

std::size_t block_index::find_slot(std::uint64_t key) const noexcept {
  std::size_t i = home(key);
  while (slots_[i].block != no_block && slots_[i].key != key) i = (i + 1) & mask_;
  return i;
}

block_id block_index::find(std::uint64_t key) const noexcept { return slots_[find_slot(key)].block; }

void block_index::insert(std::uint64_t key, block_id b) {
  assert(b != no_block && "block_index::insert: no_block is the empty marker");
  assert(size_ < max_entries_ && "block_index::insert: more entries than blocks");
  slot& s = slots_[find_slot(key)];
  assert(s.block == no_block && "block_index::insert: key already present");
  s = {key, b};
  ++size_;
}

void block_index::erase(std::uint64_t key) {
  std::size_t hole = find_slot(key);
  assert(slots_[hole].block != no_block && "block_index::erase: key absent");
  // Backward-shift deletion: pull later entries of the probe run into the hole whenever the hole
  // lies between their home slot and where they sit (cyclically), so no lookup ever stops early.
  for (std::size_t j = (hole + 1) & mask_; slots_[j].block != no_block; j = (j + 1) & mask_) {
    const std::size_t h = home(slots_[j].key);
    const bool movable = hole <= j ? (h <= hole || h > j) : (h <= hole && h > j);
    if (movable) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole] = {};
  --size_;
}

}  // namespace anvil::kv
