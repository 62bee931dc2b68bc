// A decoder-only transformer loaded from GGUF: hyper-parameters from metadata and zero-copy views
// of the weights in the mapped file. Supported architectures: `llama` (Llama 2/3, Mistral-style;
// Mixtral when it has `llama.expert_count`), `qwen2` (biases on Q/K/V), `qwen3` (RMSNorm on each
// Q/K head), `qwen3moe` (qwen3's attention, a mixture of experts for the feed-forward) and
// `qwen2moe` (qwen2's attention, experts plus a shared expert). All are
// pre-norm RMSNorm blocks with grouped-query attention, RoPE and SwiGLU feed-forwards; the output
// head is its own tensor or tied to the token embedding.
//
// Gemma 3 (`gemma3`, text): qwen3's Q/K norms, plus a norm on each block's output before the
// residual add (`post_attention_norm`, `post_ffw_norm`), the embedding scaled by sqrt(n_embd), a
// GeGLU feed-forward (tanh-approximated GELU on the gate), and five sliding-window layers to one
// global layer, the sliding ones with their own RoPE (base 10000, unscaled). The file's norm
// weights already hold Gemma's 1 + w (as llama.cpp's converter writes them).
//
// Qwen3.5 / 3.6 (`qwen35`, dense): three gated DeltaNet layers to one full-attention layer
// (hparams::recurrent). The attention layers have qwen3's Q/K norms, a sigmoid gate on their output
// and RoPE on the first rope.dimension_count dims of each head (the multimodal rope's sections all
// see the same position for text, which makes it plain NeoX RoPE); both kinds of layer normalise the
// feed-forward's input with `post_attention_norm`. The file's norm weights already hold the 1 + w of
// the zero-centred norms, except the gated norm's (`ssm_norm`), used as it is. Qwen3.5-MoE
// (`qwen35moe`, Qwen3.6-35B-A3B) has the same layers with Qwen2-MoE's feed-forward: routed experts
// (softmax, top-k renormalised) and a shared expert behind a sigmoid gate.
//
// Mixture of experts (Mixtral, Qwen3-MoE): a layer's router (`ffn_gate_inp`, n_expert x n_embd)
// scores the experts, a softmax over all of them picks the n_expert_used most probable, whose
// probabilities are renormalised to sum to 1 (`expert_weights_norm`: on for Mixtral and Qwen3-MoE,
// off for Qwen2-MoE), and the layer's output is the weighted sum of those experts' SwiGLU
// feed-forwards. The experts' matrices are stacked in one GGUF tensor each (`ffn_gate_exps`,
// `ffn_up_exps`: [n_embd, n_ff_exp, n_expert]; `ffn_down_exps`: [n_ff_exp, n_embd, n_expert]),
// expert e's rows one contiguous slice. Qwen2-MoE adds a shared expert every token goes through
// (`ffn_{gate,up,down}_shexp`, width n_ff_shexp), its output scaled by sigmoid(x . ffn_gate_inp_shexp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "model/gguf/gguf.h"

