// Paged KV cache and causal attention over it: the layout the GPU worker uses, defined here.
//
// One layer's cache is [n_blocks][block_size][n_kv_heads][head_dim] floats for K and the same
// for V. A sequence owns a block table: position p lives in block table[p / block_size] at
// offset p % block_size. kv_write stores the K/V of new tokens at their slots; attention lets
// each query token attend to every position up to its own (causal), with grouped-query heads
// (query head h reads kv head h / (n_heads / n_kv_heads)).
#pragma once

#include <cstdint>
#include <span>

namespace anvil::kernels {

struct paged_kv_view {
  float* k = nullptr;              // [n_blocks][block_size][n_kv_heads][head_dim]
  float* v = nullptr;              // same shape as k
  std::int64_t n_blocks = 0;
  std::int64_t block_size = 0;
  std::int64_t n_kv_heads = 0;
  std::int64_t head_dim = 0;
};

// The device cache: the same layout, stored as IEEE f16 (the bits in a std::uint16_t, so host
// code needs no vendor half type). Kernels read it into f32 and compute in f32.
struct paged_kv_f16 {
  std::uint16_t* k = nullptr;      // [n_blocks][block_size][n_kv_heads][head_dim]
  std::uint16_t* v = nullptr;      // same shape as k
  std::int64_t n_blocks = 0;
  std::int64_t block_size = 0;
  std::int64_t n_kv_heads = 0;
  std::int64_t head_dim = 0;
};

struct kv_write_params {
  paged_kv_view cache;
  const float* k = nullptr;              // [n_tokens, n_kv_heads, head_dim]
  const float* v = nullptr;              // [n_tokens, n_kv_heads, head_dim]
  const std::int64_t* slots = nullptr;   // [n_tokens]: block_id * block_size + offset
  std::int64_t n_tokens = 0;
};
void kv_write_ref(const kv_write_params& p);

// The query tokens of one sequence: rows [first_token, first_token + n_tokens) of q/out, at
// positions start_pos.. ; the block table covers positions [0, start_pos + n_tokens).
struct attention_seq {
  std::int64_t first_token = 0;
  std::int64_t n_tokens = 0;
  std::int64_t start_pos = 0;
  const std::int32_t* block_table = nullptr;
};

struct attention_params {
  const float* q = nullptr;        // [total tokens, n_heads, head_dim]
  float* out = nullptr;            // [total tokens, n_heads, head_dim]
  std::int64_t n_heads = 0;
  paged_kv_view cache;
  float scale = 1.f;               // usually 1 / sqrt(head_dim)
  std::span<const attention_seq> seqs;
};
// Softmax in double over the whole context: the definition the fused GPU kernels approximate.
void attention_ref(const attention_params& p);

}  // namespace anvil::kernels
