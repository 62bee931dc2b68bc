// The GPU worker's device side, below its actor shell (gpu_worker.cpp): the start-up (device,
// stream, BLAS handle, weight upload, memory plan, warm-up, graphs: gpu_device_setup.cpp) and the
// forward pass of one step (gpu_device_step.cpp). Host code compiled by the C++ compiler; it only
// enqueues the kernels of kernels/ through their launchers.
// Every device and pinned-host allocation goes through alloc_*(), which counts it; nothing after
// the constructor calls them. Errors: the constructor throws std::runtime_error; execute(),
// begin() and collect() throw device_failure for a failed launch or copy (the shell turns it into
// errc::device_fault) and std::invalid_argument for a plan the device limits refuse.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gpu_worker/gpu_worker.h"
#include "gpu_worker/op_profile.h"
#include "kernels/attention_prefill.h"
#include "kernels/candidates.h"
#include "kernels/gemm.h"
#include "kernels/gemm_fp8.h"
#include "kernels/gemv.h"
#include "kernels/gpu_runtime.h"
#include "kernels/rms_norm_residual.h"

namespace anvil::gpu_worker {

struct device_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws device_failure naming `what` for a runtime call that failed.
inline void ok(hipError_t e, const char* what) {
  if (e != hipSuccess) {
    throw device_failure(std::string(what) + ": " + hipGetErrorName(e) + " (" + hipGetErrorString(e) + ")");
  }
}

class gpu_device {
 public:
  gpu_device(const model::llm& m, const gpu_worker_config& cfg, memory_plan& mem);
  ~gpu_device();
  gpu_device(const gpu_device&) = delete;
  gpu_device& operator=(const gpu_device&) = delete;

  // Positions one sequence may reach (the block tables' and decode workspace's capacity).
  std::int64_t max_context() const { return max_blocks_per_seq_ * block_size_; }
  // Runs one checked plan (check_plan passed, every sequence within max_context) and fills
  // result.outputs: begin() then collect().
  void execute(const step_plan& plan, step_result& result);
  // A step in two halves, so that the next is queued on the stream while one runs (overlapped
  // steps, worker_shell.h): begin() enqueues a checked plan and returns; collect() waits for the
  // oldest step begun and not collected, and fills its result (`plan` is that step's plan).
  // At most max_begun steps are begun and not collected (begin throws std::logic_error past it).
  // A seq_step with feed_from >= 0 feeds the token that the step begun just before drew for that
  // output, copied on the device (kernels/feed_tokens.h): its tokens[0] is a placeholder.
  // A plan with deferred masks (seq_step::mask_deferred) is begun up to its logits; finish_begin()
  // enqueues the rest once the masks are in the plan, and nothing else is begun in between.
  static constexpr std::size_t max_begun = 2;
  void begin(const step_plan& plan);
  void finish_begin(const step_plan& plan);
  void collect(const step_plan& plan, step_result& result);
  // Whether the oldest step begun and not collected has ended on the device (never blocks).
  bool oldest_ended() const;
  std::size_t begun_not_collected() const { return std::size_t(begun_ - collected_); }
  std::uint64_t allocations() const { return allocations_; }
  // Decode batch sizes with a captured graph.
  std::int64_t graphs() const;

