#include "model/arch/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <stdexcept>

#include "model/gguf/gguf_tokenizer.h"

namespace anvil::model {
namespace {

// splitmix64: seeds one independent stream per (seed, tensor, row), so files are identical
// whatever the thread count.
std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Roughly normal values (sum of four uniforms) with the given standard deviation: `rows` rows
// (1 to fill_rows) of n values, row q from its own stream into out[q * n ..]. Each stream is a
// serial chain of mix64 calls; the rows' chains advance side by side so that the core overlaps
// them (the values are those of one row at a time).
constexpr int fill_rows = 4;
void fill_normal(float* out, std::int64_t n, int rows, float mean, float stddev, const std::uint64_t* streams) {
  std::uint64_t s[fill_rows];
  for (int q = 0; q < fill_rows; ++q) s[q] = mix64(streams[std::min(q, rows - 1)]);  // spare chains repeat the last
  const float k = stddev * std::sqrt(3.f) / float(1ull << 31);
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t sum[fill_rows] = {};
    for (int j = 0; j < 4; ++j) {
      for (int q = 0; q < fill_rows; ++q) {
        s[q] = mix64(s[q]);
        sum[q] += std::int64_t(s[q] >> 33) - (std::int64_t(1) << 30);
      }
    }
    for (int q = 0; q < rows; ++q) out[q * n + i] = mean + float(sum[q]) * k;
  }
}

std::uint64_t name_hash(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string gpt2_byte_token(int b) {
  // GPT-2's byte-to-unicode table: printable bytes map to themselves, the rest to U+0100 up.
  int cp = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
    int n = 0;
    for (int x = 0; x < b; ++x) {
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xc0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3f));
  }
  return s;
}

// llama.cpp's general.file_type numbers, so other tools describe the files the same way.
std::uint32_t file_type(synth_mix m) {
  switch (m) {
    case synth_mix::f32: return 0;
    case synth_mix::f16: return 1;
    case synth_mix::q4_0: return 2;
    case synth_mix::q8_0: return 7;
    case synth_mix::q4_k_m: return 15;
    case synth_mix::q6_k: return 18;
    case synth_mix::bf16: return 32;
    case synth_mix::iq4_xs: return 30;
    case synth_mix::mxfp4: return 38;  // MOSTLY_MXFP4_MOE
  }
  return 0;
}

bool fits(ggml_type t, std::int64_t row_len) { return row_bytes(t, row_len).has_value(); }

}  // namespace

