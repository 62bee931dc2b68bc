#include "kv/block_pool.h"

#include <cassert>
#include <string>

namespace anvil::kv {

block_pool::block_pool(std::int32_t n_blocks)
    : ref_(static_cast<std::size_t>(n_blocks), 0),
      prev_(static_cast<std::size_t>(n_blocks), no_block),
      next_(static_cast<std::size_t>(n_blocks), no_block),
      in_lru_(static_cast<std::size_t>(n_blocks), 0) {
  assert(n_blocks > 0 && "block_pool: the pool needs at least one block");
  free_.reserve(static_cast<std::size_t>(n_blocks));
  // Highest id at the bottom of the stack, so fresh blocks come out 0, 1, 2, ...: easier to read
  // in logs and tests.
  for (block_id b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
}

block_pool::taken block_pool::take() {
  assert(available() > 0 && "block_pool::take: no free or cached block (check available() first)");
  taken t;
  if (!free_.empty()) {
    t.id = free_.back();
    free_.pop_back();
  } else {
    t.id = head_;
    t.evicted = true;
    lru_remove(t.id);
  }
  assert(ref_[static_cast<std::size_t>(t.id)] == 0 && "block_pool::take: a free or cached block had references");
  ref_[static_cast<std::size_t>(t.id)] = 1;
  ++in_use_;
  return t;
}

void block_pool::ref(block_id b) {
  std::int32_t& r = ref_[static_cast<std::size_t>(b)];
  if (r == 0) {
    // Only cached blocks can be taken back by reference; a free block holds nothing to share.
    assert(is_cached(b) && "block_pool::ref: referencing a free block");
    lru_remove(b);
    ++in_use_;
  }
  ++r;
}

void block_pool::unref(block_id b, bool keep_cached) {
  std::int32_t& r = ref_[static_cast<std::size_t>(b)];
  assert(r > 0 && "block_pool::unref: block has no references");
  if (--r > 0) return;
  --in_use_;
  if (keep_cached) {
    lru_push_back(b);
  } else {
    free_.push_back(b);
  }
}

void block_pool::drop_cached(block_id b) {
  lru_remove(b);
  free_.push_back(b);
}

void block_pool::lru_push_back(block_id b) {
  const auto i = static_cast<std::size_t>(b);
  prev_[i] = tail_;
  next_[i] = no_block;
  if (tail_ != no_block) {
    next_[static_cast<std::size_t>(tail_)] = b;
  } else {
    head_ = b;
  }
  tail_ = b;
  in_lru_[i] = 1;
  ++lru_size_;
}

void block_pool::lru_remove(block_id b) {
  const auto i = static_cast<std::size_t>(b);
  assert(in_lru_[i] && "block_pool: removing a block that is not cached");
  const block_id p = prev_[i], n = next_[i];
  if (p != no_block) {
    next_[static_cast<std::size_t>(p)] = n;
  } else {
    head_ = n;
  }
  if (n != no_block) {
    prev_[static_cast<std::size_t>(n)] = p;
  } else {
    tail_ = p;
  }
  prev_[i] = next_[i] = no_block;
  in_lru_[i] = 0;
  --lru_size_;
}

std::string block_pool::check() const {
  const std::int64_t n = size();
  std::vector<std::uint8_t> seen(static_cast<std::size_t>(n), 0);  // 1 free, 2 cached
  for (block_id b : free_) {
    if (b < 0 || b >= n) return "free list holds out-of-range block " + std::to_string(b);
    const auto i = static_cast<std::size_t>(b);
    if (seen[i]) return "block " + std::to_string(b) + " is on the free list twice";
    if (ref_[i] != 0) return "free block " + std::to_string(b) + " has refcount " + std::to_string(ref_[i]);
    if (in_lru_[i]) return "block " + std::to_string(b) + " is both free and cached";
    seen[i] = 1;
  }
  // Walk the LRU from the head, at most n steps (a corrupted list could cycle).
  std::int64_t walked = 0;
  block_id prev = no_block;
  for (block_id b = head_; b != no_block; b = next_[static_cast<std::size_t>(b)]) {
    if (b < 0 || b >= n) return "LRU holds out-of-range block " + std::to_string(b);
    const auto i = static_cast<std::size_t>(b);
    if (++walked > n) return "LRU list has a cycle";
    if (seen[i] == 1) return "block " + std::to_string(b) + " is both free and cached";
    if (seen[i] == 2) return "block " + std::to_string(b) + " is in the LRU twice";
    if (!in_lru_[i]) return "block " + std::to_string(b) + " is in the LRU but not marked cached";
    if (ref_[i] != 0) return "cached block " + std::to_string(b) + " has refcount " + std::to_string(ref_[i]);
    if (prev_[i] != prev) return "LRU back link of block " + std::to_string(b) + " is wrong";
    seen[i] = 2;
    prev = b;
  }
  if (prev != tail_) return "LRU tail does not end the list";
  if (walked != lru_size_) return "LRU size counter " + std::to_string(lru_size_) + " != list length " + std::to_string(walked);
  std::int64_t used = 0;
  for (std::int64_t b = 0; b < n; ++b) {
    const auto i = static_cast<std::size_t>(b);
    if (ref_[i] < 0) return "block " + std::to_string(b) + " has negative refcount";
    if (ref_[i] > 0) ++used;
    if (in_lru_[i] && seen[i] != 2) return "block " + std::to_string(b) + " is marked cached but not in the LRU";
    if (ref_[i] == 0 && seen[i] == 0) return "block " + std::to_string(b) + " is unreferenced but neither free nor cached (leaked)";
  }
  if (used != in_use_) return "in-use counter " + std::to_string(in_use_) + " != blocks referenced " + std::to_string(used);
  if (free_count() + cached_count() + in_use_count() != n) return "ledger does not sum to the pool size";
  return {};
}

}  // namespace anvil::kv
