// Paged attention for decode: one query token per sequence, many sequences, over the device cache
// in f16 or 8 bits (kernels/attention.h, paged_kv_device; kernels/kv_quant.h). The definition is attention_ref with one token per
// sequence whose K/V is already in the cache (rope_kv_write runs first): sequence s attends to
// positions [0, context_lens[s]), or with a window of W positions to the last W of them, and a
// sink logit per query head, when given, takes its share of the softmax.
//
// Design (flash-decoding): a block takes one sequence, one kv head — and all query heads that share
// it (GQA), so each K/V row is read from memory once — and one split of the context of `split`
// positions (64, 256, 1024 or, on tensor cores, 2048). On NVIDIA sm_80+
// (attention_decode_tensor_cores(head_dim): heads of up to 256) the products run on tensor cores
// with the query heads as rows, K and V read straight from the cache into registers, an online
// softmax per warp (attention_decode.hip has the details); elsewhere, and for heads of 512, on the
// CUDA cores, scores go to shared memory, softmax in f32 (heads of 512 in chunks of 4 query heads).
// With one split the block writes the output; with several it writes its partial output and (max,
// sum) to the workspace and a second kernel merges them. Splits have a fixed length, so a
// sequence's result does not depend on the rest of the batch, and a single long sequence still
// fills the GPU. The worker picks the length once per head size, from the longest context it serves
// (attention_decode_split_for): short splits give a short context more blocks (a decode step at a
// context of 300 runs 5 splits of 64 per kv head instead of 2 of 256), long ones keep the workspace
// and the merge small when contexts are long.
//
// A window leaves the splits wholly before it out: the grid has only as many splits per sequence
// as W positions can touch (they start at the window's first split), and the first of them starts
// at the window's first position: no block table entry before it is read (a window pool's tables
// hold -1 there: kv_config::window). A split the window leaves empty has no block and no part in the
// merge. The sink enters once, where the output is normalised: in the block that writes it (one
// split in the window) or in the merge.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/attention.h"

namespace anvil::kernels {

inline constexpr std::int64_t attention_decode_split = 256;        // context positions per split: the default
inline constexpr std::int64_t attention_decode_short_split = 64;   // the other lengths the kernels take
inline constexpr std::int64_t attention_decode_long_split = 1024;
inline constexpr std::int64_t attention_decode_longest_split = 2048;  // the tensor-core kernel only

// The split length for a worker whose sequences reach at most max_context positions. The
// tensor-core kernel streams a split through a pipeline whose start and end cost a few
// microseconds, so it takes the longest splits: 2048 (f16 at 90-99% of the copy bandwidth at
// 16-256 sequences of 1,000-8,192 positions, against 42-45% with splits of 64; the 8-bit caches,
// whose splits hold half the bytes, gain most over 1024: fp8 at 256 x 1,500 70% → 80%, at
// 64 x 1,500 61% → 73%; bench/GPU_NOTES.md, session 18). The CUDA-core kernel keeps 64 up to
// 4096 positions (at most 64 splits), 256 beyond.
inline std::int64_t attention_decode_split_for(std::int64_t max_context, bool tensor_cores) {
  if (tensor_cores) return attention_decode_longest_split;
  return max_context <= 4096 ? attention_decode_short_split : attention_decode_split;
}

struct attention_decode_params {
  const float* q = nullptr;                  // [n_seqs, n_heads, head_dim]
  float* out = nullptr;                      // [n_seqs, n_heads, head_dim]; must not alias q
  paged_kv_device cache;                     // one layer, read only; head_dim 64, 128, 256 or 512
  std::int64_t n_heads = 0;                  // a multiple of cache.n_kv_heads
  // block_tables and context_lens are read before the kernel waits on the one ahead of it
  // (gpu_runtime.h): no kernel launched just before may write them.
  const std::int32_t* block_tables = nullptr;  // [n_seqs, block_table_stride] block ids
  std::int64_t block_table_stride = 0;       // >= blocks covering max_context
  const std::int32_t* context_lens = nullptr;  // [n_seqs], each in [1, max_context]
  std::int64_t n_seqs = 0;                   // <= 65535
  std::int64_t max_context = 0;              // >= every context_lens[s]: sizes the grid and workspace
  float scale = 1.f;                         // usually 1 / sqrt(head_dim)
  std::int64_t window = 0;                   // sliding window: the last `window` positions; 0: the whole context
  const float* sinks = nullptr;              // [n_heads], device memory: a sink logit per query head, or none
  std::int64_t split = attention_decode_split;  // positions per split: attention_decode_split, _short_, _long_ or
                                                // (tensor cores) _longest_split
  // Optional: the output also in the 8-bit form the next GEMV reads from its workspace
  // (kernels/gemv.h, gemv_x8_rows for rows of n_heads * head_dim): yq [n_seqs, n_heads * head_dim],
  // yq_scales [n_seqs, n_heads * head_dim / 16] pairs — what the GEMV's own quantizer makes of
  // `out`, bit for bit. yq 4-byte and yq_scales 8-byte aligned.
  std::int8_t* yq = nullptr;
  float* yq_scales = nullptr;
  void* workspace = nullptr;                 // attention_decode_workspace_bytes(...) bytes, 16-byte aligned
  std::size_t workspace_bytes = 0;
  // Run the portable CUDA-core kernel even where the tensor-core one would (tests and gpu_roofline
  // measure and check both on one device).
  bool cuda_cores_only = false;
};

inline std::int64_t attention_decode_splits(std::int64_t max_context, std::int64_t split = attention_decode_split) {
  return (max_context + split - 1) / split;
}

// Scratch for the split partials; 0 when max_context fits in one split. Layout: partial outputs
// [n_seqs][n_heads][splits][head_dim] floats, then (max, sum) pairs [n_seqs][n_heads][splits].
inline std::size_t attention_decode_workspace_bytes(std::int64_t n_seqs, std::int64_t n_heads, std::int64_t head_dim,
                                                    std::int64_t max_context,
                                                    std::int64_t split = attention_decode_split) {
  const std::int64_t splits = attention_decode_splits(max_context, split);
  if (splits <= 1 || n_seqs <= 0 || n_heads <= 0) return 0;
  return std::size_t(n_seqs * n_heads * splits) * std::size_t(head_dim + 2) * sizeof(float);
}

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// Rejects (hipErrorInvalidValue) unsupported shapes, a short workspace or misaligned pointers.
hipError_t launch_attention_decode(const attention_decode_params& p, hipStream_t stream);
// Whether launch_attention_decode runs on tensor cores here for heads of head_dim (NVIDIA,
// compute capability 8.0 and up, heads of up to attention_tc_max_head_dim) unless told
// cuda_cores_only.
bool attention_decode_tensor_cores(std::int64_t head_dim);
}  // namespace anvil::kernels
#endif
