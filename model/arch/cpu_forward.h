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
#include "kernels/delta_net.h"
#include "model/arch/llm.h"
#include "model/arch/tensor_parallel.h"

namespace anvil::model {

// K and V for every layer: [n_layer][n_blocks][block_size][n_head_kv][head_dim] floats each (dtype
// f16: the exact values), or 8-bit codes of that shape with one scale per row
// [n_layer][n_blocks][block_size][n_head_kv] (int8, fp8: kernels/kv_quant.h), allocated from
// `arena` (the CPU worker's device memory; the heap by default). With n_window_blocks > 0 the
// sliding-window layers (hparams::layer_window) keep theirs in a window pool of that many blocks
// instead, addressed by the sequences' window tables (kv_config::window). A model with gated
// DeltaNet layers (hparams::recurrent) keeps their state in n_state_slots slots instead, one per
// sequence (kv_config::n_state_slots): per recurrent layer [n_state_slots][ssm_conv_state] and
// [n_state_slots][ssm_matrix_state] floats, and per slot the number of positions folded into it.
class kv_cache_storage {
 public:
  kv_cache_storage(const hparams& hp, std::int64_t n_blocks, std::int64_t block_size,
                   kernels::kv_dtype dtype = kernels::kv_dtype::f16,
                   std::pmr::memory_resource* arena = std::pmr::get_default_resource(), std::int64_t n_window_blocks = 0,
                   std::int64_t n_state_slots = 0);
  kernels::paged_kv_view layer(std::int64_t l);
  // Recurrent layer l's states: the convolution's and the delta rule's, every slot's.
  struct state_view {
    float* conv = nullptr;
    float* matrix = nullptr;
  };
  state_view state(std::int64_t l);
  // Positions folded into a slot's state: a step continues a slot only from there (-1: unknown,
  // a step that touched it failed part-way).
  std::int64_t& state_pos(std::int32_t slot) { return state_pos_[std::size_t(slot)]; }
  std::int64_t state_pos(std::int32_t slot) const { return state_pos_[std::size_t(slot)]; }
  // Copies slot src's state, every layer's, into slot dst.
  void copy_state(std::int32_t src, std::int32_t dst);
  std::int64_t n_state_slots() const { return n_state_slots_; }
  // One slot's state, every recurrent layer's (0 for a model without them).
  static std::size_t bytes_per_state_slot(const hparams& hp);
  // Whether layer l's KV is in the window pool.
  bool windowed(std::int64_t l) const { return layers_.windowed(l); }
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
  // One pool's layers: [layers][n_blocks][block_size][n_kv_heads] rows, each layer's rows of its
  // own head count and size (gemma4's sliding and global layers differ), one after the other.
  struct pool {
    std::int64_t n_layers = 0, n_blocks = 0;
    std::vector<std::int64_t> heads, dims;   // per pool layer: KV heads, head size
    // Per pool layer (and the end): its first row (block 0), and its first element in the data.
    std::vector<std::int64_t> rows_at, elems_at;
    std::pmr::vector<float> k, v;               // f16
    std::pmr::vector<std::uint8_t> k8, v8;      // 8-bit codes
    std::pmr::vector<float> k_scales, v_scales;  // 8-bit row scales
    explicit pool(std::pmr::memory_resource* arena) : k(arena), v(arena), k8(arena), v8(arena), k_scales(arena), v_scales(arena) {}
  };
  void allocate(pool& p) const;

