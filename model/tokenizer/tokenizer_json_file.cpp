// hf_json::file: reading and type-checked access, so the import code reads as a list of fields.
#include <boost/json.hpp>

#include <filesystem>
#include <fstream>

#include "model/model_error.h"
#include "model/tokenizer/tokenizer_json_internal.h"

namespace anvil::model::hf_json {
namespace json = boost::json;

file file::read(const std::string& path) {
  file f;
  f.path_ = path;
  std::error_code fs_error;
  const bool regular = std::filesystem::is_regular_file(path, fs_error);
  const std::uintmax_t size = regular ? std::filesystem::file_size(path, fs_error) : 0;
  std::ifstream in(path, std::ios::binary);
  if (!regular || fs_error || !in) f.fail("cannot open file");
  std::string text(size, '\0');  // one read: these files are large
  if (!in.read(text.data(), static_cast<std::streamsize>(size))) f.fail("cannot read file");
  boost::system::error_code ec;
  // A monotonic arena: these files are large (up to ~20 MB), read once, then dropped whole.
  f.root_ = json::parse(text, ec, json::make_shared_resource<json::monotonic_resource>());
  if (ec) f.fail("not valid JSON: " + ec.message());
  if (!f.root_.is_object()) f.fail("top level is not a JSON object");
  return f;
}

const json::object& file::root_object() const { return root_.get_object(); }

void file::fail(const std::string& what) const { throw model_error(path_ + ": " + what); }

const json::value& file::require(const json::object& o, std::string_view key, const std::string& where) const {
  const json::value* v = o.if_contains(key);
  if (v == nullptr) fail(where + " is missing");
  return *v;
}

const json::object& file::require_object(const json::object& o, std::string_view key,
                                         const std::string& where) const {
  return as_object(require(o, key, where), where);
}

std::string file::require_string(const json::object& o, std::string_view key, const std::string& where) const {
  return std::string(as_string(require(o, key, where), where));
}

const json::array* file::optional_array(const json::object& o, std::string_view key,
                                        const std::string& where) const {
  const json::value* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return nullptr;
  if (!v->is_array()) fail(where + " is not an array");
  return &v->get_array();
}

const json::object* file::optional_object(const json::object& o, std::string_view key,
                                          const std::string& where) const {
  const json::value* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return nullptr;
  return &as_object(*v, where);
}

std::optional<bool> file::optional_bool(const json::object& o, std::string_view key,
                                        const std::string& where) const {
  const json::value* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (!v->is_bool()) fail(where + " is not true or false");
  return v->get_bool();
}

const json::object& file::as_object(const json::value& v, const std::string& where) const {
  if (!v.is_object()) fail(where + " is not an object");
  return v.get_object();
}

const json::string& file::as_string(const json::value& v, const std::string& where) const {
  if (!v.is_string()) fail(where + " is not a string");
  return v.get_string();
}

std::vector<const json::object*> stages(const file& f, std::string_view key, std::string_view list_key) {
  std::vector<const json::object*> out;
  const std::string where(key);
  const json::object* o = f.optional_object(f.root_object(), key, where);
  if (o == nullptr) return out;
  if (type_of(*o) != "Sequence") return {o};
  if (const json::array* list = f.optional_array(*o, list_key, where + "." + std::string(list_key)))
    for (const json::value& v : *list) out.push_back(&f.as_object(v, where + "[]"));
  return out;
}

std::string type_of(const json::object& o) {
  const json::value* t = o.if_contains("type");
  return t && t->is_string() ? std::string(t->get_string()) : std::string();
}

std::unordered_map<std::string, std::int32_t> ids_by_text(const std::vector<std::string>& tokens) {
  std::unordered_map<std::string, std::int32_t> ids;
  ids.reserve(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) ids.emplace(tokens[i], static_cast<std::int32_t>(i));
  return ids;
}

}  // namespace anvil::model::hf_json
