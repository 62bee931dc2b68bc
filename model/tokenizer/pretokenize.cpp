// The patterns, written once with a placeholder for "whitespace". HF tokenizers (Oniguruma) and
// tiktoken read \s as Unicode White_Space, which includes U+0085; PCRE2's \s under UCP does not,
// so the set is spelled out: White_Space is exactly TAB..CR, U+0085 and the Z categories.
// Contractions are matched case-insensitively letter by letter ('[sS]') as llama.cpp and
// transformers.js do; (?i) would also let 's' match U+017F LONG S.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/tokenizer/pretokenize.h"

#include <pcre2.h>

#include <array>
#include <new>
#include <stdexcept>

#include "model/model_error.h"
#include "model/tokenizer/tokenizer_impl.h"

namespace anvil::model {
namespace {

constexpr std::string_view ws_placeholder = "WS";
constexpr std::string_view ws_set = "\\t-\\r\\x{85}\\p{Z}";

// Llama 3: digits in runs of up to three.
constexpr std::string_view llama3_pattern =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
    "|\\p{N}{1,3}"
    "| ?[^WS\\p{L}\\p{N}]+[\\r\\n]*"
    "|[WS]*[\\r\\n]+"
    "|[WS]+(?![^WS])"
    "|[WS]+";

// Qwen2 (also Qwen2.5 and Qwen3): as Llama 3 but one digit per piece.
constexpr std::string_view qwen2_pattern =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
    "|\\p{N}"
    "| ?[^WS\\p{L}\\p{N}]+[\\r\\n]*"
    "|[WS]*[\\r\\n]+"
    "|[WS]+(?![^WS])"
    "|[WS]+";

// Qwen3.5 / 3.6: as Qwen2 but combining marks (\p{M}) count as letters: they stay in their word
// and out of punctuation runs.
constexpr std::string_view qwen35_pattern =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+"
    "|\\p{N}"
    "| ?[^WS\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
    "|[WS]*[\\r\\n]+"
    "|[WS]+(?![^WS])"
    "|[WS]+";

// GPT-4o's o200k (gpt-oss; llama.cpp also runs Llama 4 with it): a word is an optional leading
// non-letter, upper-case letters, then lower-case ones ("camelCase" -> "camel" "Case", "HTTPServer"
// whole), or an upper-case run ("ABC"); a contraction stays on its word ("Don't" is one piece); Lm,
// Lo and marks (\p{M}) count as either case. Digits in runs of up to three; a punctuation run takes
// trailing newlines and '/' with it. As the tokenizer.json of gpt-oss spells it, with (?i:'s|...)
// written letter by letter.
constexpr std::string_view gpt4o_pattern =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    "|\\p{N}{1,3}"
    "| ?[^WS\\p{L}\\p{N}]+[\\r\\n/]*"
    "|[WS]*[\\r\\n]+"
    "|[WS]+(?![^WS])"
    "|[WS]+";

// Mistral's tekken (Mistral NeMo, Mistral Small 3.x, Ministral 3, Devstral): o200k's words without
// the contraction suffixes ("don't" is "don" "'t"), and one digit per piece.
constexpr std::string_view tekken_pattern =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "|\\p{N}"
    "| ?[^WS\\p{L}\\p{N}]+[\\r\\n/]*"
    "|[WS]*[\\r\\n]+"
    "|[WS]+(?![^WS])"
    "|[WS]+";

// GPT-2, llama.cpp's fallback when a BPE vocabulary names no pre-tokenizer.
constexpr std::string_view gpt2_pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^WS\\p{L}\\p{N}]+|[WS]+(?![^WS])|[WS]+";

std::string_view pattern_for(std::string_view pre) {
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") return llama3_pattern;
  if (pre == "qwen2") return qwen2_pattern;
  if (pre == "qwen35") return qwen35_pattern;
  if (pre == "gpt-4o" || pre == "llama4" || pre == "kanana2" || pre == "talkie") return gpt4o_pattern;
  if (pre == "tekken") return tekken_pattern;
  if (pre == "default" || pre.empty()) return gpt2_pattern;
  throw model_error("tokenizer: unknown pre-tokenizer '" + std::string(pre) +
                    "' (tokenizer.ggml.pre); known: " + pre_tokenizer::known_names());
}

std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> buf{};
  pcre2_get_error_message(code, buf.data(), buf.size());
  return reinterpret_cast<const char*>(buf.data());
}

}  // namespace

const char* pre_tokenizer::known_names() {
  return "llama-bpe (llama3, llama-v3), qwen2, qwen35, gpt-4o (llama4, kanana2, talkie), tekken, default";
}

pre_tokenizer::pre_tokenizer(std::string_view pre) {
  const std::string pattern = detail::replace_all(pattern_for(pre), ws_placeholder, ws_set);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  // MATCH_INVALID_UTF: invalid bytes are simply never matched (they end up in pieces of their
  // own) and the subject is not re-validated on every call, which would make split() quadratic.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr);
  if (code == nullptr)
    throw model_error("tokenizer: pre-tokenizer regex failed to compile at " + std::to_string(err_offset) + ": " +
                      pcre2_message(err));
  code_.reset(code, pcre2_code_free);
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: the interpreter is the fallback
}

std::vector<std::string_view> pre_tokenizer::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
  if (!md) throw std::bad_alloc();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t done = 0, search = 0;  // end of the last piece; where the next match may start
  while (search < text.size()) {
    int rc = pcre2_match(code_.get(), subject, text.size(), search, 0, md.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // the interpreter keeps its backtracking on the heap
      rc = pcre2_match(code_.get(), subject, text.size(), search, PCRE2_NO_JIT, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw std::runtime_error("tokenizer: pre-tokenizer regex failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const std::size_t begin = ov[0], end = ov[1];
    if (end == begin) {  // the patterns cannot match empty; guard against looping anyway
      search = begin + 1;
      continue;
    }
    if (begin > done) pieces.push_back(text.substr(done, begin - done));  // unmatched (invalid) bytes
    pieces.push_back(text.substr(begin, end - begin));
    done = search = end;
  }
  if (done < text.size()) pieces.push_back(text.substr(done));
  return pieces;
}

}  // namespace anvil::model