 private:
  // A matrix weight on the device: GGUF bytes verbatim, and its FP8 copy with gemm_dtype fp8
  // (codes null when there is none).
  struct matrix {
    const void* w = nullptr;
    model::ggml_type type = model::ggml_type::F32;
    std::int64_t in = 0, out = 0;
    kernels::fp8_matrix fp8{};
    const void* w16 = nullptr;  // f16_weight_copies: the weight in f16 (matmul_params::w16)
  };
  struct layer {
    const float *attn_norm = nullptr, *ffn_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
    const float *post_attn_norm = nullptr, *post_ffn_norm = nullptr;  // gemma3: on each block's output
    float out_scale = 1.f;  // gemma4: the residual stream times this after the layer
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr;
    const float *bo = nullptr, *sinks = nullptr;  // gpt-oss
    matrix wq, wk, wv, wo, gate, up, down;  // wv null: V is K's projection (gemma4's global layers)
    // gemm_dtype fp8: q, k and v stacked into one FP8 copy (one GEMM per layer where there were
    // three; wq/wk/wv then have none), and their biases, if any, into one vector.
    kernels::fp8_matrix qkv_fp8{};
    const float* bqkv = nullptr;
    // A mixture-of-experts layer (router.w not null; gate/up/down then null): the router (F32),
    // the experts stacked per projection, the shared expert and its gate vector where it has one.
    matrix router;
    struct stacked {
      const void* w = nullptr;
      model::ggml_type type = model::ggml_type::F32;
      std::int64_t in = 0, out = 0;
      std::size_t stride = 0;  // bytes from one expert's matrix to the next
    };
    stacked gate_exps, up_exps, down_exps;
    // gpt-oss: the router's bias [n_expert] and the experts' [n_expert, out].
    const float *router_b = nullptr, *gate_exps_b = nullptr, *up_exps_b = nullptr, *down_exps_b = nullptr;
    matrix gate_shexp, up_shexp, down_shexp;
    const float* shexp_gate = nullptr;
    // gemma4's experts beside a dense feed-forward (gate.w and router.w both set): the router reads
    // the residual normed by router_in_scale (its router_scale over sqrt(n_embd)), each chosen
    // weight times expert_scale, the experts read the residual normed by pre_ffn_norm_2, and the
    // two outputs are normed by post_ffn_norm_1 (dense) and post_ffn_norm_2 (experts) and summed.
    const float *router_in_scale = nullptr, *expert_scale = nullptr, *pre_ffn_norm_2 = nullptr;
    const float *post_ffn_norm_1 = nullptr, *post_ffn_norm_2 = nullptr;
    // A gated DeltaNet layer (qwen35; ssm_qkv.w not null, wq..wo then null): its projections, the
    // convolution's taps, a and the dt bias per value head, the gated norm's weight.
    matrix ssm_qkv, ssm_z, ssm_beta, ssm_alpha, ssm_out;
    const float *ssm_conv = nullptr, *ssm_a = nullptr, *ssm_dt_bias = nullptr, *ssm_norm = nullptr;
    // gemma4 E2B / E4B (hp.ple_dim): the layer's use of its per-layer input (model::layer_weights).
    matrix ple_gate, ple_proj;
    const float* ple_post_norm = nullptr;
    // The matrices project() multiplies (any may be absent: w null), the experts' stacks aside.
    template <class Self>
    static std::array<decltype(&std::declval<Self&>().wq), 17> projected_of(Self& l) {
      return {&l.wq,      &l.wk,         &l.wv,       &l.wo,         &l.gate,    &l.up,
              &l.down,    &l.gate_shexp, &l.up_shexp, &l.down_shexp, &l.ssm_qkv, &l.ssm_z,
              &l.ssm_beta, &l.ssm_alpha, &l.ssm_out,  &l.ple_gate,   &l.ple_proj};
    }
    std::array<const matrix*, 17> projected() const { return projected_of(*this); }
    std::array<matrix*, 17> projected() { return projected_of(*this); }
  };
  // Byte offsets of the per-step upload sections; the same in the pinned host buffer and its
  // device mirror. The fixed part [0, pairs) is copied whole; the pairs only as far as used.
  struct upload_layout {
    std::size_t ids, positions, slots, tables, context_lens, prefill_seqs, logit_rows, cand_seqs, score_rows, score_targets;
    std::size_t window_slots, window_tables;  // the window pool's (the same shapes as slots and tables)
    std::size_t feed_rows, feed_from;  // the rows fed from the step before, and their outputs there
    std::size_t rseqs;  // recurrent layers: each sequence's rows and state slot, in row order
    std::size_t bias_ids, bias_values, count_ids, count_values, mask_words, fixed_end, total;
    std::size_t merge_seqs;  // split_vocab: the whole vocabulary's candidates_seq of each sequence
  };

