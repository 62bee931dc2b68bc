#include "kv/prefix_cache.h"

#include <algorithm>
#include <cassert>

namespace anvil::kv {

namespace {

std::uint64_t mix64(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

}  // namespace

std::uint64_t default_block_hash(std::uint64_t parent_hash, std::span<const std::int32_t> tokens) noexcept {
  std::uint64_t h = mix64(parent_hash ^ (0x9e3779b97f4a7c15ull * (tokens.size() + 1)));
  for (std::int32_t t : tokens) h = mix64(h + static_cast<std::uint32_t>(t) + 0x9e3779b97f4a7c15ull);
  return h;
}

prefix_cache::prefix_cache(std::int32_t n_blocks, std::int32_t block_size, block_hasher hasher)
    : block_size_(block_size),
      hasher_(hasher),
      meta_(static_cast<std::size_t>(n_blocks)),
      tokens_(static_cast<std::size_t>(n_blocks) * static_cast<std::size_t>(block_size)),
      index_(n_blocks) {
  assert(hasher_ != nullptr && "prefix_cache: a block hasher is required");
}

std::span<const std::int32_t> prefix_cache::stored_tokens(block_id b) const {
  return {tokens_.data() + static_cast<std::size_t>(b) * static_cast<std::size_t>(block_size_),
          static_cast<std::size_t>(block_size_)};
}

block_id prefix_cache::find(std::uint64_t hash, std::uint64_t parent_serial,
                            std::span<const std::int32_t> tokens) const {
  const block_id b = index_.find(hash);
  if (b == no_block) return no_block;
  const block_meta& m = meta_[static_cast<std::size_t>(b)];
  // The hash says "probably"; the parent's serial and the tokens say "certainly".
  if (m.parent_serial != parent_serial) return no_block;
  if (!std::ranges::equal(stored_tokens(b), tokens)) return no_block;
  return b;
}

std::uint64_t prefix_cache::add(block_id b, std::uint64_t hash, std::uint64_t parent_hash,
                                std::uint64_t parent_serial, std::span<const std::int32_t> tokens) {
  assert(static_cast<std::int64_t>(tokens.size()) == block_size_ && "prefix_cache::add: only full blocks are indexed");
  assert(!indexed(b) && "prefix_cache::add: block already indexed");
  if (parent_serial == no_serial) return no_serial;  // unreachable prefix: indexing b would waste a slot
  const block_id existing = index_.find(hash);
  if (existing != no_block) {
    return find(hash, parent_serial, tokens) == existing ? serial(existing) : no_serial;
  }
  block_meta& m = meta_[static_cast<std::size_t>(b)];
  m = {hash, parent_hash, next_serial_++, parent_serial, true};
  std::ranges::copy(tokens, tokens_.begin() + static_cast<std::ptrdiff_t>(b) * block_size_);
  index_.insert(hash, b);
  return m.serial;
}

void prefix_cache::erase(block_id b) {
  block_meta& m = meta_[static_cast<std::size_t>(b)];
  assert(m.indexed && "prefix_cache::erase: block not indexed");
  index_.erase(m.hash);
  m = {};
}

std::string prefix_cache::check() const {
  std::string err;
  index_.for_each([&](std::uint64_t key, block_id b) {
    if (!err.empty()) return;
    if (b < 0 || static_cast<std::size_t>(b) >= meta_.size()) {
      err = "prefix index holds out-of-range block " + std::to_string(b);
    } else if (!meta_[static_cast<std::size_t>(b)].indexed) {
      err = "prefix index points at block " + std::to_string(b) + ", which is not marked indexed";
    } else if (meta_[static_cast<std::size_t>(b)].hash != key) {
      err = "prefix index key of block " + std::to_string(b) + " differs from its recorded hash";
    }
  });
  if (!err.empty()) return err;
  std::int64_t marked = 0;
  for (std::size_t i = 0; i < meta_.size(); ++i) {
    const block_meta& m = meta_[i];
    if (!m.indexed) continue;
    ++marked;
    const auto b = static_cast<block_id>(i);
    if (index_.find(m.hash) != b) return "indexed block " + std::to_string(b) + " is not found under its hash";
    if (hasher_(m.parent_hash, stored_tokens(b)) != m.hash) {
      return "indexed block " + std::to_string(b) + " has a hash that does not match its tokens";
    }
    if (m.serial == root_serial || m.serial == no_serial || m.serial >= next_serial_ || m.parent_serial >= m.serial) {
      return "indexed block " + std::to_string(b) + " has an impossible serial";
    }
  }
  if (marked != index_.size()) return "prefix index size differs from the number of indexed blocks";
  return {};
}

}  // namespace anvil::kv