namespace anvil::model {

enum class arch { llama, qwen2, qwen3, qwen3moe, qwen2moe, gpt_oss, gemma3, qwen35, qwen35moe, mistral3, gemma4 };

struct hparams {
  arch architecture = arch::llama;
  std::string arch_name;           // general.architecture as written in the file
  std::int64_t n_vocab = 0;
  std::int64_t n_ctx_train = 0;    // context length the model was trained for
  std::int64_t n_embd = 0;
  std::int64_t n_layer = 0;
  std::int64_t n_head = 0;
  std::int64_t n_head_kv = 0;
  std::int64_t head_dim = 0;       // attention.key_length, else n_embd / n_head
  std::int64_t n_ff = 0;
  float rms_eps = 1e-5f;
  float rope_base = 10000.f;
  float rope_freq_scale = 1.f;     // 1 / rope.scaling.factor for linear scaling
  // YaRN (yarn_factor > 0): the per-pair frequency factors llm::rope_freqs holds, and the
  // magnitude factor attention_scale() folds in.
  float yarn_factor = 0.f;
  std::int64_t yarn_orig_ctx = 0;
  float yarn_beta_fast = 32.f, yarn_beta_slow = 1.f;
  bool yarn_truncate = true;       // the ramp's ends rounded to whole pairs (HF's default)
  float yarn_attn_factor = 1.f;
  // mistral3 (Ministral 3, Devstral Small 2): Llama 4's attention temperature. After RoPE, the query
  // at position p is multiplied by kernels::attn_temperature(p, attn_temp_scale, attn_temp_floor)
  // = 1 + scale * ln(1 + floor(p / floor)), which is 1 within the original context. 0: none.
  float attn_temp_scale = 0.f;
  std::int64_t attn_temp_floor = 0;
  std::int64_t rope_dim = 0;       // rotated dimensions per head (rope.dimension_count)
  kernels::rope_style rope = kernels::rope_style::normal;
  bool qkv_bias = false;
  bool o_bias = false;             // gpt-oss: the attention output projection has a bias
  bool qk_norm = false;
  bool attn_sinks = false;         // gpt-oss: a sink logit per head
  // Sliding-window attention (0: none): layer l attends within the window when
  // l % swa_pattern < swa_pattern - 1 (gpt-oss: pattern 2, the even layers; gemma3: 6).
  std::int64_t sliding_window = 0;
  std::int64_t swa_pattern = 0;
  // gemma4: which layers slide, from the file (attention.sliding_window_pattern) rather than a
  // period; and the sliding layers' own head size, rotated dimensions and KV heads (0: the same
  // as every layer's). Its global layers take head_dim, rope_dim, rope_freqs and n_head_kv_global.
  std::vector<bool> swa_layers;
  std::int64_t head_dim_swa = 0, rope_dim_swa = 0;
  std::int64_t n_head_kv_global = 0;
  bool v_norm = false;             // gemma4: V normalised per head (RMSNorm without a weight)
  // gemma4 E2B / E4B: per-layer token embeddings of ple_dim per layer (embedding_length_per_layer_input;
  // 0: none); the last n_kv_shared layers (attention.shared_kv_layers) attend over the KV of the
  // last earlier layer of their kind (kv_source) and have no K/V projection of their own; the
  // feed-forward's width per layer (feed_forward_length as an array: the shared layers' are
  // double-wide; empty: n_ff everywhere, and n_ff is the widest).
  std::int64_t ple_dim = 0;
  std::int64_t n_kv_shared = 0;
  std::int64_t kv_source_swa = -1, kv_source_global = -1;  // the last layer of each kind before the shared ones
  std::vector<std::int64_t> layer_n_ff;
  float final_softcap = 0.f;       // gemma4: logits = cap * tanh(logits / cap) when > 0
  // The sliding layers' own RoPE (gemma3; rope_base_swa 0: the same as every layer's).
  float rope_base_swa = 0.f;
  float rope_freq_scale_swa = 1.f;
  float query_scale_dim = 0.f;     // scores scaled by 1 / sqrt(this) when > 0 (gemma3), else head_dim
  float embd_scale = 1.f;          // the token embedding times this (gemma3: sqrt(n_embd))
  bool post_norms = false;         // gemma3: each block's output normed before the residual add
  kernels::glu_activation ffn_act = kernels::glu_activation::silu;  // gemma3: gelu_tanh
  bool tied_output = false;
  // Mixture of experts (0 experts: every layer is dense).
  std::int64_t n_expert = 0;
  std::int64_t n_expert_used = 0;
  std::int64_t n_ff_exp = 0;       // each expert's feed-forward width
  std::int64_t n_ff_shexp = 0;     // the shared expert's (0: none)
  bool expert_weights_norm = true; // the chosen experts' probabilities renormalised to sum to 1
  bool expert_bias = false;        // gpt-oss: biases on the router and on each expert's matrices
  // The feed-forward's gate (0: SwiGLU; > 0: gpt-oss's clamped variant with this limit).
  float swiglu_limit = 0.f;
  float swiglu_alpha = 1.f;

  // Gated DeltaNet (qwen35): every layer but each full_attn_interval-th is a linear-attention
  // layer with a recurrent state per sequence instead of a KV cache (kernels/delta_net.h). The
  // full-attention layers gate their output (attn_out_gate). 0: every layer attends.
  std::int64_t full_attn_interval = 0;
  std::int64_t ssm_conv_kernel = 0;  // ssm.conv_kernel: taps of the causal convolution
  std::int64_t ssm_k_heads = 0;      // ssm.group_count: query/key heads
  std::int64_t ssm_v_heads = 0;      // ssm.time_step_rank: value heads (a multiple of the key heads)
  std::int64_t ssm_head_k = 0;       // ssm.state_size: a key head's size
  std::int64_t ssm_head_v = 0;       // ssm.inner_size / value heads: a value head's size
  // qwen35: the q projection gives each head's query and, after it, a gate of the same size; the
  // attention output is multiplied by sigmoid(gate) before the output projection.
  bool attn_out_gate = false;

  // Whether layer l is a recurrent (gated DeltaNet) layer.
  bool recurrent(std::int64_t l) const { return full_attn_interval > 0 && (l + 1) % full_attn_interval != 0; }
  bool has_recurrent() const { return full_attn_interval > 1; }
  // The convolution's channels: q and k of every key head, v of every value head.
  std::int64_t ssm_conv_channels() const { return 2 * ssm_k_heads * ssm_head_k + ssm_v_heads * ssm_head_v; }
  // Floats of one sequence's state in one recurrent layer: the convolution's last inputs and the
  // delta rule's matrices.
  std::int64_t ssm_conv_state() const { return (ssm_conv_kernel - 1) * ssm_conv_channels(); }
  std::int64_t ssm_matrix_state() const { return ssm_v_heads * ssm_head_k * ssm_head_v; }