  void* alloc_device(std::size_t bytes, const char* what);
  void* alloc_pinned(std::size_t bytes, const char* what);
  void upload_weights(const gpu_worker_config& cfg, memory_plan& mem);
  void plan_scratch(memory_plan& mem);
  void make_fp8_copies(memory_plan& mem);  // gemm_dtype fp8: after plan_scratch (uses the GEMM workspace)
  void make_f16_copies(memory_plan& mem);  // f16_weight_copies: before plan_scratch (sizes the GEMM workspace)
  void plan_kv(const gpu_worker_config& cfg, memory_plan& mem);
  void warm_up();  // a step of each kind before the graphs, and a prompt step per GEMM plan bucket
  void capture_graphs(std::int64_t max_batch);

  // The forward pass, stage by stage (gpu_device_step.cpp).
  void copy_blocks(const step_plan& plan);
  void copy_states(const std::vector<state_copy>& copies);  // plan.state_copies before the step, state_snapshots after
  // can_feed: the step begun just before ended its begin(), so feed_from may read its records.
  void lay_out(const step_plan& plan, bool for_graph, bool can_feed);
  void run_body();  // embedding, the layers, the final norm: step_ says the shape
  void run_layer(std::int64_t l);
  void run_attention(std::int64_t l, bool x8_out);  // x8_out: also the o projection's 8-bit input
  // Decode attention's split length for layers with heads of head_dim (heads past the tensor-core
  // kernel's take the CUDA-core kernel's length).
  std::int64_t attn_split(std::int64_t head_dim) const;
  // The attention block from h_: q/k/v, RoPE + KV write, attention, (Qwen3.5) the output gate, o
  // into o_. A gated DeltaNet layer's block instead: its projections, the convolution and the
  // delta rule over the sequences' state slots, the output projection into o_.
  void run_attention_block(std::int64_t l, bool x8_embd);
  void run_delta_net(std::int64_t l, bool x8_embd);
  // A mixture-of-experts feed-forward from h_ (kernels/moe.h): route, the experts' gate/up,
  // SwiGLU and down by pair, the shared expert, the weighted sum into o_. x8_embd as run_layer's.
  // Without a shared expert the sum is left to the residual norm that follows (returns false:
  // the pairs' rows are in pair_out_, their weights in moe_weights_); true: o_ holds it.
  // pre_norm (gemma4): the experts read x_ normed by it, not h_ (routed from h_ first).
  bool run_experts(const layer& w, bool x8_embd, const float* pre_norm = nullptr);
  // gemma4's dense feed-forward beside its experts (layer::router_in_scale), from h_ and x_; the
  // block's output in dense_out_.
  void run_dense_and_experts(const layer& w, bool x8_embd);
  void norm_rows(const float* x, const float* weight, float* y, const char* what);  // the step's rows of n_embd
  void run_dense_ffn(const layer& w, bool x8_embd);  // gate/up, SwiGLU, down: h_ into o_
  // gemma4 E2B / E4B: the step's per-layer inputs into ple_ (from x_, the scaled embedding); and
  // layer l's block on them, from x_ after the feed-forward's residual add, its output in o_ (the
  // residual norm that follows adds it).
  void run_per_layer_inputs();
  void run_per_layer_block(std::int64_t l);
  // Enqueues the scores and their copy back, and the head; then (run_candidates) the candidates
  // op and the copy of the records back.
  void run_head();
  void run_candidates(const step_plan& plan);
  void merge_candidates(std::size_t record_bytes, std::int32_t max_k);  // tensor parallel: the ranks' records into one
  void run_scores();
  void softcap(std::int64_t rows, std::int64_t width);  // gemma4: the first rows of logits_ (of width) soft-capped in place
  void reduce(float* x);                               // tensor parallel: T rows summed over the ranks
  // `rows` rows of x through the head (gathered over the ranks); x8_ready: x's 8-bit form is in the
  // GEMV workspace already (the final norm wrote it).
  void head_logits(const float* x, std::int64_t rows, float* out, bool x8_ready = false);
  // Whether the head reads the 8-bit form of its input that the final norm writes (wherever
  // x8_fused(n_embd)): rows that all need logits, in order, and no scored rows whose head would
  // overwrite the workspace first.
  bool head_x8_from_norm() const;
  // Whether the head's vocabulary is split over several ranks: candidates from each rank's slice,
  // merged (a rank's logits are never gathered for them; the scores still gather theirs).
  bool split_vocab() const;
  // The feed_from tokens of the step being laid out, on the device (after the upload).
  void feed();
  void collect_scores(const step_plan& plan, const float* scores, step_result& result) const;
  // y = x W^T (+ bias) for each projection of x; GEMVs for steps of up to gemv_max_tokens tokens,
  // grouped by weight type into one launch each, except for the weights the quantized GEMM serves
  // faster (kernels::gemm_quant_beats_gemv); with gemm_dtype fp8, the FP8 GEMM for the weights
  // with a copy (the layers' and the head) from gemm_fp8_min_tokens tokens. x8_ready: the GEMV
  // workspace already holds x in 8 bits (a producer kernel wrote it); x8_ws: that workspace, when
  // not gemv_ws_ (the fused gate/up's output, glu_ws_).
  struct projection {
    const matrix* w = nullptr;
    const float* bias = nullptr;
    float* y = nullptr;
    // The kernels' parameters for this projection of n_tokens rows of x.
    kernels::matmul_params params(const float* x, std::int64_t n_tokens) const;
  };
  void project(std::span<const projection> ps, const float* x, std::int64_t n_tokens, bool x8_ready,
               void* x8_ws = nullptr);
  // Whether a step of n_tokens takes the FP8 GEMM (gemm_dtype fp8, from gemm_fp8_min_tokens), and
  // the context its launches share.
  bool fp8_step(std::int64_t n_tokens) const;
  kernels::gemm_fp8_context fp8_context();
  void matmul(const matrix& w, const float* bias, const float* x, float* y, std::int64_t n_tokens, bool x8_ready = false,
              void* x8_ws = nullptr);
  // Whether a step of n_tokens multiplies w by a GEMM rather than the GEMV (project()).
  bool takes_gemm(const matrix& w, std::int64_t n_tokens) const;
  // Whether a dense feed-forward's gate, up and gated product take one launch (kernels::
  // launch_gemv_glu) this step: one-token steps on int8 activations, gate and up of one type with
  // the integer path, and a width where the fused kernel is the faster (kernels::gemv_glu_preferred).
  bool glu_fused(const layer& w) const;
  // Whether the kernel producing a GEMV input of `width` columns writes its 8-bit form too (steps
  // of up to gemv_max_tokens tokens, int8 activations, widths the fused writers take).
  bool x8_fused(std::int64_t width) const;
  // The residual add + norm of res_ into h_, with the 8-bit form of h_ when x8_fused(n_embd).
  kernels::rms_norm_residual_params norm_params(const float* delta, const float* weight) const;
  // One-token steps of a model whose norms are plain (plain_norms_) on int8 activations: the norm
  // before layer l's q/k/v (the residual add of the layer before with it), or before a dense
  // feed-forward's fused gate/up (glu_fused), is computed by that launch's blocks themselves
  // (kernels::gemv_norm_input) instead of by a launch of its own. q, k and v must share a launch
  // (one type with the integer path, every one by the GEMV) and n_embd fit the normed GEMVs.
  bool qkv_normed(std::int64_t l) const;
  bool qkv_gemv8(std::int64_t l) const;  // one token's q, k and v each on the integer GEMV
  bool glu_normed(const layer& w) const;
  // One-token steps on int8 activations whose q, k and v all take the integer GEMV (any types,
  // any width) rotate q and k and store k and v in the cache inside those launches
  // (kernels::launch_gemv_qkv_rope where the norm is in the launch too, else
  // kernels::launch_gemv_rope_run a run of one type) where nothing needs a whole head at once: no
  // Q/K or V norms, no query temperature or output gate, an f16 cache of the layer's own.
  bool qkv_roped(std::int64_t l) const;
  // The norm input of such a launch: res_ (+ delta) normed by weight; with delta, the sum goes to
  // the other residual buffer (every block reads res_), which becomes res_ (swap_residual()).
  kernels::gemv_norm_input normed_input(const float* delta, const float* weight) const;
  void swap_residual();
  kernels::paged_kv_device kv_layer(std::int64_t l) const;
  template <class T>
  T* host_at(std::size_t off) const { return reinterpret_cast<T*>(upload_host_ + off); }
  template <class T>
  T* dev_at(std::size_t off) const { return reinterpret_cast<T*>(upload_dev_ + off); }