const std::vector<synth_shape>& synth_shapes() {
  static const std::vector<synth_shape> shapes = {
      {"tiny", arch::llama, 512, 256, 2, 4, 2, 64, 768, 4096, 10000.f, 1e-5f, false},
      {"tiny-qwen2", arch::qwen2, 512, 256, 2, 4, 2, 64, 768, 4096, 1000000.f, 1e-6f, true},
      {"tiny-qwen3", arch::qwen3, 512, 256, 2, 8, 2, 64, 768, 4096, 1000000.f, 1e-6f, false},
      {"qwen2.5-0.5b", arch::qwen2, 151936, 896, 24, 14, 2, 64, 4864, 32768, 1000000.f, 1e-6f, true},
      {"llama3-8b", arch::llama, 128256, 4096, 32, 32, 8, 128, 14336, 8192, 500000.f, 1e-5f, false},
      {"llama3-70b", arch::llama, 128256, 8192, 80, 64, 8, 128, 28672, 8192, 500000.f, 1e-5f, false},
      {"qwen3-8b", arch::qwen3, 151936, 4096, 36, 32, 8, 128, 12288, 40960, 1000000.f, 1e-6f, false},
      // Mixtures of experts: Qwen3-MoE (qwen3moe) and Mixtral (llama with experts).
      {.name = "tiny-qwen3moe", .architecture = arch::qwen3moe, .n_vocab = 512, .n_embd = 256, .n_layer = 2, .n_head = 8,
       .n_head_kv = 2, .head_dim = 64, .n_ff = 768, .n_ctx = 4096, .rope_base = 1000000.f, .rms_eps = 1e-6f,
       .tied_output = false, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 128},
      {.name = "tiny-qwen2moe", .architecture = arch::qwen2moe, .n_vocab = 512, .n_embd = 256, .n_layer = 2, .n_head = 4,
       .n_head_kv = 2, .head_dim = 64, .n_ff = 768, .n_ctx = 4096, .rope_base = 1000000.f, .rms_eps = 1e-6f,
       .tied_output = false, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 128, .n_ff_shexp = 256},
      {.name = "tiny-mixtral", .architecture = arch::llama, .n_vocab = 512, .n_embd = 256, .n_layer = 2, .n_head = 4,
       .n_head_kv = 2, .head_dim = 64, .n_ff = 256, .n_ctx = 4096, .rope_base = 1000000.f, .rms_eps = 1e-5f,
       .tied_output = false, .n_expert = 4, .n_expert_used = 2, .n_ff_exp = 256},
      {.name = "qwen3-30b-a3b", .architecture = arch::qwen3moe, .n_vocab = 151936, .n_embd = 2048, .n_layer = 48,
       .n_head = 32, .n_head_kv = 4, .head_dim = 128, .n_ff = 6144, .n_ctx = 40960, .rope_base = 1000000.f,
       .rms_eps = 1e-6f, .tied_output = false, .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 768},
      // gpt-oss: the 20b and 120b shapes (vocabulary of the o200k harmony tokenizer), and a tiny one
      // whose window (16) short prompts already pass.
      {.name = "tiny-gpt-oss", .architecture = arch::gpt_oss, .n_vocab = 512, .n_embd = 256, .n_layer = 2, .n_head = 8,
       .n_head_kv = 2, .head_dim = 64, .n_ff = 128, .n_ctx = 4096, .rope_base = 150000.f, .rms_eps = 1e-5f,
       .tied_output = false, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 128, .sliding_window = 16,
       .yarn_factor = 32.f, .yarn_orig_ctx = 128},
      {.name = "gpt-oss-20b", .architecture = arch::gpt_oss, .n_vocab = 201088, .n_embd = 2880, .n_layer = 24,
       .n_head = 64, .n_head_kv = 8, .head_dim = 64, .n_ff = 2880, .n_ctx = 131072, .rope_base = 150000.f,
       .rms_eps = 1e-5f, .tied_output = false, .n_expert = 32, .n_expert_used = 4, .n_ff_exp = 2880,
       .sliding_window = 128, .yarn_factor = 32.f, .yarn_orig_ctx = 4096},
      {.name = "gpt-oss-120b", .architecture = arch::gpt_oss, .n_vocab = 201088, .n_embd = 2880, .n_layer = 36,
       .n_head = 64, .n_head_kv = 8, .head_dim = 64, .n_ff = 2880, .n_ctx = 131072, .rope_base = 150000.f,
       .rms_eps = 1e-5f, .tied_output = false, .n_expert = 128, .n_expert_used = 4, .n_ff_exp = 2880,
       .sliding_window = 128, .yarn_factor = 32.f, .yarn_orig_ctx = 4096},
      // Gemma 3: a tiny one whose six layers include a global one (the sixth) and whose window (16)
      // short prompts already pass, with the 1B's heads (4 of 256 dims on one kv head); the 12B
      // (head size 256) and the 27B (head size 128) shapes.
      {.name = "tiny-gemma3", .architecture = arch::gemma3, .n_vocab = 512, .n_embd = 256, .n_layer = 6, .n_head = 4,
       .n_head_kv = 1, .head_dim = 256, .n_ff = 512, .n_ctx = 4096, .rope_base = 1000000.f, .rms_eps = 1e-6f,
       .tied_output = true, .sliding_window = 16, .rope_linear_factor = 8.f},
      {.name = "gemma3-12b", .architecture = arch::gemma3, .n_vocab = 262208, .n_embd = 3840, .n_layer = 48,
       .n_head = 16, .n_head_kv = 8, .head_dim = 256, .n_ff = 15360, .n_ctx = 131072, .rope_base = 1000000.f,
       .rms_eps = 1e-6f, .tied_output = true, .sliding_window = 1024, .rope_linear_factor = 8.f},
      {.name = "gemma3-27b", .architecture = arch::gemma3, .n_vocab = 262208, .n_embd = 5376, .n_layer = 62,
       .n_head = 32, .n_head_kv = 16, .head_dim = 128, .n_ff = 21504, .n_ctx = 131072, .rope_base = 1000000.f,
       .rms_eps = 1e-6f, .tied_output = true, .sliding_window = 1024, .rope_linear_factor = 8.f},
      // Qwen3.5: a tiny one (layers 0-2 gated DeltaNet, layer 3 attention; twice the value heads
      // of key heads, as the real ones) and the 9B.
      {.name = "tiny-qwen35", .architecture = arch::qwen35, .n_vocab = 512, .n_embd = 256, .n_layer = 4, .n_head = 4,
       .n_head_kv = 2, .head_dim = 64, .n_ff = 512, .n_ctx = 4096, .rope_base = 10000000.f, .rms_eps = 1e-6f,
       .tied_output = false, .full_attn_interval = 4, .ssm_k_heads = 2, .ssm_v_heads = 4, .ssm_head = 32,
       .ssm_conv_kernel = 4, .rope_dim = 16},
      {.name = "qwen3.5-9b", .architecture = arch::qwen35, .n_vocab = 248320, .n_embd = 4096, .n_layer = 32,
       .n_head = 16, .n_head_kv = 4, .head_dim = 256, .n_ff = 12288, .n_ctx = 262144, .rope_base = 10000000.f,
       .rms_eps = 1e-6f, .tied_output = false, .full_attn_interval = 4, .ssm_k_heads = 16, .ssm_v_heads = 32,
       .ssm_head = 128, .ssm_conv_kernel = 4, .rope_dim = 64},
      // Qwen3.5-MoE: a tiny one, and Qwen3.6-35B-A3B (256 experts of 512, eight used, one shared).
      {.name = "tiny-qwen35moe", .architecture = arch::qwen35moe, .n_vocab = 512, .n_embd = 256, .n_layer = 4,
       .n_head = 4, .n_head_kv = 2, .head_dim = 64, .n_ff = 512, .n_ctx = 4096, .rope_base = 10000000.f,
       .rms_eps = 1e-6f, .tied_output = false, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 128, .n_ff_shexp = 128,
       .full_attn_interval = 4, .ssm_k_heads = 2, .ssm_v_heads = 4, .ssm_head = 32, .ssm_conv_kernel = 4, .rope_dim = 16},
      {.name = "qwen3.6-35b-a3b", .architecture = arch::qwen35moe, .n_vocab = 248320, .n_embd = 2048, .n_layer = 40,
       .n_head = 16, .n_head_kv = 2, .head_dim = 256, .n_ff = 512, .n_ctx = 262144, .rope_base = 10000000.f,
       .rms_eps = 1e-6f, .tied_output = false, .n_expert = 256, .n_expert_used = 8, .n_ff_exp = 512, .n_ff_shexp = 512,
       .full_attn_interval = 4, .ssm_k_heads = 16, .ssm_v_heads = 32, .ssm_head = 128, .ssm_conv_kernel = 4,
       .rope_dim = 64},
      // Ministral 3 (mistral3): Llama's blocks, YaRN from an original context of 16,384 and the
      // queries' temperature past it; a tiny one whose original context (32) short prompts pass.
      {.name = "tiny-mistral3", .architecture = arch::mistral3, .n_vocab = 512, .n_embd = 256, .n_layer = 2,
       .n_head = 4, .n_head_kv = 2, .head_dim = 64, .n_ff = 768, .n_ctx = 4096, .rope_base = 1000000.f,
       .rms_eps = 1e-5f, .tied_output = false, .yarn_factor = 16.f, .yarn_orig_ctx = 32, .attn_temp_scale = 0.1f},
      {.name = "ministral3-8b", .architecture = arch::mistral3, .n_vocab = 131072, .n_embd = 4096, .n_layer = 34,
       .n_head = 32, .n_head_kv = 8, .head_dim = 128, .n_ff = 14336, .n_ctx = 262144, .rope_base = 1000000.f,
       .rms_eps = 1e-5f, .tied_output = false, .yarn_factor = 16.f, .yarn_orig_ctx = 16384, .attn_temp_scale = 0.1f},
      // Gemma 4 (gemma4, text): a tiny one (six layers, the sixth global; windows of 16) and the 31B.
      {.name = "tiny-gemma4", .architecture = arch::gemma4, .n_vocab = 512, .n_embd = 256, .n_layer = 6, .n_head = 4,
       .n_head_kv = 2, .head_dim = 128, .n_ff = 512, .n_ctx = 4096, .rope_base = 1000000.f, .rms_eps = 1e-6f,
       .tied_output = true, .sliding_window = 16, .head_dim_swa = 64, .n_head_kv_global = 1, .final_softcap = 30.f},
      // Gemma 4 E2B / E4B's make: per-layer token embeddings, the last two layers (a sliding and the
      // last global) on the KV of layers 4 and 5, their feed-forwards double-wide (as the E2B's).
      {.name = "tiny-gemma4e", .architecture = arch::gemma4, .n_vocab = 512, .n_embd = 256, .n_layer = 8, .n_head = 4,
       .n_head_kv = 2, .head_dim = 128, .n_ff = 256, .n_ctx = 4096, .rope_base = 1000000.f, .rms_eps = 1e-6f,
       .tied_output = true, .sliding_window = 16, .head_dim_swa = 64, .n_head_kv_global = 1, .final_softcap = 30.f,
       .ple_dim = 32, .n_kv_shared = 2, .double_wide = true},
      // Gemma 4 E4B: 42 layers (five sliding to one global), the last 18 on the KV of layers 22
      // (sliding) and 23 (global), per-layer inputs of 256, global layers with a V of their own.
      {.name = "gemma4-e4b", .architecture = arch::gemma4, .n_vocab = 262144, .n_embd = 2560, .n_layer = 42, .n_head = 8,
       .n_head_kv = 2, .head_dim = 512, .n_ff = 10240, .n_ctx = 131072, .rope_base = 1000000.f, .rms_eps = 1e-6f,
       .tied_output = true, .sliding_window = 512, .head_dim_swa = 256, .n_head_kv_global = 2, .final_softcap = 30.f,
       .ple_dim = 256, .n_kv_shared = 18, .global_v = true},
      {.name = "gemma4-31b", .architecture = arch::gemma4, .n_vocab = 262144, .n_embd = 5376, .n_layer = 60,
       .n_head = 32, .n_head_kv = 16, .head_dim = 512, .n_ff = 21504, .n_ctx = 262144, .rope_base = 1000000.f,
       .rms_eps = 1e-6f, .tied_output = true, .sliding_window = 1024, .head_dim_swa = 256, .n_head_kv_global = 4,
       .final_softcap = 30.f},
      // Gemma 4 26B-A4B: 128 experts of 704, eight used, beside a dense feed-forward of 2112; and a
      // tiny one of the same make.
      {.name = "tiny-gemma4moe", .architecture = arch::gemma4, .n_vocab = 512, .n_embd = 256, .n_layer = 6,
       .n_head = 4, .n_head_kv = 2, .head_dim = 128, .n_ff = 256, .n_ctx = 4096, .rope_base = 1000000.f,
       .rms_eps = 1e-6f, .tied_output = true, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 128, .sliding_window = 16,
       .head_dim_swa = 64, .n_head_kv_global = 1, .final_softcap = 30.f},
      {.name = "gemma4-26b-a4b", .architecture = arch::gemma4, .n_vocab = 262144, .n_embd = 2816, .n_layer = 30,
       .n_head = 16, .n_head_kv = 8, .head_dim = 512, .n_ff = 2112, .n_ctx = 262144, .rope_base = 1000000.f,
       .rms_eps = 1e-6f, .tied_output = true, .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 704,
       .sliding_window = 1024, .head_dim_swa = 256, .n_head_kv_global = 2, .final_softcap = 30.f},
      {.name = "mixtral-8x7b", .architecture = arch::llama, .n_vocab = 32000, .n_embd = 4096, .n_layer = 32, .n_head = 32,
       .n_head_kv = 8, .head_dim = 128, .n_ff = 14336, .n_ctx = 32768, .rope_base = 1000000.f, .rms_eps = 1e-5f,
       .tied_output = false, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 14336},
  };
  return shapes;
}