  // The window layer l attends within (0: the whole context).
  std::int64_t layer_window(std::int64_t l) const {
    if (!swa_layers.empty()) return swa_layers[std::size_t(l)] ? sliding_window : 0;
    return sliding_window > 0 && swa_pattern > 0 && l % swa_pattern < swa_pattern - 1 ? sliding_window : 0;
  }
  // Layer l's attention shape: its head size, KV heads and rotated dimensions.
  std::int64_t layer_head_dim(std::int64_t l) const { return head_dim_swa > 0 && layer_window(l) > 0 ? head_dim_swa : head_dim; }
  std::int64_t layer_kv_heads(std::int64_t l) const {
    return n_head_kv_global > 0 && layer_window(l) == 0 ? n_head_kv_global : n_head_kv;
  }
  std::int64_t layer_rope_dim(std::int64_t l) const { return rope_dim_swa > 0 && layer_window(l) > 0 ? rope_dim_swa : rope_dim; }
  std::int64_t layer_ff(std::int64_t l) const { return layer_n_ff.empty() ? n_ff : layer_n_ff[std::size_t(l)]; }
  bool kv_shared(std::int64_t l) const { return n_kv_shared > 0 && l >= n_layer - n_kv_shared; }
  // The layer whose KV layer l attends over: l, or for a shared layer the last layer before the
  // shared ones that slides as it does (HF's store_full_length_kv); -1 where none does (the loader
  // refuses such a file).
  std::int64_t kv_source(std::int64_t l) const {
    return !kv_shared(l) ? l : layer_window(l) > 0 ? kv_source_swa : kv_source_global;
  }
  std::int64_t sliding_rope_dim() const { return rope_dim_swa > 0 ? rope_dim_swa : rope_dim; }  // a sliding layer's
  // RoPE of layer l: the sliding layers' own where the model has one.
  struct rope_of_layer {
    float base, freq_scale;
  };
  bool own_rope(std::int64_t l) const { return rope_base_swa > 0 && layer_window(l) > 0; }  // a sliding layer's own
  rope_of_layer layer_rope(std::int64_t l) const {
    return own_rope(l) ? rope_of_layer{rope_base_swa, rope_freq_scale_swa} : rope_of_layer{rope_base, rope_freq_scale};
  }
  bool split_rope() const { return rope_base_swa > 0 && sliding_window > 0; }
  // Scores are q.k times this: 1 / sqrt(head_dim) (or query_scale_dim), times YaRN's magnitude
  // factor on q and on k.
  float attention_scale() const;
};

// A matrix weight as stored in the file: `out` rows of `in` elements in `type`.
struct weight {
  const std::byte* data = nullptr;
  ggml_type type = ggml_type::F32;
  std::int64_t in = 0;
  std::int64_t out = 0;
};

// `count` matrices of `out` rows of `in` elements stacked in one tensor (a layer's experts).
struct stacked_weight {
  const std::byte* data = nullptr;
  ggml_type type = ggml_type::F32;
  std::int64_t in = 0;
  std::int64_t out = 0;
  std::int64_t count = 0;
  std::size_t stride = 0;  // bytes from one matrix to the next
  weight at(std::int64_t i) const { return {data + std::size_t(i) * stride, type, in, out}; }
};

struct layer_weights {
  std::vector<float> attn_norm, ffn_norm;  // [n_embd]
  std::vector<float> q_norm, k_norm;       // [head_dim], qwen3 and gemma3
  std::vector<float> post_attn_norm, post_ffn_norm;  // [n_embd], gemma3 (hp.post_norms)
  std::vector<float> bq, bk, bv;           // qwen2, gpt-oss
  std::vector<float> bo;                   // gpt-oss
  std::vector<float> sinks;                // [n_head], gpt-oss
  weight wq, wk, wv, wo;                   // gemma4's global layers may have no wv (V is K's projection)
  weight gate, up, down;                   // a dense layer's feed-forward
  weight router;                           // a mixture-of-experts layer's: in = n_embd, out = n_expert
  stacked_weight gate_exps, up_exps, down_exps;
  // gpt-oss: the router's bias [n_expert] and each expert's biases, expert e's at e * out.
  std::vector<float> router_b, gate_exps_b, up_exps_b, down_exps_b;
  // A gated DeltaNet layer's (hp.recurrent): the q/k/v projection (attn_qkv, ssm_conv_channels
  // out) and the output gate's (attn_gate), beta's and alpha's (v_heads out each), the convolution's
  // taps [channels][kernel], a and the dt bias per value head, the gated norm [head_v], the output
  // projection (ssm_out). Such a layer has no wq/wk/wv/wo.
  weight ssm_qkv, ssm_z, ssm_beta, ssm_alpha, ssm_out;
  std::vector<float> ssm_conv, ssm_a, ssm_dt_bias, ssm_norm;
  weight gate_shexp, up_shexp, down_shexp;  // the shared expert (Qwen2-MoE), absent elsewhere
  std::vector<float> shexp_gate;            // [n_embd]: its output scaled by sigmoid(x . shexp_gate)
  float out_scale = 1.f;                    // gemma4: the layer's output (the whole residual) times this
  // gemma4 E2B / E4B (hp.ple_dim): after the feed-forward's residual add, x += post_norm(proj(
  // gelu_tanh(gate(x)) * the layer's per-layer input)), before out_scale. gate: n_embd -> ple_dim.
  weight ple_gate, ple_proj;
  std::vector<float> ple_post_norm;
  // gemma4 with experts (26B-A4B): the dense feed-forward (gate/up/down) runs beside them. The
  // router reads the residual normed without a weight, times router_scale / sqrt(n_embd); each
  // chosen expert's weight is times its expert_scale; the experts read the residual normed by
  // pre_ffn_norm_2; the two outputs are normed (post_ffn_norm_1, post_ffn_norm_2) and summed.
  std::vector<float> router_scale, expert_scale, pre_ffn_norm_2, post_ffn_norm_1, post_ffn_norm_2;
  bool moe() const { return router.data != nullptr; }
  bool recurrent() const { return ssm_qkv.data != nullptr; }
};

struct llm {
  hparams hp;
  gguf_file file;                  // owns the mapping every weight points into
  weight tok_embd;                 // in = n_embd, out = n_vocab
  weight output;                   // the head; same as tok_embd when tied
  std::vector<float> output_norm;
  std::vector<float> rope_freqs;   // per-pair frequency factors (Llama 3.1's, or YaRN's), empty if none
  std::vector<layer_weights> layers;
  // gemma4 E2B / E4B (hp.ple_dim > 0): each token's per-layer inputs, [n_layer][ple_dim], are
  // (rms_norm(ple_model_proj(x) / sqrt(n_embd)) per layer with ple_proj_norm + ple_embd's row of
  // the token times sqrt(ple_dim)) / sqrt(2), x the scaled token embedding.
  weight ple_embd;                 // in = n_layer * ple_dim, out = n_vocab
  weight ple_model_proj;           // in = n_embd, out = n_layer * ple_dim
  std::vector<float> ple_proj_norm;