  const model::llm& m_;
  int device_ = 0;
  // Tensor parallelism (gpu_worker_config::comm): this rank's collectives and vocabulary slice, and
  // the head's slice of the logits and every rank's, gathered (null without).
  communicator* comm_ = nullptr;
  model::vocab_slice vocab_{};
  float *tp_local_ = nullptr, *tp_all_ = nullptr;
  void* tp_records_ = nullptr;  // every rank's candidate records of a step, gathered (split_vocab)
  std::int64_t block_size_ = 0, max_tokens_ = 0, max_seqs_ = 0, max_blocks_per_seq_ = 0, max_pairs_ = 0;
  std::uint64_t allocations_ = 0;

  // Owned handles and allocations, freed in the destructor (also when the constructor throws).
  hipStream_t stream_ = nullptr;
  kernels::gemm_context gemm_;
  bool have_blas_ = false;
  kernels::gemm_dtype gemm_dtype_ = kernels::gemm_dtype::f16;
  bool fp8_stack_qkv_ = true;
  blas::lt_gemm lt_gemm_;  // cuBLASLt (prompt steps' f16 GEMMs, gemm_dtype fp8), created at start-up
  std::vector<void*> device_allocs_, pinned_allocs_;
  // What a step begun and not yet collected keeps apart from the next one: its pinned upload
  // and result buffers, its timing events on the device's clock (step_result::device_busy_us /
  // device_idle_us), and what its records are for. Slot = steps begun so far % n_slots: one more
  // than max_begun, so that the end event of the step before a collected one is still there to
  // time the gap from.
  struct step_slot {
    unsigned char* upload_host = nullptr;   // pinned [up_off_.total]
    unsigned char* records_host = nullptr;  // pinned: candidate records, then the scores
    float* scores_host = nullptr;
    hipEvent_t begin = nullptr, end = nullptr;
    bool gap_measurable = false;            // the step begun before it recorded its end event
    std::size_t record_bytes = 0;           // per record
    std::vector<std::uint64_t> seq_ids;     // per record: its sequence and the position drawn for
    std::vector<std::int64_t> positions;
  };
  static constexpr std::size_t n_slots = max_begun + 1;
  step_slot slots_[n_slots];
  std::uint64_t begun_ = 0, collected_ = 0;  // steps begun (their begin() returned) and collected
  // The step begun last, for a plan that feeds from it: whether its begin() returned, and its
  // records on the device (records_dev_ until the next step's candidates op).
  bool last_begin_ok_ = false;
  bool holding_ = false;  // a step is begun up to its logits and waits for finish_begin()
  std::size_t last_outputs_ = 0, last_record_bytes_ = 0;
  // Decode graphs: graphs_[b - 1] runs run_body() for b decode sequences (null: run it eagerly).
  std::vector<hipGraphExec_t> graphs_;
  // ANVIL_OP_PROFILE: per-op device times of steps run eagerly (op_profile.h).
  op_profile prof_;

