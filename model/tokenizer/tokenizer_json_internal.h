// Pieces of the tokenizer.json import shared by its .cpp files: a parsed JSON file that knows
// its path (every error names the file and the field), and the pipeline/special-token readers.
#pragma once

#include <boost/json/fwd.hpp>
#include <boost/json/value.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/tokenizer/tokenizer.h"

namespace anvil::model::hf_json {

class file {
 public:
  static file read(const std::string& path);  // throws model_error when unreadable or not JSON

  const std::string& path() const { return path_; }
  const boost::json::object& root_object() const;
  [[noreturn]] void fail(const std::string& what) const;

  // `where` is the field's name in messages ("model.vocab"). Missing or mistyped -> fail().
  const boost::json::value& require(const boost::json::object& o, std::string_view key,
                                    const std::string& where) const;
  const boost::json::object& require_object(const boost::json::object& o, std::string_view key,
                                            const std::string& where) const;
  std::string require_string(const boost::json::object& o, std::string_view key, const std::string& where) const;
  // Missing or null -> nullptr / nullopt; present with the wrong type -> fail().
  const boost::json::array* optional_array(const boost::json::object& o, std::string_view key,
                                           const std::string& where) const;
  const boost::json::object* optional_object(const boost::json::object& o, std::string_view key,
                                             const std::string& where) const;
  std::optional<bool> optional_bool(const boost::json::object& o, std::string_view key,
                                    const std::string& where) const;
  const boost::json::object& as_object(const boost::json::value& v, const std::string& where) const;
  const boost::json::string& as_string(const boost::json::value& v, const std::string& where) const;

 private:
  std::string path_;
  boost::json::value root_;
};

// A pipeline section of the root object ("normalizer", "pre_tokenizer", "post_processor")
// flattened: {"type": "Sequence", "<list_key>": [...]} becomes its members; null/missing none.
std::vector<const boost::json::object*> stages(const file& f, std::string_view key, std::string_view list_key);
std::string type_of(const boost::json::object& o);  // its "type" string, "" if none

// Token text -> id; the first of duplicate texts wins.
std::unordered_map<std::string, std::int32_t> ids_by_text(const std::vector<std::string>& tokens);

// Sets spec.model, spec.pre and spec.add_space_prefix from the normalizer, pre-tokenizer and
// model sections; fails for pipelines the runtime does not implement.
void identify_pipeline(const file& tj, const boost::json::object& model, tokenizer_spec& spec);

// bos/eos/pad/unk/eot/eom ids and add_bos/add_eos; config may be null. Needs spec.tokens.
void read_special_ids(const file& tj, const boost::json::object& model, const file* config, tokenizer_spec& spec);

}  // namespace anvil::model::hf_json
