// The CPU reference forward pass: one step for a batch of sequences at different positions,
// over a KV cache laid out in blocks exactly as the GPU worker lays it out. This is the numerical
// definition the GPU kernels are tested against; it composes the kernels' CPU references and
// uses every core through them. Correctness over speed.
#pragma once

#include <cstdint>
#include <memory_resource>
#include <span>
#include <vector>

#include "kernels/attention.h"
#include "model/arch/llm.h"

namespace anvil::model {

// K and V for every layer: [n_layer][n_blocks][block_size][n_head_kv][head_dim] floats each (dtype
// f16: the exact values), or 8-bit codes of that shape with one scale per row
// [n_layer][n_blocks][block_size][n_head_kv] (int8, fp8: kernels/kv_quant.h), allocated from
// `arena` (the CPU worker's device memory; the heap by default). With n_window_blocks > 0 the
// sliding-window layers (hparams::layer_window) keep theirs in a window pool of that many blocks
// instead, addressed by the sequences' window tables (kv_config::window).
class kv_cache_storage {
 public:
  kv_cache_storage(const hparams& hp, std::int64_t n_blocks, std::int64_t block_size,
                   kernels::kv_dtype dtype = kernels::kv_dtype::f16,
                   std::pmr::memory_resource* arena = std::pmr::get_default_resource(), std::int64_t n_window_blocks = 0);
  kernels::paged_kv_view layer(std::int64_t l);
  // Whether layer l's KV is in the window pool.
  bool windowed(std::int64_t l) const { return layers_.windowed[std::size_t(l)]; }
  // Copies block `src` into block `dst` of the main pool's layers (or the window pool's), K and V
  // (copy-on-write).
  void copy_block(std::int64_t src, std::int64_t dst, bool window = false);
  std::size_t bytes() const;
  // A block of every layer (main pool only, window: of the window pool's layers).
  static std::size_t bytes_per_block(const hparams& hp, std::int64_t block_size,
                                     kernels::kv_dtype dtype = kernels::kv_dtype::f16);
  static std::size_t bytes_per_block(const hparams& hp, std::int64_t block_size, kernels::kv_dtype dtype,
                                     bool window_pool, bool window);
  std::int64_t n_blocks() const { return main_.n_blocks; }
  std::int64_t n_window_blocks() const { return window_.n_blocks; }
  std::int64_t block_size() const { return block_size_; }
  kernels::kv_dtype dtype() const { return dtype_; }

 private:
  // One pool's layers: [layers][n_blocks][block_size][n_kv_heads] rows.
  struct pool {
    std::int64_t n_layers = 0, n_blocks = 0;
    std::pmr::vector<float> k, v;               // f16
    std::pmr::vector<std::uint8_t> k8, v8;      // 8-bit codes
    std::pmr::vector<float> k_scales, v_scales;  // 8-bit row scales
    explicit pool(std::pmr::memory_resource* arena) : k(arena), v(arena), k8(arena), v8(arena), k_scales(arena), v_scales(arena) {}
  };
  void allocate(pool& p) const;

  std::int64_t block_size_, n_kv_heads_, head_dim_;
  kernels::kv_dtype dtype_;
  kv_layer_map layers_;
  pool main_, window_;
};

// One sequence's part of a step.
struct forward_seq {
  std::span<const std::int32_t> tokens;       // fed this step: a prefill chunk or one decode token
  std::int64_t start_pos = 0;                 // position of tokens[0]; earlier positions are cached
  std::span<const std::int32_t> block_table;  // covers positions [0, start_pos + tokens.size())
  bool all_logits = false;                    // logits for every fed token, else for the last only
  // With a window pool: the window layers' blocks over the same positions (-1 where no fed token
  // sees them).
  std::span<const std::int32_t> window_table = {};
};

class cpu_forward {
 public:
  // Sizes the scratch, allocated from `arena`, for steps of up to `max_tokens` tokens (and as many
  // logit rows) at once, so such steps never allocate; a larger step grows it (from `arena`).
  explicit cpu_forward(const llm& m, std::int64_t max_tokens = 0,
                       std::pmr::memory_resource* arena = std::pmr::get_default_resource());

  // Runs one step and writes logits [rows, n_vocab], rows in batch order (all fed tokens of a
  // sequence with all_logits, else its last), into `logits` (a heap or an arena vector). Throws
  // std::invalid_argument for a malformed batch (token id outside the vocabulary, a block table
  // too short or naming a block out of range).
  template <class Allocator>
  void run(std::span<const forward_seq> batch, kv_cache_storage& cache, std::vector<float, Allocator>& logits) {
    logits.resize(layers(batch, cache) * std::size_t(m_.hp.n_vocab));
    head(logits.data());
  }

 private:
  // Every layer of the step; returns the number of logit rows.
  std::size_t layers(std::span<const forward_seq> batch, kv_cache_storage& cache);
  void head(float* logits);  // the final norm and the output projection of those rows
  void check(std::span<const forward_seq> batch, const kv_cache_storage& cache) const;
  void layer(std::int64_t l, kv_cache_storage& cache);
  // A mixture-of-experts feed-forward on the normed rows in h_, its output into o_.
  void experts(const layer_weights& w);
  void add_block_output(const std::vector<float>& post_norm);
  // A feed-forward's matrices and their biases (null: none).
  struct ffn {
    weight gate, up, down;
    const float *gate_b = nullptr, *up_b = nullptr, *down_b = nullptr;
  };
  // The SwiGLU feed-forward down(swiglu(gate x, up x)) of n rows x into y, through gate_ and up_
  // (the model's SwiGLU variant).
  void swiglu_ffn(const ffn& f, const std::pmr::vector<float>& x, std::int64_t n, float* y);

  const llm& m_;
  // Scratch, reused across steps: [T, ...] activations of the current step.
  std::pmr::vector<std::int32_t> ids_, positions_;
  std::pmr::vector<std::int64_t> slots_, window_slots_;  // each token's cache row in the main / window pool
  std::pmr::vector<float> x_, h_, q_, k_, v_, attn_, o_, gate_, up_;
  // Mixture of experts: router scores, each token's chosen experts and weights, one expert's rows
  // and outputs, every pair's output.
  std::pmr::vector<float> router_, chosen_w_, xe_, ye_, pair_out_;
  std::pmr::vector<std::int32_t> chosen_, routed_;
  std::pmr::vector<kernels::attention_seq> seqs_, window_seqs_;  // the same, with window tables
  std::pmr::vector<std::int64_t> logit_rows_;
};

}  // namespace anvil::model