  // Weights: one allocation; host tensor address -> device address. derived_: vectors made from
  // the model's at start-up and uploaded with them (gemma4's router input scales).
  unsigned char* weights_ = nullptr;
  std::vector<std::vector<float>> derived_;
  std::unordered_map<const void*, const void*> dev_of_;
  const void* tok_embd_ = nullptr;
  matrix output_;
  const float* output_norm_ = nullptr;
  const float* rope_freqs_ = nullptr;
  std::vector<layer> layers_;
  // gemma4 E2B / E4B: the per-layer token embeddings (a table as tok_embd_), the embedding's
  // projection and its norm (model::llm).
  const void* ple_embd_ = nullptr;
  matrix ple_model_proj_;
  const float* ple_proj_norm_ = nullptr;

  // Scratch (one allocation): activations [max_tokens, ...], gathered rows and logits [max_seqs, ...].
  float *x_ = nullptr, *h_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *attn_ = nullptr, *o_ = nullptr;
  // The residual stream: x_, or in a step whose GEMVs norm their own input (qkv_normed,
  // glu_normed) whichever of x_ and x_alt_ [one token] holds it now; the pending norm of the next
  // q/k/v launch (its delta, null for none, and its gain) when that launch norms it.
  float *x_alt_ = nullptr, *res_ = nullptr;
  const float *pending_delta_ = nullptr, *pending_norm_ = nullptr;
  // Every layer's norms are the plain pre-norm form (no norms on a block's output, no residual
  // scale, no experts or recurrent layers, no per-layer inputs) and n_embd fits the normed GEMVs.
  bool plain_norms_ = false;
  float *gate_ = nullptr, *up_ = nullptr, *rows_ = nullptr, *logits_ = nullptr;
  // Qwen3.5: the q projection's output, each head's query then its gate [max_tokens, 2 q widths];
  // the gated DeltaNet layers' q/k/v (convolved in place), z, beta and alpha rows.
  float *qg_ = nullptr, *mix_ = nullptr, *z_ = nullptr, *beta_ = nullptr, *alpha_ = nullptr;
  // The stacked q/k/v projection's output [max_tokens, q + 2 kv widths] (gemm_dtype fp8): gate_'s
  // room when it is wide enough (gate_ is free from the down projection to the next gate/up).
  float* qkv_ = nullptr;
  // Mixture of experts [max_tokens, ...]: router logits, each token's choices and weights, the
  // pairs grouped by expert (offsets and active [n_expert + 1], sorted [tokens * k]), every pair's output
  // [tokens * k, n_embd] and the shared expert's [tokens, n_embd]. gate_ and up_ hold the pairs'
  // gate/up rows (sized for the widest use).
  float *router_logits_ = nullptr, *moe_weights_ = nullptr, *pair_out_ = nullptr, *shared_out_ = nullptr;
  float* dense_out_ = nullptr;  // gemma4: the dense feed-forward's output beside the experts' [max_tokens, n_embd]
  // gemma4 E2B / E4B: the step's per-layer inputs and the token rows of them [max_tokens, n_layer *
  // ple_dim]; a layer's gate [max_tokens, ple_dim].
  float *ple_ = nullptr, *ple_tok_ = nullptr, *ple_h_ = nullptr;
  std::int32_t *moe_ids_ = nullptr, *moe_offsets_ = nullptr, *moe_sorted_ = nullptr, *moe_active_ = nullptr;
  void* records_dev_ = nullptr;
  void* attn_ws_ = nullptr;
  std::size_t attn_ws_bytes_ = 0;
  void* cand_ws_ = nullptr;  // the candidates op's workspace, for max_seqs sequences
  std::size_t cand_ws_bytes_ = 0;
  std::int64_t attn_split_ = 0, attn_split_wide_ = 0;  // attn_split(): heads of up to / past attention_tc_max_head_dim
  void* gemv_ws_ = nullptr;          // the quantized GEMVs' activation scratch (x in int8 blocks)
  std::size_t gemv_ws_bytes_ = 0;
  // The fused gate/up's 8-bit output (glu_fused), apart from gemv_ws_'s input it is computed from;
  // the down projection's GEMV reads it as its workspace.
  void* glu_ws_ = nullptr;
  std::size_t glu_ws_bytes_ = 0;
  // The experts' 8-bit activations (null: float experts): the layer input's rows, the pairs' rows.
  void *moe_x8_h_ = nullptr, *moe_x8_pairs_ = nullptr;
  kernels::gemv_activations gemv_activations_ = kernels::gemv_activations::int8;
  float* scores_dev_ = nullptr;      // [max_tokens] log-probabilities of the score targets
  double* rope_angles_ = nullptr;    // [max_tokens][rope_dim / 2] (sin, cos): the step's, for every layer
  double* rope_angles_swa_ = nullptr;  // the same for the sliding layers' own RoPE (hp.split_rope()), else null
  float* q_temps_ = nullptr;           // [max_tokens]: each token's query temperature (mistral3), else null
  unsigned char* upload_dev_ = nullptr;
  upload_layout up_off_{};

