// Paged attention for prefill and chunked prefill: many query tokens per sequence, causal, over
// the device cache in f16 or 8 bits (kernels/attention.h, paged_kv_device; kernels/kv_quant.h).
// The definition is attention_ref: the chunk's tokens sit at positions start_pos.. and attend to
// every cached position up to their own — the earlier chunks' and their own chunk's K/V, which
// rope_kv_write stored first — or with a window of W positions the last W up to their own; a sink
// logit per query head, when given, takes its share of the softmax.
//
// Design, on NVIDIA sm_80+ (attention_prefill_tensor_cores(head_dim)): FlashAttention-2 on mma.sync
// tensor-core instructions, 64 query rows per block (attention_prefill.hip has the details).
// Elsewhere, and for heads of 512 (FlashAttention-style, f32 on the CUDA cores): a block takes 32
// query rows (16 at head size 256, 8 at 512) of one sequence and one kv head, a row being (token,
// query head) over the heads that share the kv head (GQA: K/V tiles are loaded once for all of
// them). It walks the context in tiles of one warp's width of keys, staged in shared memory as
// f16; each warp keeps its rows' running max, sum and output in registers (online softmax) and
// updates them per tile.
//
// With a window, both kernels start the key loop at the tile holding the first key the block's
// earliest query sees (a long prompt does not pay for the whole context), never read a key before
// it (a window pool's tables hold -1 for blocks behind every window: kv_config::window), and mask
// per element below each row's window; the sink enters the row's final normalisation.
#pragma once

#include <cstdint>

#include "kernels/attention.h"

namespace anvil::kernels {

// One sequence's query tokens: rows [first_token, first_token + n_tokens) of q/out at positions
// [start_pos, start_pos + n_tokens). Plain data, uploaded as an array.
struct attention_prefill_seq {
  std::int32_t first_token = 0;
  std::int32_t n_tokens = 0;
  std::int32_t start_pos = 0;
  std::int32_t reserved = 0;
};

struct attention_prefill_params {
  const float* q = nullptr;                    // [total tokens, n_heads, head_dim]
  float* out = nullptr;                        // [total tokens, n_heads, head_dim]; must not alias q
  paged_kv_device cache;                       // one layer, read only; head_dim 64, 128, 256 or 512
  std::int64_t n_heads = 0;                    // a multiple of cache.n_kv_heads
  const attention_prefill_seq* seqs = nullptr;  // [n_seqs], device memory
  std::int64_t n_seqs = 0;                     // <= 65535
  std::int64_t max_seq_tokens = 0;             // >= every seqs[s].n_tokens: sizes the grid
  const std::int32_t* block_tables = nullptr;  // [n_seqs, block_table_stride] block ids
  std::int64_t block_table_stride = 0;         // covers start_pos + n_tokens of every sequence
  float scale = 1.f;
  std::int64_t window = 0;                     // sliding window: the last `window` positions; 0: the whole context
  const float* sinks = nullptr;                // [n_heads], device memory: a sink logit per query head, or none
  // Run the portable CUDA-core kernel even where the tensor-core one would (the tests check both
  // on one device).
  bool cuda_cores_only = false;
};

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// Needs no workspace. Rejects (hipErrorInvalidValue) unsupported shapes or a misaligned cache.
hipError_t launch_attention_prefill(const attention_prefill_params& p, hipStream_t stream);
// Whether launch_attention_prefill runs on tensor cores here for heads of head_dim (NVIDIA,
// compute capability 8.0 and up, heads of up to attention_tc_max_head_dim: attention_decode.h)
// unless told cuda_cores_only: Q and the softmax weights then enter the products as f16, not f32
// (nmse ~1e-7).
bool attention_prefill_tensor_cores(std::int64_t head_dim);
}  // namespace anvil::kernels
#endif
