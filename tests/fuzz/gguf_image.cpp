#include "tests/fuzz/gguf_image.h"

#include <cstring>
#include <stdexcept>

#include "model/quant/quant.h"
#include "model/tokenizer/tokenizer_impl.h"  // byte_level_encode: the byte-level vocabulary's token texts

namespace anvil::fuzz {

using model::ggml_type;
using model::gguf_type;

namespace enc {
namespace {

template <class T>
void put(bytes& b, T v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  b.insert(b.end(), p, p + sizeof v);
}

void put_str(bytes& b, std::string_view s) {
  put<std::uint64_t>(b, s.size());
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  b.insert(b.end(), p, p + s.size());
}

template <class T>
bytes scalar(T v) {
  bytes b(sizeof v);
  std::memcpy(b.data(), &v, sizeof v);
  return b;
}

template <class T>
bytes numbers(gguf_type elem, const std::vector<T>& v) {
  bytes raw;
  for (const T x : v) put(raw, x);
  return array(elem, v.size(), raw);
}

}  // namespace

bytes u32(std::uint32_t v) { return scalar(v); }
bytes i32(std::int32_t v) { return scalar(v); }
bytes u64(std::uint64_t v) { return scalar(v); }
bytes f32(float v) { return scalar(v); }
bytes boolean(bool v) { return scalar<std::uint8_t>(v ? 1 : 0); }

bytes str(std::string_view s) {
  bytes b;
  put_str(b, s);
  return b;
}

bytes strings(const std::vector<std::string>& v) {
  bytes raw;
  for (const auto& s : v) put_str(raw, s);
  return array(gguf_type::string, v.size(), raw);
}

bytes f32s(const std::vector<float>& v) { return numbers(gguf_type::f32, v); }
bytes i32s(const std::vector<std::int32_t>& v) { return numbers(gguf_type::i32, v); }

bytes array(gguf_type elem, std::uint64_t count, const bytes& raw) {
  bytes b;
  put(b, static_cast<std::uint32_t>(elem));
  put(b, count);
  b.insert(b.end(), raw.begin(), raw.end());
  return b;
}

}  // namespace enc

bytes gguf_image::serialise() const {
  bytes b;
  enc::put(b, magic);
  enc::put(b, version);
  enc::put<std::uint64_t>(b, n_tensors.value_or(tensors.size()));
  enc::put<std::uint64_t>(b, n_kv.value_or(kvs.size()));
  for (const kv& k : kvs) {
    enc::put<std::uint64_t>(b, k.key_len.value_or(k.key.size()));
    for (const char c : k.key) b.push_back(std::byte(c));
    enc::put(b, k.type);
    b.insert(b.end(), k.payload.begin(), k.payload.end());
  }
  for (const tensor& t : tensors) {
    enc::put<std::uint64_t>(b, t.name_len.value_or(t.name.size()));
    for (const char c : t.name) b.push_back(std::byte(c));
    enc::put<std::uint32_t>(b, t.n_dims.value_or(static_cast<std::uint32_t>(t.dims.size())));
    for (const std::uint64_t d : t.dims) enc::put(b, d);
    enc::put(b, t.type);
    enc::put(b, t.offset);
  }
  if (pad_to > 1) {
    while (b.size() % pad_to) b.push_back(std::byte{0});
  }
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

gguf_image::kv& gguf_image::at(std::string_view key) {
  for (kv& k : kvs) {
    if (k.key == key) return k;
  }
  throw std::out_of_range("micro model has no key " + std::string(key));
}

void gguf_image::set(std::string key, gguf_type type, bytes payload) {
  for (kv& k : kvs) {
    if (k.key == key) {
      k.type = static_cast<std::uint32_t>(type);
      k.payload = std::move(payload);
      return;
    }
  }
  kvs.push_back({std::move(key), static_cast<std::uint32_t>(type), std::move(payload), {}});
}

void gguf_image::erase(std::string_view key) {
  std::erase_if(kvs, [&](const kv& k) { return k.key == key; });
}

gguf_image::tensor& gguf_image::tensor_at(std::string_view name) {
  for (tensor& t : tensors) {
    if (t.name == name) return t;
  }
  throw std::out_of_range("micro model has no tensor " + std::string(name));
}

void gguf_image::add_tensor(std::string name, ggml_type type, std::vector<std::uint64_t> dims, const bytes& content) {
  while (data.size() % 32) data.push_back(std::byte{0});
  tensors.push_back({std::move(name), std::move(dims), static_cast<std::uint32_t>(type), data.size(), {}, {}});
  data.insert(data.end(), content.begin(), content.end());
}

namespace {

// Small deterministic weights in [-0.5, 0.5), stored as `type` (F32 or F16).
bytes weights(ggml_type type, std::uint64_t n, std::uint32_t seed) {
  std::vector<float> v(n);
  for (float& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(seed >> 8) / float(1u << 24) - 0.5f;
  }
  bytes out(*model::row_bytes(type, static_cast<std::int64_t>(n)));
  if (type == ggml_type::F32) {
    std::memcpy(out.data(), v.data(), out.size());
  } else {
    model::quantize_row(type, v.data(), out.data(), static_cast<std::int64_t>(n));
  }
  return out;
}

bytes ones(std::uint64_t n) {
  std::vector<float> v(n, 1.0f);
  bytes out(n * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

constexpr std::string_view chatml_template =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

struct vocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<std::int32_t> types;
  std::vector<std::string> merges;
};

vocab spm_vocab() {
  // id:        0        1      2       3         4         5         6    7    8          9     10
  vocab v{{"<unk>", "<s>", "</s>", "<0x0A>", "<0x41>", "\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a", "ab",
           "\xe2\x96\x81" "ab", "c", "<|im_start|>", "<|im_end|>", "ba", "<user>"},
          {0, 0, 0, 0, 0, -1, -2, -3, -4, -5, -6, -7, 0, 0, -8, 0},
          {2, 3, 3, 6, 6, 1, 1, 1, 1, 1, 1, 1, 3, 3, 1, 4},
          {}};
  return v;
}

vocab byte_level_vocab() {
  vocab v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(model::detail::byte_level_encode(std::string(1, char(b))));
  v.tokens.insert(v.tokens.end(), {"ab", "\xc4\xa0" "a", "<|endoftext|>", "<|im_start|>", "<|im_end|>"});
  v.types.assign(v.tokens.size(), 1);
  for (std::size_t i = v.tokens.size() - 3; i < v.tokens.size(); ++i) v.types[i] = 3;
  v.merges = {"a b", "\xc4\xa0 a"};
  return v;
}

}  // namespace

gguf_image micro_model(micro_vocab which) {
  constexpr std::uint64_t n_embd = 8, n_ff = 16, n_head = 2, n_head_kv = 1, head_dim = 4;
  const vocab v = which == micro_vocab::spm ? spm_vocab() : byte_level_vocab();
  const auto n_vocab = static_cast<std::uint64_t>(v.tokens.size());

  gguf_image m;
  m.set("general.architecture", gguf_type::string, enc::str("llama"));
  m.set("general.name", gguf_type::string, enc::str("micro"));
  m.set("general.alignment", gguf_type::u32, enc::u32(32));
  m.set("llama.context_length", gguf_type::u32, enc::u32(64));
  m.set("llama.embedding_length", gguf_type::u32, enc::u32(n_embd));
  m.set("llama.block_count", gguf_type::u32, enc::u32(1));
  m.set("llama.feed_forward_length", gguf_type::u32, enc::u32(n_ff));
  m.set("llama.attention.head_count", gguf_type::u32, enc::u32(n_head));
  m.set("llama.attention.head_count_kv", gguf_type::u32, enc::u32(n_head_kv));
  m.set("llama.rope.dimension_count", gguf_type::u32, enc::u32(head_dim));
  m.set("llama.attention.layer_norm_rms_epsilon", gguf_type::f32, enc::f32(1e-5f));
  m.set("llama.rope.freq_base", gguf_type::f32, enc::f32(10000.f));
  m.set("tokenizer.ggml.model", gguf_type::string, enc::str(which == micro_vocab::spm ? "llama" : "gpt2"));
  m.set("tokenizer.ggml.pre", gguf_type::string, enc::str("default"));
  m.set("tokenizer.ggml.tokens", gguf_type::array, enc::strings(v.tokens));
  if (!v.scores.empty()) m.set("tokenizer.ggml.scores", gguf_type::array, enc::f32s(v.scores));
  m.set("tokenizer.ggml.token_type", gguf_type::array, enc::i32s(v.types));
  if (!v.merges.empty()) m.set("tokenizer.ggml.merges", gguf_type::array, enc::strings(v.merges));
  if (which == micro_vocab::spm) {
    m.set("tokenizer.ggml.unknown_token_id", gguf_type::u32, enc::u32(0));
    m.set("tokenizer.ggml.bos_token_id", gguf_type::u32, enc::u32(1));
    m.set("tokenizer.ggml.eos_token_id", gguf_type::u32, enc::u32(2));
    m.set("tokenizer.ggml.eot_token_id", gguf_type::u32, enc::u32(13));
    m.set("tokenizer.ggml.add_bos_token", gguf_type::boolean, enc::boolean(true));
  } else {
    m.set("tokenizer.ggml.eos_token_id", gguf_type::u32, enc::u32(static_cast<std::uint32_t>(n_vocab - 3)));
    m.set("tokenizer.ggml.eot_token_id", gguf_type::u32, enc::u32(static_cast<std::uint32_t>(n_vocab - 1)));
    m.set("tokenizer.ggml.add_bos_token", gguf_type::boolean, enc::boolean(false));
  }
  m.set("tokenizer.chat_template", gguf_type::string, enc::str(chatml_template));

  // Norms are F32 (as converters write them), attention F32, feed-forward and embeddings F16.
  std::uint32_t seed = 1;
  m.add_tensor("token_embd.weight", ggml_type::F16, {n_embd, n_vocab}, weights(ggml_type::F16, n_embd * n_vocab, seed++));
  m.add_tensor("output_norm.weight", ggml_type::F32, {n_embd}, ones(n_embd));
  m.add_tensor("blk.0.attn_norm.weight", ggml_type::F32, {n_embd}, ones(n_embd));
  m.add_tensor("blk.0.attn_q.weight", ggml_type::F32, {n_embd, n_head * head_dim}, weights(ggml_type::F32, n_embd * n_head * head_dim, seed++));
  m.add_tensor("blk.0.attn_k.weight", ggml_type::F32, {n_embd, n_head_kv * head_dim}, weights(ggml_type::F32, n_embd * n_head_kv * head_dim, seed++));
  m.add_tensor("blk.0.attn_v.weight", ggml_type::F32, {n_embd, n_head_kv * head_dim}, weights(ggml_type::F32, n_embd * n_head_kv * head_dim, seed++));
  m.add_tensor("blk.0.attn_output.weight", ggml_type::F32, {n_head * head_dim, n_embd}, weights(ggml_type::F32, n_embd * n_head * head_dim, seed++));
  m.add_tensor("blk.0.ffn_norm.weight", ggml_type::F32, {n_embd}, ones(n_embd));
  m.add_tensor("blk.0.ffn_gate.weight", ggml_type::F16, {n_embd, n_ff}, weights(ggml_type::F16, n_embd * n_ff, seed++));
  m.add_tensor("blk.0.ffn_up.weight", ggml_type::F16, {n_embd, n_ff}, weights(ggml_type::F16, n_embd * n_ff, seed++));
  m.add_tensor("blk.0.ffn_down.weight", ggml_type::F16, {n_ff, n_embd}, weights(ggml_type::F16, n_embd * n_ff, seed++));
  return m;
}

}  // namespace anvil::fuzz
