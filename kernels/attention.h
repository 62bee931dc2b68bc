// Paged KV cache and causal attention over it: the layout the GPU worker uses, defined here.
//
// One layer's cache is [n_blocks][block_size][n_kv_heads][head_dim] elements for K and the same
// for V: floats on the CPU, f16 on the GPU, or 8-bit codes with a scale per row (kernels/kv_quant.h,
// --kv-cache-dtype). A sequence owns a block table: position p lives in block table[p / block_size] at
// offset p % block_size. kv_write stores the K/V of new tokens at their slots; attention lets
// each query token attend to every position up to its own (causal), with grouped-query heads
// (query head h reads kv head h / (n_heads / n_kv_heads)).
//
// Two options shared by every attention kernel (gpt-oss uses both):
// - a sliding window of W positions: a query at position p attends to positions (p - W, p] only
//   (W = 0: the whole context);
// - a learned sink per query head: one more logit s_h in the softmax, whose value vector is zero,
//   so out = sum_i exp(x_i) v_i / (exp(s_h) + sum_i exp(x_i)).
#pragma once

#include <cstdint>
#include <span>

#include "kernels/kv_quant.h"

namespace anvil::kernels {

// The CPU cache: f32 rows (dtype f16: the exact values), or 8-bit codes and their row scales.
struct paged_kv_view {
  float* k = nullptr;              // [n_blocks][block_size][n_kv_heads][head_dim]; dtype f16 only
  float* v = nullptr;              // same shape as k
  std::int64_t n_blocks = 0;
  std::int64_t block_size = 0;
  std::int64_t n_kv_heads = 0;
  std::int64_t head_dim = 0;
  kv_dtype dtype = kv_dtype::f16;
  std::uint8_t* k8 = nullptr;      // 8-bit dtypes: codes, the shape of k
  std::uint8_t* v8 = nullptr;
  float* k_scales = nullptr;       // 8-bit dtypes: [n_blocks][block_size][n_kv_heads]
  float* v_scales = nullptr;
};

// Row `slot` (block_id * block_size + offset), KV head `kvh` of K (or V) as floats: what every
// reader of the cache sees.
void kv_read_row(const paged_kv_view& c, bool v, std::int64_t slot, std::int64_t kvh, float* out);

// The device cache: the same layout, stored as IEEE f16 (the bits in std::uint16_t, so host code
// needs no vendor half type) or as 8-bit codes with the scales beside them. Kernels read it into
// f32 and compute in f32.
struct paged_kv_device {
  void* k = nullptr;               // [n_blocks][block_size][n_kv_heads][head_dim] f16 bits or codes
  void* v = nullptr;               // same shape as k
  std::int64_t n_blocks = 0;
  std::int64_t block_size = 0;
  std::int64_t n_kv_heads = 0;
  std::int64_t head_dim = 0;
  kv_dtype dtype = kv_dtype::f16;
  float* k_scales = nullptr;       // 8-bit dtypes: [n_blocks][block_size][n_kv_heads]
  float* v_scales = nullptr;
};

// The fused GPU attention kernels (attention_decode.h, attention_prefill.h) take heads of 64, 128,
// 256 or 512 dims; their tensor-core forms heads of up to 256 (heads of 512, Gemma 4's global
// layers, run on the CUDA-core forms everywhere).
inline constexpr std::int64_t attention_tc_max_head_dim = 256;

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
  std::int64_t window = 0;         // sliding window in positions; 0: the whole context
  const float* sinks = nullptr;    // [n_heads] sink logits, or none
};
// Softmax in double over the whole context: the definition the fused GPU kernels approximate.
void attention_ref(const attention_params& p);

}  // namespace anvil::kernels
