// Which tokenizer a tokenizer.json describes, and its special tokens. Only two pipelines are
// accepted, the ones the runtime implements exactly:
//   byte-level BPE:   [normalizer NFC (qwen2, qwen35 only)] -> Split(known regex, Isolated) + ByteLevel
//                     (the regex names the pre-tokenizer: llama-bpe, qwen2, qwen35, gpt-4o or tekken)
//   SentencePiece BPE: Prepend("▁") + Replace(" ", "▁") (or Metaspace) -> BPE with byte_fallback
//                     (Gemma 3: also a Split on " " after that Replace, which leaves no space to split)
#include <boost/json.hpp>

#include <algorithm>
#include <vector>

#include "model/tokenizer/tokenizer_impl.h"
#include "model/tokenizer/tokenizer_json_internal.h"

namespace anvil::model::hf_json {
namespace json = boost::json;
namespace {

// The pre-tokenizer regexes exactly as the published tokenizer.json files spell them.
constexpr std::string_view llama3_regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view qwen2_regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view qwen35_regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view gpt4o_regex =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view tekken_regex =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
using detail::spm_space;

std::string string_field(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  return v && v->is_string() ? std::string(v->get_string()) : std::string();
}

bool bool_field(const json::object& o, std::string_view key, bool fallback) {
  const json::value* v = o.if_contains(key);
  return v && v->is_bool() ? v->get_bool() : fallback;
}

void identify_byte_level(const file& f, const std::vector<const json::object*>& pre,
                         const std::vector<const json::object*>& norm, tokenizer_spec& spec) {
  std::string regex;
  bool byte_level_regex = false;  // ByteLevel splitting with GPT-2's regex itself
  for (const json::object* p : pre) {
    const std::string t = type_of(*p);
    if (t == "Split") {
      if (!regex.empty()) f.fail("pre_tokenizer has more than one Split");
      const json::object* pattern = f.optional_object(*p, "pattern", "pre_tokenizer.pattern");
      regex = pattern ? string_field(*pattern, "Regex") : std::string();
      if (regex.empty()) f.fail("pre_tokenizer Split has no Regex pattern");
      if (string_field(*p, "behavior") != "Isolated" || bool_field(*p, "invert", false))
        f.fail("pre_tokenizer Split must use behavior Isolated without invert");
    } else if (t == "ByteLevel") {
      if (bool_field(*p, "add_prefix_space", false))
        f.fail("pre_tokenizer ByteLevel with add_prefix_space is not supported");
      byte_level_regex = bool_field(*p, "use_regex", true);
    } else {
      f.fail("pre_tokenizer stage '" + t + "' is not supported");
    }
  }
  if (!regex.empty() && byte_level_regex) f.fail("pre_tokenizer splits twice (Split and ByteLevel use_regex)");
  if (regex.empty() && !byte_level_regex)
    f.fail("pre_tokenizer does not split the text (ByteLevel use_regex is false)");
  if (regex == llama3_regex)
    spec.pre = "llama-bpe";
  else if (regex == qwen2_regex)
    spec.pre = "qwen2";
  else if (regex == qwen35_regex)
    spec.pre = "qwen35";
  else if (regex == gpt4o_regex)
    spec.pre = "gpt-4o";
  else if (regex == tekken_regex)
    spec.pre = "tekken";
  else if (regex.empty())
    spec.pre = "default";  // ByteLevel's own (GPT-2) regex
  else
    f.fail("pre_tokenizer regex is not one this runtime knows (llama-bpe, qwen2, qwen35, gpt-4o, tekken): " + regex);
  spec.model = "gpt2";
  for (const json::object* n : norm) {
    if (type_of(*n) != "NFC" || (spec.pre != "qwen2" && spec.pre != "qwen35"))
      f.fail("normalizer '" + type_of(*n) + "' is not supported with pre-tokenizer '" + spec.pre + "'");
  }
}

void identify_sentencepiece(const file& f, const std::vector<const json::object*>& pre,
                            const std::vector<const json::object*>& norm, tokenizer_spec& spec) {
  bool spaces_escaped = false, prefix = false;
  for (const json::object* n : norm) {
    const std::string t = type_of(*n);
    const json::object* pattern =
        t == "Replace" ? f.optional_object(*n, "pattern", "normalizer.pattern") : nullptr;
    if (t == "Prepend" && string_field(*n, "prepend") == spm_space)
      prefix = true;
    else if (pattern && string_field(*pattern, "String") == " " && string_field(*n, "content") == spm_space)
      spaces_escaped = true;
    else
      f.fail("normalizer stage '" + t + "' is not supported for a SentencePiece-style tokenizer");
  }
  const bool normalized_spaces = spaces_escaped;
  for (const json::object* p : pre) {
    // A split on " " sees the normalized text, whose spaces are all U+2581 already: none to split.
    const json::object* pattern = type_of(*p) == "Split" ? f.optional_object(*p, "pattern", "pre_tokenizer.pattern") : nullptr;
    if (normalized_spaces && pattern && string_field(*pattern, "String") == " " && !bool_field(*p, "invert", false)) continue;
    if (type_of(*p) != "Metaspace" || string_field(*p, "replacement") != spm_space ||
        bool_field(*p, "split", true))
      f.fail("pre_tokenizer '" + type_of(*p) + "' is not supported for a SentencePiece-style tokenizer");
    spaces_escaped = true;
    prefix = string_field(*p, "prepend_scheme") != "never" && bool_field(*p, "add_prefix_space", true);
  }
  if (!spaces_escaped) f.fail("SentencePiece-style tokenizer does not replace spaces with U+2581");
  spec.model = "llama";
  spec.pre = "default";
  spec.add_space_prefix = prefix;
}

}  // namespace

void identify_pipeline(const file& tj, const json::object& model, tokenizer_spec& spec) {
  if (type_of(model) != "BPE") tj.fail("model type '" + type_of(model) + "' is not supported (only BPE)");
  const auto pre = stages(tj, "pre_tokenizer", "pretokenizers");
  const auto norm = stages(tj, "normalizer", "normalizers");
  const bool byte_level =
      std::any_of(pre.begin(), pre.end(), [](const json::object* p) { return type_of(*p) == "ByteLevel"; });
  if (byte_level) {
    if (bool_field(model, "byte_fallback", false)) tj.fail("byte-level BPE with byte_fallback is not supported");
    identify_byte_level(tj, pre, norm, spec);
  } else if (bool_field(model, "byte_fallback", false)) {
    identify_sentencepiece(tj, pre, norm, spec);
  } else {
    tj.fail("neither byte-level BPE nor SentencePiece-style BPE (byte_fallback); not supported");
  }
}

}  // namespace anvil::model::hf_json