const synth_shape* find_synth_shape(std::string_view name) {
  for (const auto& s : synth_shapes()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::optional<synth_mix> parse_synth_mix(std::string_view name) {
  for (synth_mix m : {synth_mix::f32, synth_mix::f16, synth_mix::bf16, synth_mix::q8_0, synth_mix::q4_0,
                      synth_mix::q6_k, synth_mix::q4_k_m, synth_mix::iq4_xs, synth_mix::mxfp4}) {
    if (synth_mix_name(m) == name) return m;
  }
  return std::nullopt;
}

std::string_view synth_mix_name(synth_mix m) {
  switch (m) {
    case synth_mix::f32: return "F32";
    case synth_mix::f16: return "F16";
    case synth_mix::bf16: return "BF16";
    case synth_mix::q8_0: return "Q8_0";
    case synth_mix::q4_0: return "Q4_0";
    case synth_mix::q6_k: return "Q6_K";
    case synth_mix::q4_k_m: return "Q4_K_M";
    case synth_mix::iq4_xs: return "IQ4_XS";
    case synth_mix::mxfp4: return "MXFP4";
  }
  return "?";
}

tokenizer_spec synthetic_tokenizer(std::int64_t n_vocab) {
  tokenizer_spec s;
  s.model = "gpt2";
  s.pre = "qwen2";
  for (int b = 0; b < 256; ++b) {
    s.tokens.push_back(gpt2_byte_token(b));
    s.token_types.push_back(1);
  }
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    s.tokens.push_back(special);
    s.token_types.push_back(3);
  }
  for (std::int64_t i = std::int64_t(s.tokens.size()); i < n_vocab; ++i) {
    s.tokens.push_back("<|reserved_" + std::to_string(i) + "|>");
    s.token_types.push_back(5);
  }
  s.eos_id = 256;
  s.bos_id = 256;
  s.eot_id = 258;
  s.add_bos = false;
  return s;
}

ggml_type synth_weight_type(synth_mix mix, const std::string& name, std::int64_t row_len, std::int64_t layer,
                            std::int64_t n_layer) {
  ggml_type t = ggml_type::F16;
  switch (mix) {
    case synth_mix::f32: t = ggml_type::F32; break;
    case synth_mix::f16: t = ggml_type::F16; break;
    case synth_mix::bf16: t = ggml_type::BF16; break;
    case synth_mix::q8_0: t = ggml_type::Q8_0; break;
    case synth_mix::q4_0: t = ggml_type::Q4_0; break;
    case synth_mix::q6_k: t = ggml_type::Q6_K; break;
    case synth_mix::q4_k_m: {
      // llama.cpp's Q4_K_M: Q6_K for the head and for attn_v / ffn_down in the first and last
      // eighth of the layers and every third layer between; Q4_K elsewhere.
      const bool more_bits = layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
      const bool sensitive = name.find("attn_v") != std::string::npos || name.find("ffn_down") != std::string::npos;
      t = name == "output.weight" || (sensitive && more_bits) ? ggml_type::Q6_K : ggml_type::Q4_K;
      break;
    }
    case synth_mix::iq4_xs:  // llama.cpp's IQ4_XS: the head in Q6_K, every other matrix IQ4_XS
      t = name == "output.weight" ? ggml_type::Q6_K : ggml_type::IQ4_XS;
      break;
    case synth_mix::mxfp4:  // the experts in MXFP4, as gpt-oss ships them; every other matrix Q8_0
      t = name.find("_exps.") != std::string::npos ? ggml_type::MXFP4 : ggml_type::Q8_0;
      break;
  }
  if (fits(t, row_len)) return t;
  return fits(ggml_type::Q8_0, row_len) && t != ggml_type::F32 ? ggml_type::Q8_0 : ggml_type::F16;
}

void write_synth_model(const synth_options& opt, const std::string& path,
                       const std::function<void(std::size_t, std::size_t)>& progress) {
  const synth_shape& sh = opt.shape;
  tokenizer_spec tok = opt.tokenizer ? *opt.tokenizer : synthetic_tokenizer(sh.n_vocab);
  // Real converters pad the vocabulary to the embedding's rows with unused [PADn] tokens.
  const std::int64_t n_vocab = opt.tokenizer && sh.name.rfind("tiny", 0) == 0 ? std::int64_t(tok.tokens.size())
                                                                               : std::max<std::int64_t>(sh.n_vocab, tok.tokens.size());
  for (std::int64_t i = std::int64_t(tok.tokens.size()); i < n_vocab; ++i) {
    tok.tokens.push_back("[PAD" + std::to_string(i) + "]");
    if (!tok.token_types.empty()) tok.token_types.push_back(5);
    if (!tok.scores.empty()) tok.scores.push_back(-1e9f);
  }

  gguf_writer w;
  const std::string a(arch_name(sh.architecture));
  w.set_string("general.architecture", a);
  w.set_string("general.name", "anvil synth " + sh.name + " " + std::string(synth_mix_name(opt.mix)));
  w.set_u32("general.file_type", file_type(opt.mix));
  w.set_u32(a + ".context_length", std::uint32_t(sh.n_ctx));
  w.set_u32(a + ".embedding_length", std::uint32_t(sh.n_embd));
  w.set_u32(a + ".block_count", std::uint32_t(sh.n_layer));
  const auto shared_kv = [&](std::int64_t l) { return sh.n_kv_shared > 0 && l >= sh.n_layer - sh.n_kv_shared; };
  const auto layer_ff = [&](std::int64_t l) { return shared_kv(l) && sh.double_wide ? 2 * sh.n_ff : sh.n_ff; };
  if (sh.double_wide) {  // gemma4 E2B / E4B: a width per layer
    std::vector<std::int32_t> widths;
    for (std::int64_t l = 0; l < sh.n_layer; ++l) widths.push_back(std::int32_t(layer_ff(l)));
    w.set_i32s(a + ".feed_forward_length", widths);
  } else {
    w.set_u32(a + ".feed_forward_length", std::uint32_t(sh.n_ff));
  }
  w.set_u32(a + ".attention.head_count", std::uint32_t(sh.n_head));
  const bool gemma4 = sh.architecture == arch::gemma4;
  if (gemma4) {  // as llama.cpp's converter writes Gemma 4: the pattern and the KV heads per layer
    std::vector<bool> pattern;
    std::vector<std::int32_t> kv_heads;
    for (std::int64_t l = 0; l < sh.n_layer; ++l) {
      pattern.push_back(gemma4_synth_sliding(l, sh.n_layer));
      kv_heads.push_back(std::int32_t(pattern.back() ? sh.n_head_kv : sh.n_head_kv_global));
    }
    w.set_bools(a + ".attention.sliding_window_pattern", pattern);
    w.set_i32s(a + ".attention.head_count_kv", kv_heads);
    w.set_u32(a + ".attention.key_length_swa", std::uint32_t(sh.head_dim_swa));
    w.set_u32(a + ".attention.value_length_swa", std::uint32_t(sh.head_dim_swa));
    w.set_u32(a + ".rope.dimension_count_swa", std::uint32_t(sh.head_dim_swa));
    w.set_f32(a + ".rope.freq_base_swa", 10000.f);
    w.set_f32(a + ".final_logit_softcapping", sh.final_softcap);
    w.set_u32(a + ".embedding_length_per_layer_input", std::uint32_t(sh.ple_dim));
    w.set_u32(a + ".attention.shared_kv_layers", std::uint32_t(sh.n_kv_shared));
  } else {
    w.set_u32(a + ".attention.head_count_kv", std::uint32_t(sh.n_head_kv));
  }
  w.set_u32(a + ".attention.key_length", std::uint32_t(sh.head_dim));
  w.set_u32(a + ".attention.value_length", std::uint32_t(sh.head_dim));
  w.set_u32(a + ".rope.dimension_count", std::uint32_t(sh.rope_dim > 0 ? sh.rope_dim : sh.head_dim));
  w.set_f32(a + ".rope.freq_base", sh.rope_base);
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", sh.rms_eps);
  w.set_u32(a + ".vocab_size", std::uint32_t(n_vocab));
  if (sh.sliding_window > 0) w.set_u32(a + ".attention.sliding_window", std::uint32_t(sh.sliding_window));
  if (sh.rope_linear_factor > 0) {
    w.set_string(a + ".rope.scaling.type", "linear");
    w.set_f32(a + ".rope.scaling.factor", sh.rope_linear_factor);
  }
  if (sh.yarn_factor > 0) {
    w.set_string(a + ".rope.scaling.type", "yarn");
    w.set_f32(a + ".rope.scaling.factor", sh.yarn_factor);
    w.set_u32(a + ".rope.scaling.original_context_length", std::uint32_t(sh.yarn_orig_ctx));
    if (sh.architecture == arch::mistral3) {  // as llama.cpp's converter writes Ministral 3
      w.set_f32(a + ".rope.scaling.yarn_beta_fast", 32.f);
      w.set_f32(a + ".rope.scaling.yarn_beta_slow", 1.f);
      w.set_f32(a + ".rope.scaling.yarn_log_multiplier", 1.f);
    }
  }
  if (sh.attn_temp_scale > 0) w.set_f32(a + ".attention.temperature_scale", sh.attn_temp_scale);
  if (sh.n_expert > 0) {
    w.set_u32(a + ".expert_count", std::uint32_t(sh.n_expert));
    w.set_u32(a + ".expert_used_count", std::uint32_t(sh.n_expert_used));
    if (sh.architecture != arch::llama) w.set_u32(a + ".expert_feed_forward_length", std::uint32_t(sh.n_ff_exp));
    if (sh.n_ff_shexp > 0) w.set_u32(a + ".expert_shared_feed_forward_length", std::uint32_t(sh.n_ff_shexp));
  }
  const bool qwen35 = sh.architecture == arch::qwen35 || sh.architecture == arch::qwen35moe;
  if (qwen35) {
    w.set_u32(a + ".full_attention_interval", std::uint32_t(sh.full_attn_interval));
    w.set_u32(a + ".ssm.conv_kernel", std::uint32_t(sh.ssm_conv_kernel));
    w.set_u32(a + ".ssm.state_size", std::uint32_t(sh.ssm_head));
    w.set_u32(a + ".ssm.group_count", std::uint32_t(sh.ssm_k_heads));
    w.set_u32(a + ".ssm.time_step_rank", std::uint32_t(sh.ssm_v_heads));
    w.set_u32(a + ".ssm.inner_size", std::uint32_t(sh.ssm_v_heads * sh.ssm_head));
  }
  write_tokenizer_metadata(w, tok, opt.chat_template);

  // greedy_chain: token `from` gets the one-hot embedding of its own dimension; `to`'s output row
  // reads that dimension, so after the final norm (sqrt(n_embd) on that dimension) its logit leads.
  std::map<std::int32_t, std::int64_t> chain_dim;
  std::map<std::int32_t, std::int64_t> chain_to;  // output row → the dimension it reads
  for (const auto& [from, to] : opt.greedy_chain) {
    if (sh.tied_output) throw std::invalid_argument("greedy_chain needs a shape with a separate output head");
    if (from < 0 || to < 0 || from >= n_vocab || to >= n_vocab) throw std::invalid_argument("greedy_chain token out of range");
    const auto [it, added] = chain_dim.emplace(from, std::int64_t(chain_dim.size()));
    if (chain_dim.size() > std::size_t(sh.n_embd)) throw std::invalid_argument("greedy_chain has more sources than n_embd");
    chain_to[to] = it->second;
  }
  const bool scripted = !opt.greedy_chain.empty();
  // The rows of a scripted tensor: nullopt for the tensors the script leaves random.
  const auto scripted_row = [&](const std::string& name, std::int64_t r, std::vector<float>& v) {
    std::fill(v.begin(), v.end(), 0.f);
    if (name == "token_embd.weight") {
      for (const auto& [from, dim] : chain_dim) {
        if (from == r) v[std::size_t(dim)] = 1.f;
      }
    } else if (name == "output.weight") {
      if (auto it = chain_to.find(std::int32_t(r)); it != chain_to.end()) v[std::size_t(it->second)] = 4.f;
    } else if (name == "output_norm.weight") {
      std::fill(v.begin(), v.end(), 1.f);
    }
  };
  const auto is_scripted = [&](const std::string& name) {
    return scripted && (name == "token_embd.weight" || name == "output.weight" || name == "output_norm.weight" ||
                        name.ends_with("attn_output.weight") || name.ends_with("ssm_out.weight") || name.ends_with("ffn_down.weight") ||
                        name.ends_with("ffn_down_exps.weight") || name.ends_with("ffn_down_shexp.weight") ||
                        name.ends_with("attn_output.bias") || name.ends_with("ffn_down_exps.bias"));
  };

  std::uint64_t tensor_index = 0;
  // `count` > 1: that many matrices of `out` rows stacked in one tensor (a layer's experts).
  auto add = [&](const std::string& name, std::int64_t in, std::int64_t out, float mean, float stddev, std::int64_t layer,
                 std::int64_t count = 1) {
    const bool vector = out == 1;
    // The experts' router and biases stay F32, as converters keep them.
    const ggml_type t = vector || name.ends_with("ffn_gate_inp.weight") || name.ends_with(".bias") ||
                                name.ends_with("ssm_conv1d.weight")
                            ? ggml_type::F32
                            : synth_weight_type(opt.mix, name, in, layer, sh.n_layer);
    const std::uint64_t stream = mix64(opt.seed ^ name_hash(name)) + tensor_index++;
    std::vector<std::int64_t> dims = vector ? std::vector<std::int64_t>{in}
                                     : count > 1 ? std::vector<std::int64_t>{in, out, count}
                                                 : std::vector<std::int64_t>{in, out};
    out *= count;
    const bool script = is_scripted(name);
    w.add_tensor(name, t, dims, [=, &scripted_row](std::span<std::byte> dst) {
      const std::size_t row = *row_bytes(t, in);
      if (script) {
        std::vector<float> values(static_cast<std::size_t>(in));
        for (std::int64_t r = 0; r < out; ++r) {
          scripted_row(name, vector ? 0 : r, values);
          quantize_row(t, values.data(), dst.data() + std::size_t(r) * row, in);
        }
        return;
      }
#pragma omp parallel
      {
        std::vector<float> values(static_cast<std::size_t>(fill_rows * in));
#pragma omp for schedule(static)
        for (std::int64_t g = 0; g < (out + fill_rows - 1) / fill_rows; ++g) {
          const std::int64_t r0 = g * fill_rows;
          const int rows = int(std::min<std::int64_t>(fill_rows, out - r0));
          std::uint64_t streams[fill_rows];
          for (int q = 0; q < rows; ++q) streams[q] = stream * 0x100000001b3ull + std::uint64_t(r0 + q);
          fill_normal(values.data(), in, rows, mean, stddev, streams);
          for (int q = 0; q < rows; ++q) {
            quantize_row(t, values.data() + std::size_t(q) * std::size_t(in), dst.data() + std::size_t(r0 + q) * row, in);
          }
        }
      }
    });
  };

  // A layer's feed-forward: experts (with gpt-oss's biases and qwen2moe's shared expert) or dense.
  const auto add_ffn = [&](const std::string& b, std::int64_t l) {
    const float s_embd = 1.f / std::sqrt(float(sh.n_embd));
    const bool gpt_oss = sh.architecture == arch::gpt_oss;
    if (sh.n_expert > 0 && sh.architecture == arch::gemma4) {  // the 26B-A4B's: a dense one beside the experts
      add(b + "ffn_gate.weight", sh.n_embd, sh.n_ff, 0.f, s_embd, l);
      add(b + "ffn_up.weight", sh.n_embd, sh.n_ff, 0.f, s_embd, l);
      add(b + "ffn_down.weight", sh.n_ff, sh.n_embd, 0.f, 1.f / std::sqrt(float(sh.n_ff)), l);
      add(b + "post_ffw_norm_1.weight", sh.n_embd, 1, 1.f, 0.1f, l);
      // The router reads the residual normed and divided by sqrt(n_embd): weights of unit scale give
      // its logits the spread the others' get (at 1 / sqrt(n_embd) every token's experts would be
      // near ties, which any rounding flips).
      add(b + "ffn_gate_inp.weight", sh.n_embd, sh.n_expert, 0.f, 1.f, l);
      add(b + "ffn_gate_inp.scale", sh.n_embd, 1, 1.f, 0.1f, l);
      add(b + "pre_ffw_norm_2.weight", sh.n_embd, 1, 1.f, 0.1f, l);
      add(b + "ffn_gate_up_exps.weight", sh.n_embd, 2 * sh.n_ff_exp, 0.f, s_embd, l, sh.n_expert);
      add(b + "ffn_down_exps.weight", sh.n_ff_exp, sh.n_embd, 0.f, 1.f / std::sqrt(float(sh.n_ff_exp)), l, sh.n_expert);
      add(b + "ffn_down_exps.scale", sh.n_expert, 1, 1.f, 0.1f, l);
      add(b + "post_ffw_norm_2.weight", sh.n_embd, 1, 1.f, 0.1f, l);
    } else if (sh.n_expert > 0) {
      add(b + "ffn_gate_inp.weight", sh.n_embd, sh.n_expert, 0.f, s_embd, l);
      add(b + "ffn_gate_exps.weight", sh.n_embd, sh.n_ff_exp, 0.f, s_embd, l, sh.n_expert);
      add(b + "ffn_up_exps.weight", sh.n_embd, sh.n_ff_exp, 0.f, s_embd, l, sh.n_expert);
      add(b + "ffn_down_exps.weight", sh.n_ff_exp, sh.n_embd, 0.f, 1.f / std::sqrt(float(sh.n_ff_exp)), l, sh.n_expert);
      if (gpt_oss) {  // [out, n_expert] each
        add(b + "ffn_gate_inp.bias", sh.n_expert, 1, 0.f, 0.1f, l);
        add(b + "ffn_gate_exps.bias", sh.n_ff_exp, sh.n_expert, 0.f, 0.1f, l);
        add(b + "ffn_up_exps.bias", sh.n_ff_exp, sh.n_expert, 0.f, 0.1f, l);
        add(b + "ffn_down_exps.bias", sh.n_embd, sh.n_expert, 0.f, 0.1f, l);
      }
      if (sh.n_ff_shexp > 0) {
        add(b + "ffn_gate_inp_shexp.weight", sh.n_embd, 1, 0.f, s_embd, l);
        add(b + "ffn_gate_shexp.weight", sh.n_embd, sh.n_ff_shexp, 0.f, s_embd, l);
        add(b + "ffn_up_shexp.weight", sh.n_embd, sh.n_ff_shexp, 0.f, s_embd, l);
        add(b + "ffn_down_shexp.weight", sh.n_ff_shexp, sh.n_embd, 0.f, 1.f / std::sqrt(float(sh.n_ff_shexp)), l);
      }
    } else {
      const std::int64_t ff = layer_ff(l);
      add(b + "ffn_gate.weight", sh.n_embd, ff, 0.f, s_embd, l);
      add(b + "ffn_up.weight", sh.n_embd, ff, 0.f, s_embd, l);
      add(b + "ffn_down.weight", ff, sh.n_embd, 0.f, 1.f / std::sqrt(float(ff)), l);
    }
    if (sh.ple_dim > 0) {  // gemma4 E2B / E4B: the layer's use of its per-layer input
      add(b + "inp_gate.weight", sh.n_embd, sh.ple_dim, 0.f, 1.f / std::sqrt(float(sh.n_embd)), l);
      add(b + "proj.weight", sh.ple_dim, sh.n_embd, 0.f, 1.f / std::sqrt(float(sh.ple_dim)), l);
      add(b + "post_norm.weight", sh.n_embd, 1, 1.f, 0.1f, l);
    }
  };

  const float embd_std = sh.tied_output ? 2.f / std::sqrt(float(sh.n_embd)) : 1.f;
  add("token_embd.weight", sh.n_embd, n_vocab, 0.f, embd_std, 0);
  if (sh.ple_dim > 0) {  // gemma4 E2B / E4B: the per-layer token embeddings and the embedding's projection
    const std::int64_t width = sh.n_layer * sh.ple_dim;
    add("per_layer_token_embd.weight", width, n_vocab, 0.f, 1.f / std::sqrt(float(sh.ple_dim)), 0);
    add("per_layer_model_proj.weight", sh.n_embd, width, 0.f, 1.f / std::sqrt(float(sh.n_embd)), 0);
    add("per_layer_proj_norm.weight", sh.ple_dim, 1, 1.f, 0.1f, 0);
  }
  if (gemma4) {  // the global layers' proportional RoPE: the first quarter of the pairs turn, the rest do not
    std::vector<float> factors(std::size_t(sh.head_dim / 2), 1e30f);
    std::fill_n(factors.begin(), sh.head_dim / 8, 1.f);
    w.add_tensor("rope_freqs.weight", ggml_type::F32, {sh.head_dim / 2}, [factors](std::span<std::byte> dst) {
      std::memcpy(dst.data(), factors.data(), factors.size() * sizeof(float));
    });
  }
  for (std::int64_t l = 0; l < sh.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    // This layer's attention shape: gemma4's sliding and global layers differ.
    const bool global4 = gemma4 && !gemma4_synth_sliding(l, sh.n_layer);
    const std::int64_t hd = gemma4 && !global4 ? sh.head_dim_swa : sh.head_dim;
    const std::int64_t q_dim = sh.n_head * hd, kv_dim = (global4 ? sh.n_head_kv_global : sh.n_head_kv) * hd;
    const float s_embd = 1.f / std::sqrt(float(sh.n_embd));
    add(b + "attn_norm.weight", sh.n_embd, 1, 1.f, 0.1f, l);
    if (qwen35 && (l + 1) % sh.full_attn_interval != 0) {  // a gated DeltaNet layer
      const std::int64_t key = sh.ssm_k_heads * sh.ssm_head, value = sh.ssm_v_heads * sh.ssm_head;
      add(b + "attn_qkv.weight", sh.n_embd, 2 * key + value, 0.f, s_embd, l);
      add(b + "attn_gate.weight", sh.n_embd, value, 0.f, s_embd, l);
      add(b + "ssm_beta.weight", sh.n_embd, sh.ssm_v_heads, 0.f, s_embd, l);
      add(b + "ssm_alpha.weight", sh.n_embd, sh.ssm_v_heads, 0.f, s_embd, l);
      add(b + "ssm_conv1d.weight", sh.ssm_conv_kernel, 2 * key + value, 0.f, 0.5f, l);
      add(b + "ssm_a", sh.ssm_v_heads, 1, -1.f, 0.1f, l);  // -exp(A_log): a decay, always negative
      add(b + "ssm_dt.bias", sh.ssm_v_heads, 1, 0.f, 0.1f, l);
      add(b + "ssm_norm.weight", sh.ssm_head, 1, 1.f, 0.1f, l);
      add(b + "ssm_out.weight", value, sh.n_embd, 0.f, 1.f / std::sqrt(float(value)), l);
      add(b + "post_attention_norm.weight", sh.n_embd, 1, 1.f, 0.1f, l);
      add_ffn(b, l);
      continue;
    }
    add(b + "attn_q.weight", sh.n_embd, qwen35 ? 2 * q_dim : q_dim, 0.f, s_embd, l);  // qwen35: a gate per head after its query
    if (!shared_kv(l)) {  // gemma4 E2B / E4B's shared layers: the KV of an earlier layer
      add(b + "attn_k.weight", sh.n_embd, kv_dim, 0.f, s_embd, l);
      // gemma4's global layers: V is K, except the E4B's
      if (!global4 || sh.global_v) add(b + "attn_v.weight", sh.n_embd, kv_dim, 0.f, s_embd, l);
    }
    const bool gpt_oss = sh.architecture == arch::gpt_oss;
    if (sh.architecture == arch::qwen2 || sh.architecture == arch::qwen2moe || gpt_oss) {
      add(b + "attn_q.bias", q_dim, 1, 0.f, 0.1f, l);
      add(b + "attn_k.bias", kv_dim, 1, 0.f, 0.1f, l);
      add(b + "attn_v.bias", kv_dim, 1, 0.f, 0.1f, l);
    }
    const bool gemma3 = sh.architecture == arch::gemma3 || gemma4;  // gemma4: the same norms around each block
    if (sh.architecture == arch::qwen3 || sh.architecture == arch::qwen3moe || gemma3 || qwen35) {
      // gemma4 leaves the softmax's temperature to these (its scores are unscaled): gains around
      // head_dim^-1/4 on q and on k give the 1 / sqrt(head_dim) of the others (as its goldens:
      // tools/reference/make_model_goldens.py).
      const float qk_gain = gemma4 ? 1.f / std::sqrt(std::sqrt(float(hd))) : 1.f;
      add(b + "attn_q_norm.weight", hd, 1, qk_gain, 0.1f * qk_gain, l);
      if (!shared_kv(l)) add(b + "attn_k_norm.weight", hd, 1, qk_gain, 0.1f * qk_gain, l);
    }
    add(b + "attn_output.weight", q_dim, sh.n_embd, 0.f, 1.f / std::sqrt(float(q_dim)), l);
    if (gpt_oss) {
      add(b + "attn_output.bias", sh.n_embd, 1, 0.f, 0.1f, l);
      add(b + "attn_sinks.weight", sh.n_head, 1, 0.f, 1.f, l);
    }
    add(b + (gpt_oss || qwen35 ? "post_attention_norm.weight" : "ffn_norm.weight"), sh.n_embd, 1, 1.f, 0.1f, l);
    if (gemma3) {
      add(b + "post_attention_norm.weight", sh.n_embd, 1, 1.f, 0.1f, l);
      add(b + "post_ffw_norm.weight", sh.n_embd, 1, 1.f, 0.1f, l);
    }
    if (gemma4) add(b + "layer_output_scale.weight", 1, 1, 0.8f, 0.1f, l);
    add_ffn(b, l);
  }
  add("output_norm.weight", sh.n_embd, 1, 1.f, 0.1f, 0);
  if (!sh.tied_output) add("output.weight", sh.n_embd, n_vocab, 0.f, 3.f / std::sqrt(float(sh.n_embd)), sh.n_layer - 1);
  w.write(path, progress);
}

}  // namespace anvil::model
