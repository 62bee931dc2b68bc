// Tokenizers built from GGUF tokenizer.* metadata: byte-level BPE ("gpt2": Llama 3, Qwen2/2.5/3,
// gpt-oss) and SentencePiece-style BPE ("llama": Llama 2, Mistral, Gemma). tokenizer_spec mirrors the
// GGUF keys one to one so the loader only copies them in; the tokenizer validates the spec once,
// builds its lookup tables, and is immutable afterwards: encode/decode are const, thread-safe,
// and copies share the tables.
//
// Behaviour follows the HF tokenizer the model ships with (checked against goldens in
// tests/data/tokenizer), and llama.cpp where HF has no equivalent:
//  - special tokens in text: user-defined tokens are always recognised, control and unknown
//    tokens only with parse_special (llama.cpp); leftmost-longest match (HF).
//  - "qwen2" normalises text to NFC first, as its tokenizer.json does (llama.cpp does not).
//  - end of generation (is_eog): eos, eot and eom; on the harmony vocabulary of gpt-oss (one
//    with both <|return|> and <|call|>) those two, and not <|end|>, which there closes a message
//    the model goes on from (llama.cpp's rule, on the vocabulary rather than the model name).
//  - decode() is the exact inverse for text that round-trips: no clean-up of spaces before
//    punctuation; for "llama" with add_space_prefix the one leading space encode() added is
//    removed again (HF's Strip decoder, llama.cpp's remove_space).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace anvil::model {

struct tokenizer_spec {
  std::string model;                      // tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SPM)
  std::string pre;                        // tokenizer.ggml.pre: "llama-bpe", "qwen2", "gpt-4o", "default"/""
  std::vector<std::string> tokens;        // tokenizer.ggml.tokens, indexed by id
  std::vector<float> scores;              // tokenizer.ggml.scores: SPM merge priority; empty = all 0
  std::vector<std::int32_t> token_types;  // tokenizer.ggml.token_type: 1 normal, 2 unknown, 3 control,
                                          // 4 user-defined, 5 unused, 6 byte; empty = all normal
  std::vector<std::string> merges;        // tokenizer.ggml.merges, "left right", by rank (gpt2 only)
  // tokenizer.ggml.*_token_id; -1: none
  std::int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1, eot_id = -1, eom_id = -1;
  bool add_bos = false, add_eos = false;  // tokenizer.ggml.add_bos_token / add_eos_token
  bool add_space_prefix = true;           // tokenizer.ggml.add_space_prefix ("llama" only)
};

// llama.cpp's rule for a vocabulary whose file names no end-of-turn (eot) or end-of-message (eom)
// token: eot is the first of <|eot_id|>, <|im_end|>, <|end|> (not on a harmony vocabulary),
// <end_of_turn>, <|endoftext|>, <|end_of_text|>, <EOT> present that is not eos; eom <|eom_id|>.
// Sets those of spec.eot_id / eom_id that are -1.
void name_end_tokens(tokenizer_spec& spec);

class tokenizer {
 public:
  // Validates the spec; throws model_error naming the first problem found.
  explicit tokenizer(tokenizer_spec spec);

  // add_special: BOS/EOS per add_bos/add_eos. parse_special: control-token strings in the text
  // ("<|im_start|>") become those tokens; otherwise they are tokenised as plain text.
  std::vector<std::int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  // Concatenated token pieces. skip_special drops control, unknown and unused tokens. Bytes that
  // do not form valid UTF-8 are passed through as they are. Throws std::out_of_range on a bad id.
  std::string decode(std::span<const std::int32_t> ids, bool skip_special = false) const;

  // The token's bytes: byte-level mapping undone ("gpt2"), U+2581 as space and <0xAB> as the
  // byte ("llama"); control, user-defined, unknown and unused tokens as their text.
  std::string token_piece(std::int32_t id) const;

  std::int32_t n_vocab() const;
  std::int32_t bos() const;  // -1 when the vocabulary has none
  std::int32_t eos() const;
  bool is_eog(std::int32_t id) const;  // end of generation: eos, eot, eom; harmony's rule above
  bool is_control(std::int32_t id) const;
  const tokenizer_spec& spec() const;

  struct state;  // the validated spec and the tables built from it (tokenizer_impl.h)

 private:
  friend class incremental_decoder;
  const std::string* piece_for_output(std::int32_t id, bool skip_special) const;  // nullptr: skipped

  std::shared_ptr<const state> state_;
};

// Streaming detokenisation: push ids one at a time and get back only complete UTF-8 characters,
// never half of one. flush() at the end returns whatever was held back, unchanged: bytes that
// never became valid UTF-8 are passed through, not replaced by U+FFFD, so the concatenation of
// every push() and the final flush() equals tokenizer::decode(ids, skip_special) exactly.
// The tokenizer must outlive the decoder. `shown`: control tokens written as their text even with
// skip_special (the markers an output parser reads, such as Mistral's [TOOL_CALLS]).
class incremental_decoder {
 public:
  explicit incremental_decoder(const tokenizer& t, bool skip_special = true, std::vector<std::int32_t> shown = {});
  std::string push(std::int32_t id);
  std::string flush();

 private:
  const tokenizer* tokenizer_;
  bool skip_special_;
  std::vector<std::int32_t> shown_;
  bool strip_leading_space_;  // "llama" + add_space_prefix: drop one leading space, as decode() does
  std::string pending_;       // bytes of an incomplete UTF-8 sequence
};

}  // namespace anvil::model