  std::int64_t block_size_;
  kernels::kv_dtype dtype_;
  kv_layer_map layers_;
  pool main_, window_;
  std::int64_t n_state_slots_ = 0, conv_floats_ = 0, matrix_floats_ = 0;  // the latter two: per slot and layer
  std::pmr::vector<float> conv_, matrix_;  // [state layers][n_state_slots][...]
  std::pmr::vector<std::int64_t> state_pos_;
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
  // With recurrent layers: the sequence's state slot, holding its first start_pos positions (or
  // anything when start_pos is 0: the step starts it afresh).
  std::int32_t state_slot = -1;
};

// A rank's pass of a model split over ranks (tensor_parallel.h): the pass runs on the rank's
// shard, sums its partial outputs with the other ranks' through `comm`, and gathers every rank's
// slice of the logits, so that each rank's run() gives the whole model's logits.
struct tp_link {
  collectives* comm = nullptr;      // null: the whole model, alone
  vocab_slice vocab{};              // the shard's (llm_shard::vocab)
  std::int64_t max_logit_rows = 0;  // the gather's scratch is sized for this many logit rows
};

class cpu_forward {
 public:
  // Sizes the scratch, allocated from `arena`, for steps of up to `max_tokens` tokens (and as many
  // logit rows) at once, so such steps never allocate; a larger step grows it (from `arena`).
  explicit cpu_forward(const llm& m, std::int64_t max_tokens = 0,
                       std::pmr::memory_resource* arena = std::pmr::get_default_resource(), tp_link tp = {});

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
  void check_state_slot(std::span<const forward_seq> batch, std::size_t s, const kv_cache_storage& cache) const;
  void layer(std::int64_t l, kv_cache_storage& cache);
  // A layer's mixer on the normed rows in h_, its output into o_: attention, or a gated DeltaNet's.
  void attention(std::int64_t l, kv_cache_storage& cache);
  void delta_net(std::int64_t l, kv_cache_storage& cache);
  // A mixture-of-experts feed-forward on the normed rows in h_, its output into o_.
  void experts(const layer_weights& w);
  void route_experts(const layer_weights& w);  // router_ from h_: chosen_ and chosen_w_
  void run_experts(const layer_weights& w);    // the chosen experts on h_, combined into o_
  void dense_beside_experts(const layer_weights& w);
  void add_block_output(const std::vector<float>& post_norm);
  // gemma4 E2B / E4B: the step's per-layer inputs into ple_ (from x_, the scaled embedding), and
  // layer l's use of its own at the layer's end.
  void per_layer_inputs(std::int64_t n);
  void per_layer_block(std::int64_t l);
  // Tensor parallelism: the first n floats of v summed over the ranks (nothing alone); the
  // embedding of the shard's vocabulary slice, summed; the head's slice of the logits, gathered.
  void reduce(std::pmr::vector<float>& v);
  void embed_slice(std::int64_t n_tokens);
  void gather_logits(std::int64_t rows, float* logits);
  // A feed-forward's matrices and their biases (null: none).
  struct ffn {
    weight gate, up, down;
    const float *gate_b = nullptr, *up_b = nullptr, *down_b = nullptr;
  };
  // The SwiGLU feed-forward down(swiglu(gate x, up x)) of n rows x into y, through gate_ and up_
  // (the model's SwiGLU variant).
  void swiglu_ffn(const ffn& f, const std::pmr::vector<float>& x, std::int64_t n, float* y);

  const llm& m_;
  tp_link tp_;
  std::pmr::vector<float> tp_send_, tp_all_;  // the head's slice [rows][stride], and every rank's
  // Scratch, reused across steps: [T, ...] activations of the current step.
  std::pmr::vector<std::int32_t> ids_, positions_;
  std::pmr::vector<std::int64_t> slots_, window_slots_;  // each token's cache row in the main / window pool
  std::pmr::vector<float> x_, h_, q_, k_, v_, attn_, o_, gate_, up_;
  // Mixture of experts: router scores, each token's chosen experts and weights, one expert's rows
  // and outputs, every pair's output.
  std::pmr::vector<float> router_, chosen_w_, xe_, ye_, pair_out_;
  std::pmr::vector<std::int32_t> chosen_, routed_;
  std::pmr::vector<kernels::attention_seq> seqs_, window_seqs_;  // the same, with window tables
  // Gated DeltaNet: the sequences with their state slots, the q/k/v projection (convolved in
  // place), the output gate, beta's and alpha's logits; the attention's output gate (attn_out_gate).
  std::pmr::vector<kernels::recurrent_seq> rseqs_;
  std::pmr::vector<float> mix_, z_, beta_, alpha_, qgate_;
  std::pmr::vector<float> dense_out_;  // gemma4: the dense feed-forward's output beside the experts
  // gemma4 E2B / E4B: the step's per-layer inputs [T, n_layer * ple_dim], and a layer's [T, ple_dim]
  // gate (the token part of the inputs on the way, [T, n_layer * ple_dim]).
  std::pmr::vector<float> ple_, ple_h_;
  std::vector<float> v_norm_ones_;  // gemma4's V norm has no weight: a gain of ones, made at start-up
  std::pmr::vector<std::int64_t> logit_rows_;
};

}  // namespace anvil::model
