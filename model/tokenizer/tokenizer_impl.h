// Internals of the tokenizer (tokenizer*.cpp, pretokenize.cpp): token types, the vocabulary
// lookups both encoders need, the two merge engines, special-token matching, and the state a
// tokenizer shares between its copies. Not part of the public API.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/tokenizer/pretokenize.h"
#include "model/tokenizer/tokenizer.h"

namespace anvil::model::detail {

// GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class token_type : std::int32_t {
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6
};

constexpr std::string_view spm_space = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

// The value tokenizer_spec::token_types stores for t.
constexpr std::int32_t gguf_value(token_type t) { return static_cast<std::int32_t>(t); }

struct string_hash {
  using is_transparent = void;  // lets find() take a string_view without building a string
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using token_map = std::unordered_map<std::string, std::int32_t, string_hash, std::equal_to<>>;

// Lookups built once from a validated spec.
struct vocab_index {
  std::vector<token_type> types;                // per id
  token_map normal;                             // text of normal tokens -> id (first wins)
  std::array<std::int32_t, 256> byte_tokens{};  // id of the <0xHH> byte token per byte, or -1
};

// Throws model_error naming the first thing wrong with the spec that does not depend on the
// model type's tables (those are checked as the encoders are built).
void validate_spec(const tokenizer_spec& spec);
vocab_index build_vocab_index(const tokenizer_spec& spec);

std::string replace_all(std::string_view s, std::string_view from, std::string_view to);

// Parses "<0xHH>" (either case of hex digit); -1 when text is not of that form.
int parse_byte_token(std::string_view text);

// GPT-2's byte <-> printable-unicode mapping used by byte-level BPE vocabularies.
std::string byte_level_encode(std::string_view bytes);
std::string byte_level_decode(std::string_view token_text);  // unmapped characters pass through

// Byte-level BPE: each piece from the pre-tokenizer starts as one symbol per byte; adjacent
// symbols are merged lowest merge rank first (leftmost on ties) until no listed merge applies.
class bpe_encoder {
 public:
  // Throws model_error for merges that are malformed or name tokens not in the vocabulary.
  bpe_encoder(const tokenizer_spec& spec, const vocab_index& vocab, bool ignore_merges);
  void encode_piece(std::string_view piece, std::vector<std::int32_t>& out) const;

 private:
  struct merge_rule {
    std::int32_t rank;
    std::int32_t result;
  };
  static std::uint64_t key(std::int32_t left, std::int32_t right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) |
           static_cast<std::uint32_t>(right);
  }
  const merge_rule* find_merge(std::int32_t left, std::int32_t right) const;

  const vocab_index& vocab_;
  std::unordered_map<std::uint64_t, merge_rule> merges_;
  std::array<std::int32_t, 256> byte_ids_{};  // token of each byte's byte-level character
  bool ignore_merges_;                        // a piece that is itself a token is emitted whole (Llama 3)
};

// SentencePiece-style BPE (llama.cpp's llm_tokenizer_spm): the text starts as one symbol per
// UTF-8 character; adjacent symbols whose concatenation is a normal token merge, highest score
// first (leftmost on ties). Characters left that are not tokens fall back to <0xHH> byte tokens.
class spm_encoder {
 public:
  spm_encoder(const tokenizer_spec& spec, const vocab_index& vocab);
  // text has spaces already replaced by U+2581.
  void encode_fragment(std::string_view text, std::vector<std::int32_t>& out) const;

 private:
  const vocab_index& vocab_;
  std::vector<float> scores_;  // per id (all 0 when the spec has none)
  std::int32_t unk_id_;
};

// The end tokens of the harmony vocabulary (gpt-oss's o200k_harmony), found by their text; -1
// where absent (the first of duplicate texts). A vocabulary with both <|return|> and <|call|> is
// harmony: there <|end|> closes one message (the analysis channel, say) and the model goes on with
// the next, so only <|return|> and <|call|> end generation. llama.cpp applies the same rule to the
// vocabulary, whatever the model is called.
struct harmony_ends {
  std::int32_t return_id = -1, call_id = -1, end_id = -1;
  bool present() const { return return_id >= 0 && call_id >= 0; }
};
harmony_ends find_harmony_ends(const std::vector<std::string>& tokens);

// The ids is_eog() is true for, sorted and unique: eos, eot and eom; on a harmony vocabulary also
// <|return|> and <|call|>, and never <|end|>, even when the spec names it eos or eot.
std::vector<std::int32_t> end_of_generation_ids(const tokenizer_spec& spec);

// Token strings recognised in text before encoding, found leftmost-longest (HF's added-token
// matching): user-defined tokens always, control and unknown tokens only with parse_special.
class special_matcher {
 public:
  special_matcher(const tokenizer_spec& spec, const vocab_index& vocab);
  struct match {
    std::size_t pos = std::string_view::npos;  // npos: none
    std::int32_t id = -1;
  };
  match find(std::string_view text, std::size_t from, bool parse_special) const;

 private:
  const tokenizer_spec& spec_;
  const vocab_index& vocab_;
  std::array<std::vector<std::int32_t>, 256> by_first_byte_;  // candidates, longest text first
};

}  // namespace anvil::model::detail

namespace anvil::model {

// Everything a tokenizer is, built once; tokenizers share it read-only. Members refer to spec and
// vocab, so a state is never moved or copied after construction.
struct tokenizer::state {
  explicit state(tokenizer_spec s);
  state(const state&) = delete;
  state& operator=(const state&) = delete;

  tokenizer_spec spec;
  bool byte_level = false;           // "gpt2"; otherwise "llama"
  bool nfc = false;                  // normalise raw text to NFC first ("qwen2")
  bool strip_leading_space = false;  // decode drops the space encode prefixed ("llama")
  detail::vocab_index vocab;
  std::vector<std::string> pieces;  // token_piece() per id
  std::vector<std::int32_t> eog;    // detail::end_of_generation_ids(spec), for is_eog()
  std::optional<pre_tokenizer> pre;
  std::unique_ptr<detail::bpe_encoder> bpe;
  std::unique_ptr<detail::spm_encoder> spm;
  std::unique_ptr<detail::special_matcher> specials;
};

}  // namespace anvil::model
