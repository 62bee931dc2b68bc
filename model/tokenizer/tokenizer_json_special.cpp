// Special token ids for an imported tokenizer. tokenizer_config.json names bos/eos/pad/unk and
// may say add_bos_token/add_eos_token; failing that, tokenizer.json's post-processor template
// shows which special tokens encode() wraps the text in; failing that, llama.cpp's defaults
// (BOS for Llama 3's "llama-bpe" and for SentencePiece "llama"). eot/eom are not in either file:
// llama.cpp recognises them by name, and so do we.
#include <boost/json.hpp>

#include <unordered_map>

#include "model/tokenizer/tokenizer_impl.h"
#include "model/tokenizer/tokenizer_json_internal.h"

namespace anvil::model::hf_json {
namespace json = boost::json;
namespace {

using token_ids = std::unordered_map<std::string, std::int32_t>;

struct template_info {
  bool present = false;             // a TemplateProcessing post-processor exists
  std::int32_t bos = -1, eos = -1;  // special tokens before / after the text in its "single" template
};

std::int32_t lookup(const file& f, const token_ids& ids, const std::string& text, const std::string& field) {
  const auto it = ids.find(text);
  if (it == ids.end()) f.fail(field + " '" + text + "' is not in the vocabulary");
  return it->second;
}

// A config token: "bos_token": "<s>" or {"content": "<s>", ...}; "" when missing or null.
std::string config_token(const file& cfg, std::string_view key) {
  const json::value* v = cfg.root_object().if_contains(key);
  if (v == nullptr || v->is_null()) return "";
  if (const json::string* s = v->if_string()) return std::string(*s);
  return cfg.require_string(cfg.as_object(*v, std::string(key)), "content", std::string(key) + ".content");
}

template_info read_template(const file& tj, const token_ids& ids) {
  template_info info;
  for (const json::object* p : stages(tj, "post_processor", "processors")) {
    if (type_of(*p) != "TemplateProcessing") continue;
    info.present = true;
    const json::array* single = tj.optional_array(*p, "single", "post_processor.single");
    if (single == nullptr) continue;
    bool seen_text = false;
    for (const json::value& item : *single) {
      const json::object& o = tj.as_object(item, "post_processor.single[]");
      if (o.contains("Sequence")) {
        seen_text = true;
        continue;
      }
      const json::object* special = tj.optional_object(o, "SpecialToken", "post_processor.single[].SpecialToken");
      if (special == nullptr) continue;
      const std::int32_t id =
          lookup(tj, ids, tj.require_string(*special, "id", "SpecialToken.id"), "post_processor special token");
      if (!seen_text && info.bos < 0) info.bos = id;
      if (seen_text) info.eos = id;
    }
  }
  return info;
}

std::int32_t named_id(const file* cfg, const token_ids& ids, std::string_view key) {
  if (cfg == nullptr) return -1;
  const std::string text = config_token(*cfg, key);
  return text.empty() ? -1 : lookup(*cfg, ids, text, std::string(key));
}

}  // namespace

void read_special_ids(const file& tj, const json::object& model, const file* config, tokenizer_spec& spec) {
  const token_ids ids = ids_by_text(spec.tokens);

  spec.bos_id = named_id(config, ids, "bos_token");
  spec.eos_id = named_id(config, ids, "eos_token");
  spec.pad_id = named_id(config, ids, "pad_token");
  spec.unk_id = named_id(config, ids, "unk_token");
  if (const json::value* unk = model.if_contains("unk_token"); spec.unk_id < 0 && unk && unk->is_string())
    spec.unk_id = lookup(tj, ids, std::string(unk->get_string()), "model.unk_token");
  if (spec.unk_id >= 0) spec.token_types[spec.unk_id] = detail::gguf_value(detail::token_type::unknown);

  const template_info tpl = read_template(tj, ids);
  if (spec.bos_id < 0) spec.bos_id = tpl.bos;
  if (spec.eos_id < 0) spec.eos_id = tpl.eos;

  const bool bos_by_default = spec.pre == "llama-bpe" || spec.model == "llama";
  spec.add_bos = tpl.present ? tpl.bos >= 0 : bos_by_default && spec.bos_id >= 0;
  spec.add_eos = tpl.present && tpl.eos >= 0;
  if (config != nullptr) {  // an explicit setting in tokenizer_config.json wins
    spec.add_bos =
        config->optional_bool(config->root_object(), "add_bos_token", "add_bos_token").value_or(spec.add_bos);
    spec.add_eos =
        config->optional_bool(config->root_object(), "add_eos_token", "add_eos_token").value_or(spec.add_eos);
  }
  if (spec.add_bos && spec.bos_id < 0)
    (config ? *config : tj).fail("add_bos_token is true but no bos_token is named");
  if (spec.add_eos && spec.eos_id < 0)
    (config ? *config : tj).fail("add_eos_token is true but no eos_token is named");

  name_end_tokens(spec);
}

}  // namespace anvil::model::hf_json