  // Pinned host: the step being laid out's upload buffer and result buffers (its slot's).
  unsigned char* upload_host_ = nullptr;
  unsigned char* records_host_ = nullptr;
  float* scores_host_ = nullptr;     // [max_tokens], in the records' pinned allocation

  // KV pools (one allocation): the main pool's layers, then the window pool's (the sliding-window
  // layers', when the memory plan has one: gpu_worker/kv_plan.h), layer after layer, each of its
  // own KV heads and head size (gemma4's sliding and global layers differ): K's elements, V's,
  // then for 8 bits K's row scales and V's (kernels/kv_quant.h).
  struct kv_pool {
    unsigned char* base = nullptr;
    std::int64_t n_blocks = 0;
    std::vector<std::size_t> at;  // per pool layer: its first byte from base
  };
  unsigned char* kv_ = nullptr;
  kernels::kv_dtype kv_dtype_ = kernels::kv_dtype::f16;
  kv_pool main_kv_, window_kv_;
  model::kv_layer_map kv_layers_;         // which pool keeps each layer's KV (window_layers 0: no window pool)
  // The recurrent layers' state slots (in the KV allocation, after the pools), per state layer:
  // [n_state_slots][ssm_conv_state] floats from conv_state_, [n_state_slots][ssm_matrix_state]
  // from matrix_state_, as the CPU cache lays them out (model::kv_cache_storage).
  float *conv_state_ = nullptr, *matrix_state_ = nullptr;
  std::int64_t n_state_slots_ = 0;

  // The current step's shape (lay_out fills it).
  struct step_shape {
    std::int64_t tokens = 0, n_dec = 0, n_pre = 0, stride = 0, max_dec_context = 0, max_pre_tokens = 0;
    std::int64_t n_logit_rows = 0;
    bool all_rows_logits = false;  // the logit rows are rows 0 .. tokens - 1 in order: the head reads h_ as it is
    std::int64_t n_scores = 0;  // score targets >= 0, all sequences
    std::int64_t n_feeds = 0;   // rows fed from the step before (feed_from)
  } step_;
  std::vector<std::size_t> order_;          // plan index of each row: decode sequences first
  std::vector<std::int64_t> first_token_;   // per plan index: its first row of the activations
  std::vector<logit_params> lp_;
  std::vector<logit_params> slice_lp_;  // split_vocab: lp_ for this rank's slice (slice_logit_params)
  std::vector<std::int64_t> lp_positions_;
  std::vector<std::uint64_t> lp_seq_ids_;
  std::int32_t lp_max_k_ = 1;  // the records' max_k
};

}  // namespace anvil::gpu_worker
