// Helpers for the kv tests: op builders, a stand-in for the worker's physical KV pool that
// records which token each slot was computed from, and a back door that corrupts kv_core's state
// so the tests can show check() notices.
#pragma once

#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/kv_core.h"

namespace anvil::kv {

// Friend of kv_core (declared there): tests only.
struct kv_core_test_access {
  static block_pool& pool(kv_core& c) { return c.pool_; }
  static std::vector<block_id>& table(kv_core& c, std::uint64_t seq_id) { return c.seqs_.at(seq_id).table; }
  static std::int64_t& computed(kv_core& c, std::uint64_t seq_id) { return c.seqs_.at(seq_id).computed; }
  static std::int64_t& reserved(kv_core& c, std::uint64_t seq_id) { return c.seqs_.at(seq_id).reserved; }
  static std::vector<block_id>& window(kv_core& c, std::uint64_t seq_id) { return c.seqs_.at(seq_id).window; }
  static std::int64_t& trimmed(kv_core& c, std::uint64_t seq_id) { return c.seqs_.at(seq_id).trimmed; }
  static std::int32_t& state_slot(kv_core& c, std::uint64_t seq_id) { return c.seqs_.at(seq_id).state_slot; }
  static block_pool& state_pool(kv_core& c) { return *c.state_pool_; }
  static std::unordered_map<std::uint64_t, std::int32_t>& snapshots(kv_core& c) { return c.snapshots_; }
};

namespace testing {

// n tokens first, first+1, ...
inline std::vector<std::int32_t> iota_tokens(std::size_t n, std::int32_t first) {
  std::vector<std::int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

inline std::vector<std::int32_t> concat(std::vector<std::int32_t> a, const std::vector<std::int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline std::vector<block_id> table_of(const kv_core& c, std::uint64_t seq_id) {
  const auto t = c.block_table(seq_id);
  return {t.begin(), t.end()};
}

inline kv_op op_begin(std::uint64_t id, std::vector<std::int32_t> prompt) {
  kv_op op;
  op.op = kv_op::kind::begin;
  op.seq_id = id;
  op.tokens = std::move(prompt);
  return op;
}
inline kv_op op_reserve(std::uint64_t id, std::int64_t n, bool may_preempt = false, bool snapshot = false) {
  kv_op op;
  op.op = kv_op::kind::reserve;
  op.seq_id = id;
  op.n_tokens = n;
  op.may_preempt = may_preempt;
  op.snapshot = snapshot;
  return op;
}
inline kv_op op_commit(std::uint64_t id, std::vector<std::int32_t> tokens) {
  kv_op op;
  op.op = kv_op::kind::commit;
  op.seq_id = id;
  op.tokens = std::move(tokens);
  return op;
}
inline kv_op op_release(std::uint64_t id) {
  kv_op op;
  op.op = kv_op::kind::release;
  op.seq_id = id;
  return op;
}
inline kv_op op_fork(std::uint64_t id, std::uint64_t from) {
  kv_op op;
  op.op = kv_op::kind::fork;
  op.seq_id = id;
  op.fork_from = from;
  return op;
}

// The worker's physical KV pool reduced to what matters here. Real KV at position p depends on
// every token up to p, so slot (block, offset) remembers a fingerprint of the whole prefix its KV
// was computed from. Copy-on-write copies and step writes go through it as the worker would do
// them, so a test can ask whether a sequence reads back the KV of exactly its own tokens.
class fake_kv_pool {
 public:
  fake_kv_pool(std::int64_t n_blocks, std::int64_t block_size)
      : block_size_(block_size), slots_(static_cast<std::size_t>(n_blocks * block_size), 0) {}

  // The copies of this pool: the main one, or (window) the window pool.
  void copy(std::span<const gpu_worker::block_copy> copies, bool window = false) {
    for (const auto& c : copies) {
      if (c.window != window) continue;
      for (std::int64_t o = 0; o < block_size_; ++o) slot(c.dst, o) = slot(c.src, o);
    }
  }
  // The step computes positions [from, tokens.size()) of a sequence with this table.
  void write(std::span<const block_id> table, std::int64_t from, std::span<const std::int32_t> tokens) {
    std::uint64_t fp = 0;
    for (std::int64_t p = 0; p < static_cast<std::int64_t>(tokens.size()); ++p) {
      fp = extend(fp, tokens[static_cast<std::size_t>(p)]);
      if (p >= from) slot(table[static_cast<std::size_t>(p / block_size_)], p % block_size_) = fp;
    }
  }
  // "" when positions [first, n) hold the KV of tokens[0, n), else the first position that does not.
  std::string verify(std::span<const block_id> table, std::span<const std::int32_t> tokens, std::int64_t n,
                     std::int64_t first = 0) const {
    std::uint64_t fp = 0;
    for (std::int64_t p = 0; p < n; ++p) {
      fp = extend(fp, tokens[static_cast<std::size_t>(p)]);
      if (p < first) continue;
      const block_id b = table[static_cast<std::size_t>(p / block_size_)];
      if (slots_[static_cast<std::size_t>(b * block_size_ + p % block_size_)] != fp) {
        return "position " + std::to_string(p) + " (block " + std::to_string(b) + ") holds KV of another prefix";
      }
    }
    return {};
  }

  // The fingerprint of a prefix, one token further.
  static std::uint64_t extend(std::uint64_t fp, std::int32_t token) {
    std::uint64_t x = (fp ^ static_cast<std::uint32_t>(token)) * 0x9e3779b97f4a7c15ull + 1;
    x ^= x >> 29;
    return x * 0xbf58476d1ce4e5b9ull;
  }

 private:
  std::uint64_t& slot(block_id b, std::int64_t offset) { return slots_[static_cast<std::size_t>(b * block_size_ + offset)]; }

  std::int64_t block_size_;
  std::vector<std::uint64_t> slots_;  // 0: never written
};

}  // namespace testing
}  // namespace anvil::kv
