#include "model/gguf/gguf_tokenizer.h"

#include <limits>

namespace anvil::model {
namespace {

std::vector<std::string> owned(const std::vector<std::string_view>& v) { return {v.begin(), v.end()}; }

std::int32_t token_id(const gguf_file& f, const char* key) {
  const auto v = f.get_int(key);
  if (!v) return -1;
  if (*v < -1 || *v > std::numeric_limits<std::int32_t>::max()) {
    throw model_error("metadata '" + std::string(key) + "' = " + std::to_string(*v) + " is not a token id");
  }
  return static_cast<std::int32_t>(*v);
}

}  // namespace

tokenizer_spec tokenizer_spec_from_gguf(const gguf_file& f) {
  tokenizer_spec s;
  const auto model = f.get_string("tokenizer.ggml.model");
  if (!model) throw model_error("the file has no tokenizer (missing 'tokenizer.ggml.model')");
  s.model = std::string(*model);
  s.pre = std::string(f.get_string("tokenizer.ggml.pre").value_or("default"));
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (!tokens) throw model_error("missing metadata 'tokenizer.ggml.tokens'");
  s.tokens = owned(*tokens);
  s.scores = f.get_f32_array("tokenizer.ggml.scores").value_or(std::vector<float>{});
  s.token_types = f.get_i32_array("tokenizer.ggml.token_type").value_or(std::vector<std::int32_t>{});
  if (const auto merges = f.get_string_array("tokenizer.ggml.merges")) s.merges = owned(*merges);
  s.bos_id = token_id(f, "tokenizer.ggml.bos_token_id");
  s.eos_id = token_id(f, "tokenizer.ggml.eos_token_id");
  s.unk_id = token_id(f, "tokenizer.ggml.unknown_token_id");
  s.pad_id = token_id(f, "tokenizer.ggml.padding_token_id");
  s.eot_id = token_id(f, "tokenizer.ggml.eot_token_id");
  s.eom_id = token_id(f, "tokenizer.ggml.eom_token_id");
  // llama.cpp's default when the key is absent: BOS for SentencePiece, Llama 3's BPE and tekken.
  s.add_bos = f.get_bool("tokenizer.ggml.add_bos_token").value_or(s.model == "llama" || s.pre == "llama-bpe" ||
                                                                  s.pre == "tekken");
  s.add_eos = f.get_bool("tokenizer.ggml.add_eos_token").value_or(false);
  s.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix").value_or(s.model == "llama");
  // Converters often leave eot out (Gemma's <end_of_turn>, Llama 3's <|eot_id|> next to eos
  // <|end_of_text|>): llama.cpp finds it by name, and so does anvil.
  name_end_tokens(s);
  return s;
}

std::string chat_template_from_gguf(const gguf_file& f) {
  return std::string(f.get_string("tokenizer.chat_template").value_or(""));
}

void write_tokenizer_metadata(gguf_writer& w, const tokenizer_spec& s, const std::string& chat_template) {
  w.set_string("tokenizer.ggml.model", s.model);
  w.set_string("tokenizer.ggml.pre", s.pre);
  w.set_strings("tokenizer.ggml.tokens", s.tokens);
  if (!s.scores.empty()) w.set_f32s("tokenizer.ggml.scores", s.scores);
  if (!s.token_types.empty()) w.set_i32s("tokenizer.ggml.token_type", s.token_types);
  if (!s.merges.empty()) w.set_strings("tokenizer.ggml.merges", s.merges);
  auto id = [&](const char* key, std::int32_t v) {
    if (v >= 0) w.set_u32(key, static_cast<std::uint32_t>(v));
  };
  id("tokenizer.ggml.bos_token_id", s.bos_id);
  id("tokenizer.ggml.eos_token_id", s.eos_id);
  id("tokenizer.ggml.unknown_token_id", s.unk_id);
  id("tokenizer.ggml.padding_token_id", s.pad_id);
  id("tokenizer.ggml.eot_token_id", s.eot_id);
  id("tokenizer.ggml.eom_token_id", s.eom_id);
  w.set_bool("tokenizer.ggml.add_bos_token", s.add_bos);
  w.set_bool("tokenizer.ggml.add_eos_token", s.add_eos);
  if (s.model == "llama") w.set_bool("tokenizer.ggml.add_space_prefix", s.add_space_prefix);
  if (!chat_template.empty()) w.set_string("tokenizer.chat_template", chat_template);
}

}  // namespace anvil::model