  std::size_t weight_bytes() const;  // bytes of all tensors (what a decode step streams)
  // What one token reads: all tensors, except that of each layer's stacked experts only the
  // n_expert_used it is routed to count (equal to weight_bytes() without experts).
  std::size_t token_weight_bytes() const;
  bool has_experts() const { return hp.n_expert > 0; }
};

// Where each layer keeps what it remembers of a sequence: its KV in the main pool, or in the window
// pool (a sliding-window layer, when the worker keeps one: kv_config::window), or a recurrent state
// in the state pool (a gated DeltaNet layer: kv_config::n_state_slots), at its place among that
// pool's layers. Shared by the CPU cache, the GPU worker and the memory plan so they lay the pools
// out alike.
struct kv_layer_map {
  enum class pool : std::uint8_t { main, window, state };
  std::vector<pool> home;           // per layer
  std::vector<std::int64_t> index;  // per layer: its index among its pool's layers
  std::int64_t main_layers = 0, window_layers = 0, state_layers = 0;
  bool windowed(std::int64_t l) const { return home[std::size_t(l)] == pool::window; }
  bool stateful(std::int64_t l) const { return home[std::size_t(l)] == pool::state; }
};
kv_layer_map map_kv_layers(const hparams& hp, bool window_pool);
// Layer l's pool in map_kv_layers, without building the map (bytes_per_block: a file's hparams may
// name millions of layers before the loader finds their tensors missing).
kv_layer_map::pool kv_home(const hparams& hp, bool window_pool, std::int64_t l);
// Only the counts of map_kv_layers (main_layers, window_layers, state_layers; no per-layer
// vectors): what sizing from the hyper-parameters alone needs, before the file's tensors vouch
// for its block count.
kv_layer_map count_kv_layers(const hparams& hp, bool window_pool);

// Reads hyper-parameters and checks every tensor's presence, type and shape; throws model_error
// naming the first problem ("unsupported architecture 'gemma2'", "tensor 'blk.3.ffn_up.weight'
// has shape [4096, 11008], expected [4096, 14336]").
llm load_llm(gguf_file file);
hparams read_hparams(const gguf_file& f);

std::string_view arch_name(arch a);

}  // namespace anvil::model
