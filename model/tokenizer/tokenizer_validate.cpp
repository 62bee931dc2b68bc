// Spec validation and the vocabulary lookups. A GGUF file is untrusted input, so everything the
// encoders later index with is checked here once, and each failure names the key and the value.
#include <string>

#include "model/model_error.h"
#include "model/tokenizer/tokenizer_impl.h"

namespace anvil::model::detail {
namespace {

[[noreturn]] void fail(const std::string& what) { throw model_error("tokenizer: " + what); }

void check_lengths(const tokenizer_spec& spec) {
  if (spec.tokens.empty()) fail("empty vocabulary (tokenizer.ggml.tokens has no entries)");
  const std::size_t n = spec.tokens.size();
  if (!spec.scores.empty() && spec.scores.size() != n)
    fail("tokenizer.ggml.scores has " + std::to_string(spec.scores.size()) +
         " entries but tokenizer.ggml.tokens has " + std::to_string(n));
  if (!spec.token_types.empty() && spec.token_types.size() != n)
    fail("tokenizer.ggml.token_type has " + std::to_string(spec.token_types.size()) +
         " entries but tokenizer.ggml.tokens has " + std::to_string(n));
  if (n > static_cast<std::size_t>(INT32_MAX)) fail("vocabulary too large");
}

void check_special_id(const tokenizer_spec& spec, const char* key, std::int32_t id) {
  if (id == -1) return;
  if (id < -1 || static_cast<std::size_t>(id) >= spec.tokens.size())
    fail(std::string(key) + " " + std::to_string(id) + " is out of range (vocabulary has " +
         std::to_string(spec.tokens.size()) + " tokens)");
}

void check_token_types(const tokenizer_spec& spec) {
  for (std::size_t i = 0; i < spec.token_types.size(); ++i) {
    const std::int32_t t = spec.token_types[i];
    if (t < 1 || t > 6)
      fail("token " + std::to_string(i) + " '" + spec.tokens[i] + "' has token_type " + std::to_string(t) +
           " (expected 1..6: normal, unknown, control, user-defined, unused, byte)");
    if (static_cast<token_type>(t) == token_type::byte && parse_byte_token(spec.tokens[i]) < 0)
      fail("token " + std::to_string(i) + " '" + spec.tokens[i] + "' has type byte but is not of the form <0xHH>");
  }
}

}  // namespace

int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    int digit = -1;
    if (c >= '0' && c <= '9')
      digit = c - '0';
    else if (c >= 'A' && c <= 'F')
      digit = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f')
      digit = c - 'a' + 10;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

void validate_spec(const tokenizer_spec& spec) {
  if (spec.model != "gpt2" && spec.model != "llama")
    fail("unknown tokenizer model '" + spec.model + "' (tokenizer.ggml.model); supported: gpt2, llama");
  if (spec.model == "llama" && !spec.pre.empty() && spec.pre != "default")
    fail("pre-tokenizer '" + spec.pre +
         "' (tokenizer.ggml.pre) is not supported with model 'llama' (expected 'default')");
  check_lengths(spec);
  check_token_types(spec);
  check_special_id(spec, "bos_token_id", spec.bos_id);
  check_special_id(spec, "eos_token_id", spec.eos_id);
  check_special_id(spec, "unknown_token_id", spec.unk_id);
  check_special_id(spec, "padding_token_id", spec.pad_id);
  check_special_id(spec, "eot_token_id", spec.eot_id);
  check_special_id(spec, "eom_token_id", spec.eom_id);
  if (spec.add_bos && spec.bos_id < 0) fail("add_bos_token is set but there is no bos_token_id");
  if (spec.add_eos && spec.eos_id < 0) fail("add_eos_token is set but there is no eos_token_id");
}

vocab_index build_vocab_index(const tokenizer_spec& spec) {
  vocab_index v;
  const std::size_t n = spec.tokens.size();
  v.types.resize(n, token_type::normal);
  for (std::size_t i = 0; i < spec.token_types.size(); ++i)
    v.types[i] = static_cast<token_type>(spec.token_types[i]);
  v.byte_tokens.fill(-1);
  v.normal.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto id = static_cast<std::int32_t>(i);
    if (v.types[i] == token_type::normal) v.normal.emplace(spec.tokens[i], id);  // first occurrence wins
    if (v.types[i] == token_type::byte) {
      const int b = parse_byte_token(spec.tokens[i]);
      if (v.byte_tokens[b] < 0) v.byte_tokens[b] = id;
    }
  }
  if (spec.model == "llama" && spec.unk_id < 0) {
    for (int b = 0; b < 256; ++b) {
      if (v.byte_tokens[b] < 0)
        fail(
            "model 'llama' needs byte tokens <0x00>..<0xFF> or an unknown_token_id for characters outside the "
            "vocabulary; byte " +
            std::to_string(b) + " has no token and there is no unknown token");
    }
  }
  return v;
}

}  // namespace anvil::model::detail
