// HF tokenizer.json -> tokenizer_spec. The file's pipeline (normalizer, pre-tokenizer, model,
// post-processor) is checked against the two shapes the runtime implements, so a tokenizer that
// would silently tokenise differently is refused instead of converted.
#include "model/tokenizer/tokenizer_json.h"

#include <boost/json.hpp>

#include <algorithm>
#include <optional>
#include <unordered_map>

#include "model/model_error.h"
#include "model/tokenizer/tokenizer_impl.h"
#include "model/tokenizer/tokenizer_json_internal.h"

namespace anvil::model {
namespace json = boost::json;
using namespace hf_json;

namespace {

using detail::gguf_value;
using detail::token_type;
constexpr std::int64_t max_vocab = 10'000'000;  // far above any real vocabulary; bounds the allocation

// llama.cpp's does_token_look_special(): added tokens some models forget to mark special.
bool looks_special(const std::string& t) {
  const auto wrapped = [&](std::string_view open, std::string_view close) {
    return t.size() >= open.size() + close.size() && t.starts_with(open) && t.ends_with(close);
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || wrapped("<|", "|>") ||
         wrapped("<\xEF\xBD\x9C", "\xEF\xBD\x9C>") || wrapped("<unused", ">");
}

std::int32_t read_id(const file& f, const json::value& v, const std::string& what) {
  std::int64_t id = -1;
  if (const auto* n = v.if_int64())
    id = *n;
  else if (const auto* u = v.if_uint64(); u && *u < static_cast<std::uint64_t>(max_vocab))
    id = static_cast<std::int64_t>(*u);
  if (id < 0 || id >= max_vocab) f.fail(what + ": id is not an integer in 0.." + std::to_string(max_vocab - 1));
  return static_cast<std::int32_t>(id);
}

// Tokens by id from model.vocab and added_tokens, with the types convert_hf_to_gguf.py gives them.
void read_tokens(const file& f, const json::object& model, tokenizer_spec& spec) {
  std::unordered_map<std::int32_t, std::pair<std::string, std::int32_t>> by_id;  // id -> text, type
  std::int32_t max_id = -1;
  for (const json::key_value_pair& kv : f.require_object(model, "vocab", "model.vocab")) {
    const std::int32_t id = read_id(f, kv.value(), "model.vocab['" + std::string(kv.key()) + "']");
    by_id[id] = {std::string(kv.key()), gguf_value(token_type::normal)};
    max_id = std::max(max_id, id);
  }
  if (const json::array* added = f.optional_array(f.root_object(), "added_tokens", "added_tokens")) {
    for (const json::value& v : *added) {
      const json::object& o = f.as_object(v, "added_tokens[]");
      const std::int32_t id = read_id(f, f.require(o, "id", "added_tokens[].id"), "added_tokens[].id");
      std::string text = f.require_string(o, "content", "added_tokens[].content");
      const bool special = f.optional_bool(o, "special", "added_tokens[].special").value_or(false);
      std::int32_t type =
          special || looks_special(text) ? gguf_value(token_type::control) : gguf_value(token_type::user_defined);
      // llama.cpp stores user-defined SentencePiece tokens with plain spaces (they are matched in raw text).
      if (type == gguf_value(token_type::user_defined) && spec.model == "llama")
        text = detail::replace_all(text, detail::spm_space, " ");
      by_id[id] = {std::move(text), type};
      max_id = std::max(max_id, id);
    }
  }
  if (max_id < 0) f.fail("model.vocab is empty");
  spec.tokens.resize(static_cast<std::size_t>(max_id) + 1);
  spec.token_types.assign(spec.tokens.size(), gguf_value(token_type::unused));
  for (std::int32_t id = 0; id <= max_id; ++id) {
    auto it = by_id.find(id);
    if (it == by_id.end()) {
      spec.tokens[id] = "[PAD" + std::to_string(id) + "]";  // as convert_hf_to_gguf.py pads holes
      continue;
    }
    spec.tokens[id] = std::move(it->second.first);
    spec.token_types[id] = it->second.second;
    if (spec.model == "llama" && spec.token_types[id] == gguf_value(token_type::normal) &&
        detail::parse_byte_token(spec.tokens[id]) >= 0)
      spec.token_types[id] = gguf_value(token_type::byte);
  }
}

void read_merges(const file& f, const json::object& model, tokenizer_spec& spec) {
  const json::array* merges = f.optional_array(model, "merges", "model.merges");
  if (merges == nullptr) return;
  spec.merges.reserve(merges->size());
  for (const json::value& m : *merges) {
    if (const json::string* s = m.if_string()) {
      spec.merges.emplace_back(*s);
    } else if (const json::array* pair = m.if_array();
               pair && pair->size() == 2 && (*pair)[0].is_string() && (*pair)[1].is_string()) {
      spec.merges.push_back(std::string((*pair)[0].get_string()) + " " + std::string((*pair)[1].get_string()));
    } else {
      f.fail("model.merges[" + std::to_string(spec.merges.size()) + "] is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
}

// SentencePiece merges by score, HF's BPE by merge rank. HF built its merge list from the
// SentencePiece model sorted by the merged piece's score, so -(rank of the first merge that
// makes a token) orders tokens exactly as their scores did. Tokens no merge makes (characters,
// specials, bytes) score below every merge, so the encoder would form one only last.
void scores_from_merges(tokenizer_spec& spec) {
  const auto ids = ids_by_text(spec.tokens);
  const float never = -static_cast<float>(spec.merges.size()) - 1.0f;
  spec.scores.assign(spec.tokens.size(), never);
  for (std::size_t rank = spec.merges.size(); rank-- > 0;) {  // backwards: the first rank wins
    const std::string& m = spec.merges[rank];
    const std::size_t sp = m.find(' ');
    if (sp == std::string::npos) continue;
    if (auto it = ids.find(m.substr(0, sp) + m.substr(sp + 1)); it != ids.end())
      spec.scores[it->second] = -static_cast<float>(rank);
  }
  spec.merges.clear();  // GGUF "llama" vocabularies carry scores, not merges
}

}  // namespace

tokenizer_spec spec_from_hf_json(const std::string& tokenizer_json_path,
                                 const std::string& tokenizer_config_path) {
  const file tj = file::read(tokenizer_json_path);
  const json::object& model = tj.require_object(tj.root_object(), "model", "model");
  tokenizer_spec spec;
  identify_pipeline(tj, model, spec);
  read_tokens(tj, model, spec);
  read_merges(tj, model, spec);
  if (spec.model == "llama") scores_from_merges(spec);
  std::optional<file> config;
  if (!tokenizer_config_path.empty()) config = file::read(tokenizer_config_path);
  read_special_ids(tj, model, config ? &*config : nullptr, spec);
  return spec;
}

std::string chat_template_from_hf_config(const std::string& tokenizer_config_path) {
  const file f = file::read(tokenizer_config_path);
  const json::value* t = f.root_object().if_contains("chat_template");
  if (t == nullptr || t->is_null()) return "";
  if (const json::string* s = t->if_string()) return std::string(*s);
  // A list of named templates: [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
  const json::array* list = t->if_array();
  if (list == nullptr) f.fail("chat_template is neither a string nor a list of named templates");
  const json::string* first = nullptr;
  for (const json::value& v : *list) {
    const json::object& o = f.as_object(v, "chat_template[]");
    const json::string& body =
        f.as_string(f.require(o, "template", "chat_template[].template"), "chat_template[].template");
    if (first == nullptr) first = &body;
    if (const json::value* name = o.if_contains("name");
        name && name->is_string() && name->get_string() == "default")
      return std::string(body);
  }
  return first ? std::string(*first) : "";
}

}  // namespace anvil::model
