// Small hand-built vocabularies for the tokenizer tests, where the expected ids can be worked
// out by hand, and the paths of the fetched reference tokenizers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer/tokenizer.h"

namespace anvil::model::test {

// GPT-2's byte-level character for byte b, as UTF-8 (space -> "Ġ", newline -> "Ċ").
inline std::string byte_char(unsigned char b) {
  int n = 0;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
    const char32_t cp = printable ? static_cast<char32_t>(x) : static_cast<char32_t>(256 + n++);
    if (x != b) continue;
    std::string out;
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return out;
  }
  return {};
}

// Byte-level BPE spec: ids 0..255 are the 256 byte tokens in byte order, then `extra` normal
// tokens from id 256, in order.
inline tokenizer_spec byte_level_spec(std::string pre, std::vector<std::string> extra = {},
                                      std::vector<std::string> merges = {}) {
  tokenizer_spec s;
  s.model = "gpt2";
  s.pre = std::move(pre);
  for (int b = 0; b < 256; ++b) s.tokens.push_back(byte_char(static_cast<unsigned char>(b)));
  for (auto& t : extra) s.tokens.push_back(std::move(t));
  s.token_types.assign(s.tokens.size(), 1);
  s.merges = std::move(merges);
  return s;
}

// Appends a token of the given type and returns its id.
inline std::int32_t add_token(tokenizer_spec& s, std::string text, std::int32_t type, float score = 0.0f) {
  s.tokens.push_back(std::move(text));
  if (!s.token_types.empty()) s.token_types.push_back(type);
  if (!s.scores.empty()) s.scores.push_back(score);
  return static_cast<std::int32_t>(s.tokens.size() - 1);
}

// SentencePiece-style spec: 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>; normal tokens from
// 259 on are added with add_token().
inline tokenizer_spec spm_spec() {
  tokenizer_spec s;
  s.model = "llama";
  s.tokens = {"<unk>", "<s>", "</s>"};
  s.token_types = {2, 3, 3};
  s.scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    static constexpr char hex[] = "0123456789ABCDEF";
    add_token(s, std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">", 6);
  }
  s.unk_id = 0;
  s.bos_id = 1;
  s.eos_id = 2;
  return s;
}

inline constexpr std::int32_t spm_byte(unsigned char b) { return 3 + b; }

inline std::string data_path(std::string_view rel) {
  return std::string(ANVIL_TEST_DATA_DIR) + "/" + std::string(rel);
}

}  // namespace anvil::model::test
