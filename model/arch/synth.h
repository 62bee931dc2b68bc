// Random-weight models of real shapes, written as GGUF: fixtures for tests and benchmarks, and
// `anvil synth`. Weights are scaled so activations stay finite through every layer (linear
// weights ~ N(0, 1/in), norms ~ 1), and the files carry the same metadata real converters write.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/arch/llm.h"
#include "model/tokenizer/tokenizer.h"

namespace anvil::model {

struct synth_shape {
  std::string name;        // "tiny", "qwen2.5-0.5b", "llama3-8b", "qwen3-8b", "qwen3-30b-a3b", ...
  arch architecture;
  std::int64_t n_vocab;    // used with the synthetic tokenizer; a real one sets its own size
  std::int64_t n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_ctx;
  float rope_base, rms_eps;
  bool tied_output;
  // Mixture of experts (every layer; 0: dense): experts, those used per token, each one's width,
  // and the shared expert's width (qwen2moe; 0: none).
  std::int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
  // gpt-oss: the sliding window of its even layers, and YaRN (factor over the original context);
  // gemma3: the window of its sliding layers, and the global layers' linear RoPE scaling.
  std::int64_t sliding_window = 0;
  float yarn_factor = 0.f;
  std::int64_t yarn_orig_ctx = 0;
  float rope_linear_factor = 0.f;
  // qwen35: a full-attention layer every full_attn_interval layers, gated DeltaNet layers between
  // (key and value heads of ssm_head dims, a convolution of ssm_conv_kernel taps), RoPE on the
  // first rope_dim dims of each head (0: all of them).
  std::int64_t full_attn_interval = 0, ssm_k_heads = 0, ssm_v_heads = 0, ssm_head = 0, ssm_conv_kernel = 0;
  std::int64_t rope_dim = 0;
  // mistral3: Llama 4's attention temperature (with YaRN: the floor is its original context).
  float attn_temp_scale = 0.f;
  // gemma4: five sliding layers to one global (and the last global), the sliding layers' heads of
  // head_dim_swa dims on n_head_kv KV heads, the global layers' of head_dim on n_head_kv_global
  // with V their K projection (no attn_v, as the 31B and 26B-A4B), RoPE on a quarter of the global
  // heads (rope_freqs), soft-capped logits.
  std::int64_t head_dim_swa = 0, n_head_kv_global = 0;
  float final_softcap = 0.f;
  // gemma4 E2B / E4B: per-layer token embeddings of ple_dim per layer, the last n_kv_shared layers
  // attending over an earlier layer's KV (no attn_k / attn_v of their own), with feed-forwards twice
  // n_ff wide when double_wide (feed_forward_length then an array); global_v: the global layers
  // have a V projection of their own (the E4B's) instead of reading K as V.
  std::int64_t ple_dim = 0, n_kv_shared = 0;
  bool double_wide = false, global_v = false;
};

// gemma4's layer pattern as anvil synth writes it (HF's default): every sixth layer and the last
// are global, the others slide.
inline bool gemma4_synth_sliding(std::int64_t layer, std::int64_t n_layer) {
  return layer % 6 != 5 && layer != n_layer - 1;
}

const std::vector<synth_shape>& synth_shapes();
const synth_shape* find_synth_shape(std::string_view name);

// Weight type mixes, named like llama.cpp's file types.
enum class synth_mix { f32, f16, bf16, q8_0, q4_0, q6_k, q4_k_m, iq4_xs, mxfp4 };
// "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q6_K", "Q4_K_M", "IQ4_XS", "MXFP4"
std::optional<synth_mix> parse_synth_mix(std::string_view name);
std::string_view synth_mix_name(synth_mix m);

struct synth_options {
  synth_shape shape;
  synth_mix mix = synth_mix::f16;
  std::uint64_t seed = 1;
  std::optional<tokenizer_spec> tokenizer;  // a real tokenizer; else a synthetic byte-level one
  std::string chat_template;                // written as tokenizer.chat_template when not empty
  // A scripted model, for end-to-end tests of what servers make of an output (tool calls,
  // reasoning): every layer adds nothing to the residual stream (zero attn_output and ffn_down),
  // so the next token depends on the current one alone, and greedy decoding answers each `from`
  // token with its `to` token. Distinct `from` tokens: at most n_embd. Shapes with a separate
  // output head only.
  std::vector<std::pair<std::int32_t, std::int32_t>> greedy_chain{};
};

// A byte-level BPE vocabulary (no merges) of n_vocab tokens: the 256 byte tokens, the control
// tokens <|endoftext|>, <|im_start|>, <|im_end|>, then reserved filler.
tokenizer_spec synthetic_tokenizer(std::int64_t n_vocab);

// The type a weight gets under a mix (norms and biases stay F32; rows a block cannot divide
// fall back to Q8_0, then F16).
ggml_type synth_weight_type(synth_mix mix, const std::string& tensor_name, std::int64_t row_len, std::int64_t layer,
                            std::int64_t n_layer);

// Writes the model; `progress(done_bytes, total_bytes)` after each tensor.
void write_synth_model(const synth_options& opt, const std::string& path,
                       const std::function<void(std::size_t, std::size_t)>& progress = {});

}  // namespace anvil::model
