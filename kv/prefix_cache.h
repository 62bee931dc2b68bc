// prefix_cache: which blocks hold reusable KV, and for which prefix.
//
// A full block is keyed by a hash chain: hash(block i) = H(hash(block i-1), tokens of block i),
// so equal keys mean (almost surely) equal whole prefixes. "Almost" is not enough to hand out KV,
// so a hit is verified exactly: the block's stored tokens must equal the query's, and its parent
// must be the very block the lookup matched one level up. Parents are named by a *serial*, a
// number given to each block when it is indexed and never reused — a block id is reused after
// eviction, a serial is not — so by induction a verified chain of hits holds exactly the query's
// prefix, whatever the hash function does. A colliding hash only costs a cache miss.
//
// The hash function is injectable (block_hasher) so tests can force collisions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kv/block_index.h"
#include "kv/block_pool.h"

namespace anvil::kv {

using block_hasher = std::uint64_t (*)(std::uint64_t parent_hash, std::span<const std::int32_t> tokens);

// A fast 64-bit chain hash (splitmix64 finalizer per token). Not cryptographic: it need not be.
std::uint64_t default_block_hash(std::uint64_t parent_hash, std::span<const std::int32_t> tokens) noexcept;

inline constexpr std::uint64_t root_hash = 0xcbf29ce484222325ull;  // the chain's start (block -1)
inline constexpr std::uint64_t root_serial = 0;                    // the empty prefix's name
inline constexpr std::uint64_t no_serial = ~std::uint64_t{0};      // a prefix the index does not hold

class prefix_cache {
 public:
  prefix_cache(std::int32_t n_blocks, std::int32_t block_size, block_hasher hasher);

  std::uint64_t hash(std::uint64_t parent_hash, std::span<const std::int32_t> tokens) const {
    return hasher_(parent_hash, tokens);
  }

  // The indexed block keyed `hash` that holds exactly `tokens` right after the indexed prefix
  // named `parent_serial`, or no_block.
  block_id find(std::uint64_t hash, std::uint64_t parent_serial, std::span<const std::int32_t> tokens) const;

  // Offers block b, holding `tokens` after the prefix (parent_hash, parent_serial), to the index.
  // Returns the serial that now names this prefix: b's new one; or, when an identical block is
  // already indexed, that block's (b stays out: the existing one keeps serving hits); or
  // no_serial when a different block owns the hash (a collision: b stays out, and so must every
  // block after it, since nothing can reach them).
  std::uint64_t add(block_id b, std::uint64_t hash, std::uint64_t parent_hash, std::uint64_t parent_serial,
                    std::span<const std::int32_t> tokens);

  // Forgets block b (it was evicted and will be overwritten). Precondition: indexed(b).
  void erase(block_id b);

  bool indexed(block_id b) const noexcept { return meta_[static_cast<std::size_t>(b)].indexed; }
  std::uint64_t serial(block_id b) const noexcept { return meta_[static_cast<std::size_t>(b)].serial; }
  std::int64_t size() const noexcept { return index_.size(); }

  // Index <-> per-block metadata agree and every indexed block's key is the hash of its stored
  // parent hash and tokens. Returns an error message or "".
  std::string check() const;

 private:
  struct block_meta {
    std::uint64_t hash = 0;           // chain hash: the block's key in index_
    std::uint64_t parent_hash = 0;    // hash of the block before it (root_hash for block 0)
    std::uint64_t serial = 0;         // this block's name as a prefix (unique, never reused)
    std::uint64_t parent_serial = 0;  // the name of the prefix it extends
    bool indexed = false;
  };
  std::span<const std::int32_t> stored_tokens(block_id b) const;

  std::int32_t block_size_;
  block_hasher hasher_;
  std::vector<block_meta> meta_;      // per block
  std::vector<std::int32_t> tokens_;  // per block, block_size_ tokens: what an indexed block holds
  block_index index_;
  std::uint64_t next_serial_ = root_serial + 1;
};

}  // namespace anvil::kv
