#include "model/arch/llm.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "kernels/delta_net.h"

namespace anvil::model {
namespace {

std::string shape_str(const std::vector<std::int64_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

class loader {
 public:
  loader(const gguf_file& f) : f_(f) {}

  const gguf_tensor* find(const std::string& name, std::vector<std::int64_t> shape, bool required) const {
    const gguf_tensor* t = f_.find_tensor(name);
    if (!t) {
      if (required) throw model_error("missing tensor '" + name + "'");
      return nullptr;
    }
    if (t->dims != shape) {
      throw model_error("tensor '" + name + "' has shape " + shape_str(t->dims) + ", expected " + shape_str(shape));
    }
    if (!info(t->type).supported) {
      throw model_error("tensor '" + name + "' has type " + std::string(info(t->type).name) + ", which anvil cannot read yet");
    }
    return t;
  }

  bool has(const std::string& name) const { return f_.find_tensor(name) != nullptr; }

  weight matrix(const std::string& name, std::int64_t in, std::int64_t out) const {
    const gguf_tensor* t = find(name, {in, out}, true);
    return {t->data, t->type, in, out};
  }

  // Two halves of each stacked matrix: rows [0, out) and [out, 2 out) of every one of `count`
  // matrices of 2 out rows (gemma4's ffn_gate_up_exps: each expert's gate rows, then its up rows).
  std::pair<stacked_weight, stacked_weight> stacked_halves(const std::string& name, std::int64_t in, std::int64_t out,
                                                           std::int64_t count) const {
    const stacked_weight both = stacked(name, in, 2 * out, count);
    const std::size_t half = both.stride / 2;  // out rows of whole blocks
    stacked_weight first = both;
    first.out = out;
    stacked_weight second = first;
    second.data = both.data + half;
    return {first, second};
  }

  stacked_weight stacked(const std::string& name, std::int64_t in, std::int64_t out, std::int64_t count) const {
    const gguf_tensor* t = find(name, {in, out, count}, true);
    return {.data = t->data, .type = t->type, .in = in, .out = out, .count = count,
            .stride = t->nbytes / std::size_t(count)};
  }

  std::vector<float> vec(const std::string& name, std::int64_t n, bool required = true) const {
    const gguf_tensor* t = find(name, {n}, required);
    if (!t) return {};
    std::vector<float> v(static_cast<std::size_t>(n));
    dequantize_row(t->type, t->data, v.data(), n);
    return v;
  }

  // `count` vectors of n floats stacked in one tensor [n, count] (a layer's experts' biases).
  std::vector<float> vecs(const std::string& name, std::int64_t n, std::int64_t count) const {
    const gguf_tensor* t = find(name, {n, count}, true);
    std::vector<float> v(static_cast<std::size_t>(n * count));
    const std::size_t row = t->nbytes / std::size_t(count);
    for (std::int64_t i = 0; i < count; ++i) dequantize_row(t->type, t->data + std::size_t(i) * row, v.data() + i * n, n);
    return v;
  }

 private:
  const gguf_file& f_;
};

std::int64_t required_int(const gguf_file& f, const std::string& key) {
  const auto v = f.get_int(key);
  if (!v) throw model_error("missing metadata '" + key + "'");
  if (*v <= 0) throw model_error("metadata '" + key + "' is " + std::to_string(*v) + ", expected a positive integer");
  return *v;
}

// Gated DeltaNet's hyper-parameters (qwen35), with llama.cpp's names for them.
void read_delta_net(const gguf_file& f, const std::string& a, hparams& hp) {
  hp.attn_out_gate = true;
  hp.full_attn_interval = f.find(a + "full_attention_interval") ? required_int(f, a + "full_attention_interval") : 4;
  if (f.find(a + "attention.recurrent_layers")) {
    throw model_error("metadata '" + a + "attention.recurrent_layers': anvil takes the layer schedule from "
                      "full_attention_interval only");
  }
  hp.ssm_conv_kernel = required_int(f, a + "ssm.conv_kernel");
  hp.ssm_head_k = required_int(f, a + "ssm.state_size");
  hp.ssm_k_heads = required_int(f, a + "ssm.group_count");
  hp.ssm_v_heads = required_int(f, a + "ssm.time_step_rank");
  const std::int64_t inner = required_int(f, a + "ssm.inner_size");
  if (hp.full_attn_interval < 2) {
    throw model_error("full_attention_interval " + std::to_string(hp.full_attn_interval) + ": at least 2 expected");
  }
  if (hp.ssm_conv_kernel < 2 || hp.ssm_conv_kernel > kernels::conv1d_max_taps) {
    throw model_error("ssm.conv_kernel " + std::to_string(hp.ssm_conv_kernel) + " (2 to " +
                      std::to_string(kernels::conv1d_max_taps) + " taps supported)");
  }
  if (hp.ssm_v_heads % hp.ssm_k_heads != 0 || inner % hp.ssm_v_heads != 0) {
    throw model_error("ssm.time_step_rank " + std::to_string(hp.ssm_v_heads) + " must be a multiple of ssm.group_count " +
                      std::to_string(hp.ssm_k_heads) + " and divide ssm.inner_size " + std::to_string(inner));
  }
  hp.ssm_head_v = inner / hp.ssm_v_heads;
  // Each sequence's state is a matrix per value head: keep every product far from overflowing.
  if (hp.ssm_head_k > 1024 || hp.ssm_head_v > 1024 || hp.ssm_v_heads > 1024) {
    throw model_error("gated DeltaNet heads of " + std::to_string(hp.ssm_head_k) + " x " + std::to_string(hp.ssm_head_v) +
                      " (" + std::to_string(hp.ssm_v_heads) + " of them): at most 1024 each");
  }
}

// gemma4's attention.head_count_kv: one count per layer, the sliding layers' alike and the global
// layers' alike (HF's num_key_value_heads and num_global_key_value_heads), told apart by the
// layer pattern: n_head_kv is the sliding layers' count, n_head_kv_global the global layers'.
void read_gemma4_kv_heads(const gguf_file& f, const std::string& a, hparams& hp) {
  const auto counts = f.get_i32_array(a + "attention.head_count_kv");
  if (counts->size() != std::size_t(hp.n_layer)) {
    throw model_error("gemma4: metadata '" + a + "attention.head_count_kv' as an array needs one count per block");
  }
  for (std::size_t l = 0; l < counts->size(); ++l) {
    std::int64_t& n = hp.swa_layers[l] ? hp.n_head_kv : hp.n_head_kv_global;
    if ((*counts)[l] < 1 || (n != 0 && n != (*counts)[l])) {
      throw model_error("gemma4: attention.head_count_kv differs between layers of one kind (or is not positive)");
    }
    n = (*counts)[l];
  }
  if (hp.n_head_kv == 0) hp.n_head_kv = hp.n_head_kv_global;  // no sliding layer
  for (const std::int64_t n : {hp.n_head_kv, hp.n_head_kv_global}) {
    if (n > 0 && hp.n_head % n != 0) throw model_error("gemma4: head_count is not a multiple of a layer's head_count_kv");
  }
}

// Gemma 4 (text): sliding layers (the file's pattern) with their own head size, KV heads and RoPE
// base; global layers with heads of attention.key_length, the proportional RoPE llama.cpp's
// converter writes as rope_freqs (pairs past the rotated quarter divided by 1e30, so unrotated);
// V normalised without a weight; scores unscaled (the q/k norms do it); a scale per layer's
// output; soft-capped logits. E2B / E4B: per-layer token embeddings, the last layers attending over
// an earlier layer's KV, and (read with feed_forward_length) their double-wide feed-forwards.
void read_gemma4(const gguf_file& f, const std::string& a, hparams& hp) {
  hp.ple_dim = f.get_int(a + "embedding_length_per_layer_input").value_or(0);
  if (hp.ple_dim < 0 || hp.ple_dim > 65536) {
    throw model_error("gemma4: metadata '" + a + "embedding_length_per_layer_input' out of range");
  }
  hp.n_kv_shared = f.get_int(a + "attention.shared_kv_layers").value_or(0);
  if (hp.n_kv_shared < 0 || hp.n_kv_shared >= hp.n_layer) {
    throw model_error("gemma4: metadata '" + a + "attention.shared_kv_layers' is " + std::to_string(hp.n_kv_shared) +
                      " of " + std::to_string(hp.n_layer) + " blocks");
  }
  hp.sliding_window = required_int(f, a + "attention.sliding_window");
  if (hp.sliding_window < 1) throw model_error("attention.sliding_window must be positive");
  hp.head_dim_swa = required_int(f, a + "attention.key_length_swa");
  if (f.find(a + "attention.value_length_swa") && required_int(f, a + "attention.value_length_swa") != hp.head_dim_swa) {
    throw model_error("attention.value_length_swa differs from key_length_swa, which anvil does not support");
  }
  hp.rope_dim_swa = f.find(a + "rope.dimension_count_swa") ? required_int(f, a + "rope.dimension_count_swa") : hp.head_dim_swa;
  if (hp.head_dim_swa < 1 || hp.head_dim_swa > 1024 || hp.rope_dim_swa > hp.head_dim_swa || hp.rope_dim_swa % 2) {
    throw model_error("gemma4: attention.key_length_swa / rope.dimension_count_swa out of range");
  }
  if (hp.n_head_kv_global == hp.n_head_kv) hp.n_head_kv_global = 0;  // the same everywhere
  hp.rope_base_swa = static_cast<float>(f.get_float(a + "rope.freq_base_swa").value_or(10000.0));
  hp.rope_freq_scale_swa = 1.f;
  hp.embd_scale = static_cast<float>(std::sqrt(double(hp.n_embd)));
  hp.post_norms = true;
  hp.ffn_act = kernels::glu_activation::gelu_tanh;
  hp.v_norm = true;
  hp.query_scale_dim = 1.f;  // scaling 1: q.k as is
  hp.final_softcap = static_cast<float>(f.get_float(a + "final_logit_softcapping").value_or(0.0));
  if (!(hp.final_softcap >= 0)) throw model_error("final_logit_softcapping must not be negative");
  // The shared layers' sources (the window known): the last layer of each kind before them.
  for (std::int64_t l = 0; l < hp.n_layer - hp.n_kv_shared; ++l) {
    (hp.layer_window(l) > 0 ? hp.kv_source_swa : hp.kv_source_global) = l;
  }
  for (std::int64_t l = hp.n_layer - hp.n_kv_shared; l < hp.n_layer; ++l) {
    if (hp.kv_source(l) < 0) {
      throw model_error("gemma4: layer " + std::to_string(l) + " shares the KV of the last earlier " +
                        (hp.layer_window(l) > 0 ? "sliding" : "global") + " layer, and no such layer comes before the " +
                        std::to_string(hp.n_kv_shared) + " shared ones");
    }
  }
}

}  // namespace

std::string_view arch_name(arch a) {
  switch (a) {
    case arch::llama: return "llama";
    case arch::qwen2: return "qwen2";
    case arch::qwen3: return "qwen3";
    case arch::qwen3moe: return "qwen3moe";
    case arch::qwen2moe: return "qwen2moe";
    case arch::gpt_oss: return "gpt-oss";
    case arch::gemma3: return "gemma3";
    case arch::qwen35: return "qwen35";
    case arch::qwen35moe: return "qwen35moe";
    case arch::mistral3: return "mistral3";
    case arch::gemma4: return "gemma4";
  }
  return "?";
}

hparams read_hparams(const gguf_file& f) {
  hparams hp;
  const auto name = f.get_string("general.architecture");
  if (!name) throw model_error("missing metadata 'general.architecture'");
  hp.arch_name = std::string(*name);
  if (hp.arch_name == "llama") {
    hp.architecture = arch::llama;
  } else if (hp.arch_name == "qwen2") {
    hp.architecture = arch::qwen2;
  } else if (hp.arch_name == "qwen3") {
    hp.architecture = arch::qwen3;
  } else if (hp.arch_name == "qwen3moe") {
    hp.architecture = arch::qwen3moe;
  } else if (hp.arch_name == "qwen2moe") {
    hp.architecture = arch::qwen2moe;
  } else if (hp.arch_name == "gpt-oss") {
    hp.architecture = arch::gpt_oss;
  } else if (hp.arch_name == "gemma3") {
    hp.architecture = arch::gemma3;
  } else if (hp.arch_name == "qwen35") {
    hp.architecture = arch::qwen35;
  } else if (hp.arch_name == "qwen35moe") {
    hp.architecture = arch::qwen35moe;
  } else if (hp.arch_name == "mistral3") {
    hp.architecture = arch::mistral3;
  } else if (hp.arch_name == "gemma4") {
    hp.architecture = arch::gemma4;
  } else {
    throw model_error("unsupported architecture '" + hp.arch_name +
                      "' (anvil runs llama, qwen2, qwen3, qwen2moe, qwen3moe, gpt-oss, gemma3, gemma4, qwen35, qwen35moe and "
                      "mistral3)");
  }
  const bool qwen35 = hp.architecture == arch::qwen35 || hp.architecture == arch::qwen35moe;
  const std::string a = hp.arch_name + ".";
  hp.n_ctx_train = required_int(f, a + "context_length");
  hp.n_embd = required_int(f, a + "embedding_length");
  hp.n_layer = required_int(f, a + "block_count");
  // Newer converters append the multi-token-prediction block(s) after the model's own and count
  // them in block_count; anvil runs the model's blocks and leaves those unread.
  if (const auto mtp = f.get_int(a + "nextn_predict_layers"); mtp && *mtp != 0) {
    if (*mtp < 0 || *mtp >= hp.n_layer) {
      throw model_error("metadata '" + a + "nextn_predict_layers' is " + std::to_string(*mtp) + " of " +
                        std::to_string(hp.n_layer) + " blocks");
    }
    hp.n_layer -= *mtp;
  }
  if (const gguf_value* ff = f.find(a + "feed_forward_length"); ff && ff->type == gguf_type::array) {
    // Gemma 4 E2B / E4B: a width per layer, the shared-KV layers' double-wide.
    if (hp.architecture != arch::gemma4) {
      throw model_error("metadata '" + a + "feed_forward_length' per layer is Gemma 4's, not " + hp.arch_name + "'s");
    }
    const auto widths = f.get_i32_array(a + "feed_forward_length");
    if (widths->size() != std::size_t(hp.n_layer)) {
      throw model_error("metadata '" + a + "feed_forward_length' as an array needs one width per block");
    }
    for (const std::int32_t w : *widths) {
      if (w < 1) throw model_error("metadata '" + a + "feed_forward_length': a width is not positive");
      hp.layer_n_ff.push_back(w);
      hp.n_ff = std::max<std::int64_t>(hp.n_ff, w);
    }
  } else {
    // qwen35moe files may leave it out: every layer has experts.
    hp.n_ff = hp.architecture == arch::qwen35moe && !f.find(a + "feed_forward_length")
                  ? 0
                  : required_int(f, a + "feed_forward_length");
  }
  hp.n_head = required_int(f, a + "attention.head_count");
  if (hp.architecture == arch::gemma4) {  // which layers slide: the KV heads per layer and read_gemma4 need it
    const auto pattern = f.get_bool_array(a + "attention.sliding_window_pattern");
    if (!pattern || pattern->size() != std::size_t(hp.n_layer)) {
      throw model_error("gemma4: metadata '" + a + "attention.sliding_window_pattern' needs one bool per block");
    }
    hp.swa_layers = *pattern;
  }
  const gguf_value* kv_heads = f.find(a + "attention.head_count_kv");
  if (kv_heads && kv_heads->type == gguf_type::array && hp.architecture == arch::gemma4) {
    read_gemma4_kv_heads(f, a, hp);  // a count per layer: the sliding layers' and the global layers'
  } else {
    hp.n_head_kv = kv_heads ? required_int(f, a + "attention.head_count_kv") : hp.n_head;
  }
  if (hp.n_head % hp.n_head_kv != 0) {
    throw model_error("attention.head_count " + std::to_string(hp.n_head) + " is not a multiple of head_count_kv " + std::to_string(hp.n_head_kv));
  }
  hp.head_dim = f.find(a + "attention.key_length") ? required_int(f, a + "attention.key_length") : hp.n_embd / hp.n_head;
  if (f.find(a + "attention.value_length") && required_int(f, a + "attention.value_length") != hp.head_dim) {
    throw model_error("attention.value_length differs from key_length, which anvil does not support");
  }
  if (!f.find(a + "attention.key_length") && hp.n_embd % hp.n_head != 0) {
    throw model_error("embedding_length is not a multiple of head_count and no attention.key_length is given");
  }
  // The loader and the KV-cache sizing multiply these out; the limit is far beyond any real model
  // (Llama 3.1 405B: 126 blocks x 128 heads x 128) and keeps every such product from overflowing.
  std::int64_t per_token = 0;
  if (__builtin_mul_overflow(hp.n_layer, hp.n_head, &per_token) || __builtin_mul_overflow(per_token, hp.head_dim, &per_token) ||
      per_token > (std::int64_t(1) << 32)) {
    throw model_error("block_count " + std::to_string(hp.n_layer) + " x head_count " + std::to_string(hp.n_head) +
                      " x head size " + std::to_string(hp.head_dim) + " is too large");
  }
  hp.rms_eps = static_cast<float>(f.get_float(a + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  if (!(hp.rms_eps > 0)) throw model_error("attention.layer_norm_rms_epsilon must be positive");
  hp.rope_base = static_cast<float>(f.get_float(a + "rope.freq_base").value_or(10000.0));
  if (!(hp.rope_base > 1)) throw model_error("rope.freq_base must be greater than 1");
  hp.rope_dim = f.find(a + "rope.dimension_count") ? required_int(f, a + "rope.dimension_count") : hp.head_dim;
  if (hp.rope_dim > hp.head_dim || hp.rope_dim % 2) throw model_error("rope.dimension_count must be even and at most the head size");

  const std::string scaling(f.get_string(a + "rope.scaling.type").value_or("none"));
  if (scaling == "linear") {
    const double factor = f.get_float(a + "rope.scaling.factor").value_or(1.0);
    if (!(factor > 0)) throw model_error("rope.scaling.factor must be positive");
    hp.rope_freq_scale = static_cast<float>(1.0 / factor);
  } else if (scaling == "yarn") {
    hp.yarn_factor = static_cast<float>(f.get_float(a + "rope.scaling.factor").value_or(0.0));
    if (!(hp.yarn_factor >= 1)) throw model_error("rope.scaling.factor must be at least 1 for YaRN");
    hp.yarn_orig_ctx = required_int(f, a + "rope.scaling.original_context_length");
    hp.yarn_beta_fast = static_cast<float>(f.get_float(a + "rope.scaling.yarn_beta_fast").value_or(32.0));
    hp.yarn_beta_slow = static_cast<float>(f.get_float(a + "rope.scaling.yarn_beta_slow").value_or(1.0));
    if (!(hp.yarn_beta_fast > 0) || !(hp.yarn_beta_slow > 0)) throw model_error("rope.scaling.yarn_beta_fast/slow must be positive");
    hp.yarn_truncate = hp.architecture != arch::gpt_oss;
    hp.yarn_attn_factor = 0.1f * std::log(hp.yarn_factor) + 1.f;
    // mistral3: HF's mscale_all_dim, which divides the magnitude factor by its own (with mscale 1:
    // Ministral 3's 1 gives a factor of exactly 1), as llama.cpp reads it.
    if (const auto m = f.get_float(a + "rope.scaling.yarn_log_multiplier")) {
      if (hp.architecture != arch::mistral3) {
        throw model_error("metadata '" + a + "rope.scaling.yarn_log_multiplier' is supported for mistral3 only");
      }
      if (!(*m >= 0)) throw model_error("rope.scaling.yarn_log_multiplier must not be negative");
      hp.yarn_attn_factor /= 0.1f * static_cast<float>(*m) * std::log(hp.yarn_factor) + 1.f;
    }
  } else if (scaling != "none") {
    throw model_error("rope scaling '" + scaling + "' is not supported (anvil supports none, linear and yarn)");
  }
  const bool gpt_oss = hp.architecture == arch::gpt_oss, gemma3 = hp.architecture == arch::gemma3;
  const bool gemma4 = hp.architecture == arch::gemma4;
  // llama.cpp's converter permutes llama's and mistral3's q/k rows for the interleaved rotation.
  hp.rope = hp.architecture == arch::llama || hp.architecture == arch::mistral3 ? kernels::rope_style::normal
                                                                                 : kernels::rope_style::neox;
  if (const auto beta = f.get_float(a + "attention.temperature_scale")) {
    if (hp.architecture != arch::mistral3) {
      throw model_error("metadata '" + a + "attention.temperature_scale' (Llama 4's attention temperature) is supported "
                        "for mistral3 only");
    }
    if (!(*beta >= 0) || *beta > 16) throw model_error("attention.temperature_scale must be in [0, 16]");
    if (hp.rope_dim != hp.head_dim) {
      throw model_error("attention.temperature_scale with rope.dimension_count below the head size is not supported");
    }
    hp.attn_temp_scale = static_cast<float>(*beta);
    // llama.cpp's n_attn_temp_floor_scale: the original context YaRN extends.
    hp.attn_temp_floor = hp.yarn_orig_ctx > 0 ? hp.yarn_orig_ctx : hp.n_ctx_train;
    if (hp.attn_temp_floor < 1) throw model_error("attention.temperature_scale needs a positive original context length");
  }
  hp.qkv_bias = hp.architecture == arch::qwen2 || hp.architecture == arch::qwen2moe || gpt_oss;
  hp.o_bias = hp.attn_sinks = hp.expert_bias = gpt_oss;
  hp.qk_norm = hp.architecture == arch::qwen3 || hp.architecture == arch::qwen3moe || gemma3 || gemma4 || qwen35;
  if (qwen35) read_delta_net(f, a, hp);
  if (gpt_oss) {
    hp.swiglu_limit = 7.f;  // constants of the architecture (HF GptOssExperts, llama.cpp's swiglu_oai)
    hp.swiglu_alpha = 1.702f;
    hp.sliding_window = required_int(f, a + "attention.sliding_window");
    hp.swa_pattern = 2;
  } else if (gemma3) {
    // Constants of the architecture (HF Gemma3TextConfig: sliding_window_pattern 6,
    // rope_local_base_freq 10000; the linear scaling of rope.scaling is the global layers' only).
    hp.sliding_window = required_int(f, a + "attention.sliding_window");
    hp.swa_pattern = 6;
    hp.rope_base_swa = 10000.f;
    hp.rope_freq_scale_swa = 1.f;
    hp.embd_scale = static_cast<float>(std::sqrt(double(hp.n_embd)));
    hp.post_norms = true;
    hp.ffn_act = kernels::glu_activation::gelu_tanh;
    // GGUF does not carry query_pre_attn_scalar: it is the head size except for the 27B model
    // (62 blocks), whose is n_embd / n_head (168), as llama.cpp decides it.
    hp.query_scale_dim = hp.n_layer == 62 ? float(hp.n_embd / hp.n_head) : float(hp.head_dim);
    if (f.find(a + "final_logit_softcapping") || f.find(a + "attn_logit_softcapping")) {
      throw model_error("metadata '" + a + "final_logit_softcapping' / 'attn_logit_softcapping': logit soft-capping "
                        "(Gemma 2) is not supported");
    }
  } else if (gemma4) {
    read_gemma4(f, a, hp);
  } else if (f.find(a + "attention.sliding_window")) {
    throw model_error("metadata '" + a + "attention.sliding_window': sliding-window attention is supported for gpt-oss, "
                      "gemma3 and gemma4 only");
  }

  // Mixture of experts: qwen2moe and qwen3moe always, llama when the file counts experts (Mixtral).
  if (gemma3 && f.find(a + "expert_count")) {
    throw model_error("metadata '" + a + "expert_count': gemma3 with experts is not supported");
  }
  if (hp.architecture == arch::qwen3moe || hp.architecture == arch::qwen2moe || hp.architecture == arch::qwen35moe ||
      gpt_oss || f.find(a + "expert_count")) {
    hp.n_expert = required_int(f, a + "expert_count");
    hp.n_expert_used = required_int(f, a + "expert_used_count");
    // The limits kernels/moe.h states (moe_max_experts, moe_max_used).
    if (hp.n_expert < 1 || hp.n_expert > 1024 || hp.n_expert_used < 1 || hp.n_expert_used > 64 ||
        hp.n_expert_used > hp.n_expert) {
      throw model_error("expert_used_count " + std::to_string(hp.n_expert_used) + " of expert_count " +
                        std::to_string(hp.n_expert) +
                        " (1 to 1024 experts, 1 to 64 used per token, and no more used than there are)");
    }
    hp.n_ff_exp = f.find(a + "expert_feed_forward_length") ? required_int(f, a + "expert_feed_forward_length") : hp.n_ff;
    if (hp.n_ff_exp < 1) throw model_error("missing metadata '" + a + "expert_feed_forward_length'");
    // Converters do not write it for these families; llama.cpp renormalises for all but qwen2moe.
    hp.expert_weights_norm = f.get_bool(a + "expert_weights_norm").value_or(hp.architecture != arch::qwen2moe);
    if (f.find(a + "expert_shared_feed_forward_length")) hp.n_ff_shexp = required_int(f, a + "expert_shared_feed_forward_length");
    // llama.cpp's expert_gating_func: 1 softmax (these families), 2 sigmoid (DeepSeek-V3 and kin).
    if (const auto gating = f.get_int(a + "expert_gating_func"); gating && *gating != 1) {
      throw model_error("expert_gating_func " + std::to_string(*gating) + " is not supported (anvil routes by softmax, 1)");
    }
  } else if (f.find(a + "expert_used_count")) {
    throw model_error("metadata '" + a + "expert_used_count' without '" + a + "expert_count'");
  }
  return hp;
}

float hparams::attention_scale() const {
  return yarn_attn_factor * yarn_attn_factor / std::sqrt(query_scale_dim > 0 ? query_scale_dim : float(head_dim));
}

namespace {

// YaRN's per-pair frequency factors in rope_ref's convention (the angle is divided by them), as
// HF's _compute_yarn_parameters defines the inverse frequencies, in float like it.
std::vector<float> yarn_freq_factors(const hparams& hp) {
  const double d = double(hp.rope_dim), base = hp.rope_base;
  const auto correction_dim = [&](double rotations) {
    return d * std::log(double(hp.yarn_orig_ctx) / (rotations * 2 * M_PI)) / (2 * std::log(base));
  };
  double low = correction_dim(hp.yarn_beta_fast), high = correction_dim(hp.yarn_beta_slow);
  if (hp.yarn_truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, d - 1);
  if (low == high) high += 0.001;
  std::vector<float> factors(static_cast<std::size_t>(hp.rope_dim / 2));
  for (std::size_t i = 0; i < factors.size(); ++i) {
    const float ramp = std::clamp(float((double(i) - low) / (high - low)), 0.f, 1.f);
    // Interpolated (divided by the factor) where the ramp is 1, extrapolated (as is) where it is 0.
    factors[i] = 1.f / (ramp / hp.yarn_factor + (1.f - ramp));
  }
  return factors;
}

void load_attention(const loader& ld, const std::string& b, const hparams& hp, std::int64_t layer, layer_weights& l) {
  const std::int64_t hd = hp.layer_head_dim(layer), q_dim = hp.n_head * hd, kv_dim = hp.layer_kv_heads(layer) * hd;
  // With an output gate, each head's query rows are followed by its gate's.
  l.wq = ld.matrix(b + "attn_q.weight", hp.n_embd, hp.attn_out_gate ? 2 * q_dim : q_dim);
  l.wo = ld.matrix(b + "attn_output.weight", q_dim, hp.n_embd);
  l.bq = ld.vec(b + "attn_q.bias", q_dim, hp.qkv_bias);
  if (hp.o_bias) l.bo = ld.vec(b + "attn_output.bias", hp.n_embd);
  if (hp.attn_sinks) l.sinks = ld.vec(b + "attn_sinks.weight", hp.n_head);
  if (hp.qk_norm) l.q_norm = ld.vec(b + "attn_q_norm.weight", hd);
  if (hp.kv_shared(layer)) return;  // gemma4 E2B / E4B: its K and V are kv_source's (any in the file unused)
  l.wk = ld.matrix(b + "attn_k.weight", hp.n_embd, kv_dim);
  // Gemma 4's global layers may have no V projection: V is the K projection (HF's attention_k_eq_v).
  const bool k_eq_v = hp.architecture == arch::gemma4 && hp.layer_window(layer) == 0 && !ld.has(b + "attn_v.weight");
  if (!k_eq_v) l.wv = ld.matrix(b + "attn_v.weight", hp.n_embd, kv_dim);
  l.bk = ld.vec(b + "attn_k.bias", kv_dim, hp.qkv_bias);
  l.bv = ld.vec(b + "attn_v.bias", kv_dim, hp.qkv_bias);
  if (hp.qk_norm) l.k_norm = ld.vec(b + "attn_k_norm.weight", hd);
}

void load_delta_net(const loader& ld, const std::string& b, const hparams& hp, layer_weights& l) {
  const std::int64_t channels = hp.ssm_conv_channels(), value = hp.ssm_v_heads * hp.ssm_head_v;
  l.ssm_qkv = ld.matrix(b + "attn_qkv.weight", hp.n_embd, channels);
  l.ssm_z = ld.matrix(b + "attn_gate.weight", hp.n_embd, value);
  l.ssm_beta = ld.matrix(b + "ssm_beta.weight", hp.n_embd, hp.ssm_v_heads);
  l.ssm_alpha = ld.matrix(b + "ssm_alpha.weight", hp.n_embd, hp.ssm_v_heads);
  l.ssm_conv = ld.vecs(b + "ssm_conv1d.weight", hp.ssm_conv_kernel, channels);
  l.ssm_a = ld.vec(b + "ssm_a", hp.ssm_v_heads);
  l.ssm_dt_bias = ld.vec(b + "ssm_dt.bias", hp.ssm_v_heads);
  l.ssm_norm = ld.vec(b + "ssm_norm.weight", hp.ssm_head_v);
  l.ssm_out = ld.matrix(b + "ssm_out.weight", value, hp.n_embd);
}

}  // namespace

llm load_llm(gguf_file file) {
  llm m;
  m.hp = read_hparams(file);
  m.file = std::move(file);
  hparams& hp = m.hp;
  const loader ld(m.file);
  const bool gpt_oss = hp.architecture == arch::gpt_oss;

  const gguf_tensor* embd = m.file.find_tensor("token_embd.weight");
  if (!embd) throw model_error("missing tensor 'token_embd.weight'");
  if (embd->dims.size() != 2) throw model_error("tensor 'token_embd.weight' must have 2 dimensions");
  hp.n_vocab = embd->dims[1];
  // Token ids index the embedding and the head's logits: a vocabulary of another size lets a
  // prompt token run past token_embd, or a sampled id fall outside the tokenizer.
  if (const gguf_value* tokens = m.file.find("tokenizer.ggml.tokens");
      tokens && tokens->type == gguf_type::array && tokens->count != std::uint64_t(hp.n_vocab)) {
    throw model_error("tokenizer.ggml.tokens has " + std::to_string(tokens->count) + " entries but token_embd.weight has " +
                      std::to_string(hp.n_vocab) + " rows");
  }
  m.tok_embd = ld.matrix("token_embd.weight", hp.n_embd, hp.n_vocab);
  m.output_norm = ld.vec("output_norm.weight", hp.n_embd);
  hp.tied_output = m.file.find_tensor("output.weight") == nullptr;
  m.output = hp.tied_output ? m.tok_embd : ld.matrix("output.weight", hp.n_embd, hp.n_vocab);
  m.rope_freqs = ld.vec("rope_freqs.weight", hp.rope_dim / 2, false);
  if (hp.yarn_factor > 0) {
    if (!m.rope_freqs.empty()) throw model_error("tensor 'rope_freqs.weight' with YaRN scaling: anvil applies one or the other");
    m.rope_freqs = yarn_freq_factors(hp);
  }

  for (std::int64_t i = 0; i < hp.n_layer; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    layer_weights l;
    l.attn_norm = ld.vec(b + "attn_norm.weight", hp.n_embd);
    // Both kinds of qwen35 layer (and gpt-oss's) name the feed-forward's norm after the attention.
    l.ffn_norm = ld.vec(b + (gpt_oss || hp.has_recurrent() ? "post_attention_norm.weight" : "ffn_norm.weight"), hp.n_embd);
    if (hp.recurrent(i)) {
      load_delta_net(ld, b, hp, l);
    } else {
      load_attention(ld, b, hp, i, l);
    }
    if (hp.post_norms) {
      l.post_attn_norm = ld.vec(b + "post_attention_norm.weight", hp.n_embd);
      l.post_ffn_norm = ld.vec(b + "post_ffw_norm.weight", hp.n_embd);
    }
    if (hp.architecture == arch::gemma4) {  // the layer's output scale (HF's layer_scalar)
      const std::vector<float> scale = ld.vec(b + "layer_output_scale.weight", 1, false);
      if (!scale.empty()) l.out_scale = scale[0];
    }
    // A model with experts may keep some layers dense (Qwen3-MoE's mlp_only_layers): a layer
    // without a router is one.
    if (hp.n_expert > 0 && m.file.find_tensor(b + "ffn_gate_inp.weight")) {
      l.router = ld.matrix(b + "ffn_gate_inp.weight", hp.n_embd, hp.n_expert);
      // gemma4's converter writes gate and up in one tensor (the CPU reads it in place; the GPU
      // worker does not run gemma4).
      if (hp.architecture == arch::gemma4 && ld.has(b + "ffn_gate_up_exps.weight")) {
        std::tie(l.gate_exps, l.up_exps) = ld.stacked_halves(b + "ffn_gate_up_exps.weight", hp.n_embd, hp.n_ff_exp, hp.n_expert);
      } else {
        l.gate_exps = ld.stacked(b + "ffn_gate_exps.weight", hp.n_embd, hp.n_ff_exp, hp.n_expert);
        l.up_exps = ld.stacked(b + "ffn_up_exps.weight", hp.n_embd, hp.n_ff_exp, hp.n_expert);
      }
      l.down_exps = ld.stacked(b + "ffn_down_exps.weight", hp.n_ff_exp, hp.n_embd, hp.n_expert);
      if (hp.expert_bias) {
        l.router_b = ld.vec(b + "ffn_gate_inp.bias", hp.n_expert);
        l.gate_exps_b = ld.vecs(b + "ffn_gate_exps.bias", hp.n_ff_exp, hp.n_expert);
        l.up_exps_b = ld.vecs(b + "ffn_up_exps.bias", hp.n_ff_exp, hp.n_expert);
        l.down_exps_b = ld.vecs(b + "ffn_down_exps.bias", hp.n_embd, hp.n_expert);
      }
      if (hp.n_ff_shexp > 0) {
        l.gate_shexp = ld.matrix(b + "ffn_gate_shexp.weight", hp.n_embd, hp.n_ff_shexp);
        l.up_shexp = ld.matrix(b + "ffn_up_shexp.weight", hp.n_embd, hp.n_ff_shexp);
        l.down_shexp = ld.matrix(b + "ffn_down_shexp.weight", hp.n_ff_shexp, hp.n_embd);
        l.shexp_gate = ld.vec(b + "ffn_gate_inp_shexp.weight", hp.n_embd, false);
      }
      if (hp.architecture == arch::gemma4) {  // the dense feed-forward beside the experts, and their norms
        l.router_scale = ld.vec(b + "ffn_gate_inp.scale", hp.n_embd);
        l.expert_scale = ld.vec(b + "ffn_down_exps.scale", hp.n_expert);
        l.pre_ffn_norm_2 = ld.vec(b + "pre_ffw_norm_2.weight", hp.n_embd);
        l.post_ffn_norm_1 = ld.vec(b + "post_ffw_norm_1.weight", hp.n_embd);
        l.post_ffn_norm_2 = ld.vec(b + "post_ffw_norm_2.weight", hp.n_embd);
        l.gate = ld.matrix(b + "ffn_gate.weight", hp.n_embd, hp.n_ff);
        l.up = ld.matrix(b + "ffn_up.weight", hp.n_embd, hp.n_ff);
        l.down = ld.matrix(b + "ffn_down.weight", hp.n_ff, hp.n_embd);
      }
    } else {
      if (hp.n_expert > 0 && m.file.find_tensor(b + "ffn_gate.0.weight")) {
        throw model_error("tensor '" + b + "ffn_gate.0.weight': experts stored one tensor each (an old Mixtral conversion); "
                          "anvil reads them stacked (ffn_gate_exps), as current converters write them");
      }
      if (hp.n_ff == 0) throw model_error("missing tensor '" + b + "ffn_gate_inp.weight' (the file has no dense width)");
      const std::int64_t ff = hp.layer_ff(i);
      l.gate = ld.matrix(b + "ffn_gate.weight", hp.n_embd, ff);
      l.up = ld.matrix(b + "ffn_up.weight", hp.n_embd, ff);
      l.down = ld.matrix(b + "ffn_down.weight", ff, hp.n_embd);
    }
    if (hp.ple_dim > 0) {  // gemma4 E2B / E4B: the layer's use of its per-layer input
      l.ple_gate = ld.matrix(b + "inp_gate.weight", hp.n_embd, hp.ple_dim);
      l.ple_proj = ld.matrix(b + "proj.weight", hp.ple_dim, hp.n_embd);
      l.ple_post_norm = ld.vec(b + "post_norm.weight", hp.n_embd);
    }
    m.layers.push_back(std::move(l));
  }
  if (hp.ple_dim > 0) {
    const std::int64_t width = hp.n_layer * hp.ple_dim;
    m.ple_embd = ld.matrix("per_layer_token_embd.weight", width, hp.n_vocab);
    m.ple_model_proj = ld.matrix("per_layer_model_proj.weight", hp.n_embd, width);
    m.ple_proj_norm = ld.vec("per_layer_proj_norm.weight", hp.ple_dim);
  }
  return m;
}

std::size_t llm::weight_bytes() const {
  std::size_t n = 0;
  for (const auto& t : file.tensors()) n += t.nbytes;
  return n;
}

std::size_t llm::token_weight_bytes() const {
  std::size_t n = weight_bytes();
  for (const layer_weights& l : layers) {
    for (const stacked_weight* w : {&l.gate_exps, &l.up_exps, &l.down_exps}) {
      if (w->count == 0) continue;
      // The experts a token skips: each one's matrix (stride would count gemma4's fused gate and
      // up twice, as they share it).
      n -= *row_bytes(w->type, w->in) * std::size_t(w->out) * std::size_t(w->count - hp.n_expert_used);
    }
    for (const std::vector<float>* b : {&l.gate_exps_b, &l.up_exps_b, &l.down_exps_b}) {  // and their biases (F32)
      if (!b->empty()) n -= b->size() / std::size_t(hp.n_expert) * std::size_t(hp.n_expert - hp.n_expert_used) * sizeof(float);
    }
  }
  if (ple_embd.data) {  // gemma4 E2B / E4B: of the per-layer embeddings, the token's own row
    n -= *row_bytes(ple_embd.type, ple_embd.in) * std::size_t(ple_embd.out - 1);
  }
  return n;
}

namespace {

template <class Each>
kv_layer_map classify_kv_layers(const hparams& hp, bool window_pool, Each each) {
  kv_layer_map m;
  using pool = kv_layer_map::pool;
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {
    const pool p = kv_home(hp, window_pool, l);
    // A layer sharing another's KV (gemma4 E2B / E4B) takes no place of its own: it is the source's.
    const std::int64_t source = hp.kv_source(l);
    const bool shared = source >= 0 && source != l;
    each(m, l, p, shared ? -1 : p == pool::state ? m.state_layers++ : p == pool::window ? m.window_layers++ : m.main_layers++);
  }
  return m;
}

}  // namespace

kv_layer_map::pool kv_home(const hparams& hp, bool window_pool, std::int64_t l) {
  using pool = kv_layer_map::pool;
  return hp.recurrent(l) ? pool::state : window_pool && hp.layer_window(l) > 0 ? pool::window : pool::main;
}

kv_layer_map map_kv_layers(const hparams& hp, bool window_pool) {
  return classify_kv_layers(hp, window_pool, [&hp](kv_layer_map& m, std::int64_t l, kv_layer_map::pool p, std::int64_t index) {
    m.home.push_back(p);
    m.index.push_back(index >= 0 ? index : m.index[std::size_t(hp.kv_source(l))]);  // the source's
  });
}

kv_layer_map count_kv_layers(const hparams& hp, bool window_pool) {
  return classify_kv_layers(hp, window_pool, [](kv_layer_map&, std::int64_t, kv_layer_map::pool, std::int64_t) {});
}

}  // namespace anvil::model
