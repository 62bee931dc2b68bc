// Pre-tokenisation for byte-level BPE: the regex that cuts text into the pieces BPE merges
// within (merges never cross a piece boundary). Each GGUF tokenizer.ggml.pre names one of these
// regexes; the patterns are the ones the models were trained with, run through PCRE2 with
// Unicode properties. Every byte of the input lands in exactly one piece: text the regex does
// not match (only possible for invalid UTF-8) becomes a piece of its own, as HF's "Isolated"
// split behaviour does.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;  // PCRE2's compiled pattern (pcre2_code_8), kept out of this header

namespace anvil::model {

class pre_tokenizer {
 public:
  // pre: "llama-bpe" (aliases "llama3", "llama-v3"), "qwen2", "qwen35", "gpt-4o" (aliases "llama4",
  // "kanana2", "talkie": llama.cpp's names for the same regex), "tekken" (Mistral), or
  // "default"/"" (GPT-2's pattern).
  // Throws model_error for any other name.
  explicit pre_tokenizer(std::string_view pre);

  // The pieces of text, in order; they concatenate back to text. Thread-safe.
  std::vector<std::string_view> split(std::string_view text) const;

  // Names the pre_tokenizer constructor accepts, for error messages.
  static const char* known_names();

 private:
  std::shared_ptr<pcre2_real_code_8> code_;
};

}  // namespace anvil::model
