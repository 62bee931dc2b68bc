#include "sampler/structured/json_schema.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include <boost/json.hpp>

#include "sampler/structured/regex.h"

namespace anvil::sampler::structured {
namespace {

namespace json = boost::json;
using piece = std::optional<std::string>;  // nullopt: nothing can match (a recursion cut off)

constexpr std::string_view sp = "( )?";  // the one optional space after ':' and ','
// A JSON string's character: any but '"', '\\' and controls, or an escape; \u escapes of UTF-16
// surrogates are left out (a lone one is not valid text; characters past U+FFFF come as UTF-8).
constexpr std::string_view string_char =
    R"((?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})))";
constexpr std::string_view integer_re = "(?:0|[1-9][0-9]{0,15})";
constexpr int max_ref_depth = 3;


std::string any_string(std::string_view repeat = "*") { return "\"" + std::string(string_char) + std::string(repeat) + "\""; }

std::string number_re(bool negative) {
  return std::string(negative ? "-?" : "") + std::string(integer_re) + R"((?:\.[0-9]{1,16})?(?:[eE][+-]?[0-9]{1,3})?)";
}

std::string value_re(int depth);

std::string object_re(int depth) {
  if (depth <= 0) return R"(\{\})";
  const std::string member = any_string() + ":" + std::string(sp) + value_re(depth - 1);
  return R"(\{(?:)" + member + "(?:," + std::string(sp) + member + R"()*)?\})";
}

std::string array_re(int depth) {
  if (depth <= 0) return R"(\[\])";
  const std::string v = value_re(depth - 1);
  return R"(\[(?:)" + v + "(?:," + std::string(sp) + v + R"()*)?\])";
}

std::string value_re(int depth) {
  return "(?:" + any_string() + "|" + number_re(true) + "|true|false|null|" + object_re(depth) + "|" + array_re(depth) + ")";
}

std::string alternatives(const std::vector<std::string>& parts) {
  if (parts.size() == 1) return parts[0];
  std::string out = "(?:";
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? "|" : "") + parts[i];
  return out + ")";
}

class compiler {
 public:
  explicit compiler(const json::value& root) : root_(root) {}

  piece schema(const json::value& s, const std::string& at) {
    if (s.is_bool()) {
      if (!s.get_bool()) throw structured_error("json_schema: `false` at " + at + " admits nothing");
      return value_re(3);
    }
    const json::object* o = s.if_object();
    if (!o) throw structured_error("json_schema: " + at + " must be an object");
    static const std::set<std::string_view> ignored = {
        "title", "description", "default", "examples", "$schema", "$id", "$comment", "strict", "name",
        "additionalProperties", "$defs", "definitions", "deprecated", "readOnly", "writeOnly"};
    static const std::set<std::string_view> handled = {"type",     "properties", "required",  "items",     "minItems",
                                                       "maxItems", "enum",       "const",     "anyOf",     "oneOf",
                                                       "$ref",     "minLength",  "maxLength", "pattern",   "format",
                                                       "minimum"};
    for (const auto& kv : *o) {
      if (!ignored.contains(kv.key()) && !handled.contains(kv.key())) {
        throw structured_error("json_schema: `" + std::string(kv.key()) + "` (at " + at + ") is not supported");
      }
    }
    if (const json::value* ref = o->if_contains("$ref")) return reference(*ref, at);
    if (const json::value* c = o->if_contains("const")) return escape_regex(json::serialize(*c));
    if (const json::value* e = o->if_contains("enum")) {
      if (!e->is_array() || e->get_array().empty()) throw structured_error("json_schema: `enum` at " + at + " must be a non-empty array");
      std::vector<std::string> parts;
      for (const json::value& v : e->get_array()) parts.push_back(escape_regex(json::serialize(v)));
      return alternatives(parts);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (const json::value* list = o->if_contains(key)) {
        if (!list->is_array() || list->get_array().empty()) {
          throw structured_error(std::string("json_schema: `") + key + "` at " + at + " must be a non-empty array");
        }
        std::vector<std::string> parts;
        for (std::size_t i = 0; i < list->get_array().size(); ++i) {
          if (piece p = schema(list->get_array()[i], at + "/" + key + "/" + std::to_string(i))) parts.push_back(*p);
        }
        if (parts.empty()) return std::nullopt;
        return alternatives(parts);
      }
    }
    const json::value* type = o->if_contains("type");
    if (!type) {
      if (o->contains("properties")) return typed("object", *o, at);
      if (o->contains("items")) return typed("array", *o, at);
      return value_re(3);  // {}: any JSON value
    }
    if (type->is_string()) return typed(type->get_string(), *o, at);
    if (type->is_array() && !type->get_array().empty()) {
      std::vector<std::string> parts;
      for (const json::value& t : type->get_array()) {
        if (!t.is_string()) throw structured_error("json_schema: `type` at " + at + " must name types");
        if (piece p = typed(t.get_string(), *o, at)) parts.push_back(*p);
      }
      if (parts.empty()) return std::nullopt;
      return alternatives(parts);
    }
    throw structured_error("json_schema: `type` at " + at + " must be a string or a list of strings");
  }

 private:
  std::int64_t count(const json::object& o, const char* key, std::int64_t dflt, const std::string& at) {
    const json::value* v = o.if_contains(key);
    if (!v) return dflt;
    if (!v->is_int64() && !v->is_uint64()) throw structured_error(std::string("json_schema: `") + key + "` at " + at + " must be an integer");
    const std::int64_t n = v->is_int64() ? v->get_int64() : std::int64_t(std::min<std::uint64_t>(v->get_uint64(), 1u << 30));
    if (n < 0 || n > 1000) throw structured_error(std::string("json_schema: `") + key + "` at " + at + " must be in [0, 1000]");
    return n;
  }

  piece typed(std::string_view type, const json::object& o, const std::string& at) {
    if (type == "string") return string_schema(o, at);
    if (type == "integer" || type == "number") {
      bool negative = true;
      if (const json::value* m = o.if_contains("minimum")) {
        if (!m->is_number() || m->to_number<double>() != 0.0) {
          throw structured_error("json_schema: `minimum` at " + at + " is supported only as 0");
        }
        negative = false;
      }
      if (type == "integer") return std::string(negative ? "-?" : "") + std::string(integer_re);
      return number_re(negative);
    }
    if (type == "boolean") return std::string("(?:true|false)");
    if (type == "null") return std::string("null");
    if (type == "array") return array_schema(o, at);
    if (type == "object") return object_schema(o, at);
    throw structured_error("json_schema: unknown type `" + std::string(type) + "` at " + at);
  }

  piece string_schema(const json::object& o, const std::string& at) {
    if (const json::value* f = o.if_contains("format")) {
      const std::string_view name = f->is_string() ? std::string_view(f->get_string()) : std::string_view();
      static const std::string date = R"([0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01]))";
      static const std::string time = R"((?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])?)";
      if (name == "date") return "\"" + date + "\"";
      if (name == "time") return "\"" + time + "\"";
      if (name == "date-time") return "\"" + date + "T" + time + "\"";
      if (name == "uuid") return R"("[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")";
      if (name == "email") return R"("[a-zA-Z0-9._%+-]{1,64}@[a-zA-Z0-9-]{1,63}(?:\.[a-zA-Z0-9-]{1,63}){0,4}\.[a-zA-Z]{2,24}")";
      throw structured_error("json_schema: string format `" + std::string(name) + "` at " + at + " is not supported");
    }
    if (const json::value* p = o.if_contains("pattern")) {
      if (!p->is_string()) throw structured_error("json_schema: `pattern` at " + at + " must be a string");
      std::string_view re = p->get_string();
      if (re.starts_with('^')) re.remove_prefix(1);
      if (re.ends_with('$') && !re.ends_with("\\$")) re.remove_suffix(1);
      (void)compile_regex(re, 4096);  // the pattern's own errors, named as such
      return "\"(?:" + std::string(re) + ")\"";
    }
    const std::int64_t lo = count(o, "minLength", 0, at), hi = count(o, "maxLength", -1, at);
    if (lo == 0 && hi < 0) return any_string();
    if (hi >= 0 && hi < lo) throw structured_error("json_schema: `maxLength` below `minLength` at " + at);
    return any_string("{" + std::to_string(lo) + "," + (hi >= 0 ? std::to_string(hi) : "") + "}");
  }

  piece array_schema(const json::object& o, const std::string& at) {
    const json::value* items = o.if_contains("items");
    piece item = items ? schema(*items, at + "/items") : piece(value_re(2));
    const std::int64_t lo = count(o, "minItems", 0, at), hi = count(o, "maxItems", -1, at);
    if (hi >= 0 && hi < lo) throw structured_error("json_schema: `maxItems` below `minItems` at " + at);
    if (!item || hi == 0) {
      if (lo > 0) return std::nullopt;
      return std::string(R"(\[\])");
    }
    std::string rest = "(?:," + std::string(sp) + *item + ")";
    const std::int64_t more_lo = std::max<std::int64_t>(lo - 1, 0);
    rest += hi < 0 ? (more_lo == 0 ? "*" : "{" + std::to_string(more_lo) + ",}")
                   : "{" + std::to_string(more_lo) + "," + std::to_string(hi - 1) + "}";
    const std::string inner = *item + rest;
    return lo == 0 ? R"(\[(?:)" + inner + R"()?\])" : R"(\[)" + inner + R"(\])";
  }

  piece object_schema(const json::object& o, const std::string& at) {
    const json::value* props = o.if_contains("properties");
    if (!props) return object_re(2);  // any object
    if (!props->is_object()) throw structured_error("json_schema: `properties` at " + at + " must be an object");
    std::set<std::string> required;
    if (const json::value* r = o.if_contains("required")) {
      if (!r->is_array()) throw structured_error("json_schema: `required` at " + at + " must be an array");
      for (const json::value& n : r->get_array()) {
        if (!n.is_string()) throw structured_error("json_schema: `required` at " + at + " must list names");
        if (!props->get_object().contains(n.get_string())) {
          throw structured_error("json_schema: required property `" + std::string(n.get_string()) + "` at " + at + " has no schema");
        }
        required.insert(std::string(n.get_string()));
      }
    }
    struct member {
      std::string re;
      bool required;
    };
    std::vector<member> members;
    for (const auto& kv : props->get_object()) {
      const bool req = required.contains(std::string(kv.key()));
      piece v = schema(kv.value(), at + "/properties/" + std::string(kv.key()));
      if (!v) {
        if (req) return std::nullopt;
        continue;
      }
      members.push_back({escape_regex(json::serialize(json::string(kv.key()))) + ":" + std::string(sp) + *v, req});
    }
    // Properties in order, the optional ones skippable: one alternative per property that can
    // come first (no required one before it), so commas only ever go between members.
    std::vector<std::string> alts;
    for (std::size_t first = 0; first < members.size(); ++first) {
      std::string alt = members[first].re;
      for (std::size_t k = first + 1; k < members.size(); ++k) {
        const std::string next = "," + std::string(sp) + members[k].re;
        alt += members[k].required ? next : "(?:" + next + ")?";
      }
      alts.push_back(alt);
      if (members[first].required) break;
    }
    const bool any_required = std::any_of(members.begin(), members.end(), [](const member& m) { return m.required; });
    if (alts.empty()) return std::string(R"(\{\})");
    const std::string body = alternatives(alts);
    return any_required ? R"(\{)" + body + R"(\})" : R"(\{(?:)" + body + R"()?\})";
  }

  piece reference(const json::value& ref, const std::string& at) {
    if (!ref.is_string()) throw structured_error("json_schema: `$ref` at " + at + " must be a string");
    const std::string_view r = ref.get_string();
    const json::value* target = nullptr;
    for (const std::string_view prefix : {"#/$defs/", "#/definitions/"}) {
      if (r.starts_with(prefix) && root_.is_object()) {
        const json::value* defs = root_.get_object().if_contains(prefix.substr(2, prefix.size() - 3));
        if (defs && defs->is_object()) target = defs->get_object().if_contains(r.substr(prefix.size()));
      }
    }
    if (r == "#") target = &root_;
    if (!target) throw structured_error("json_schema: `$ref` " + std::string(r) + " at " + at + " is not in $defs");
    const int depth = ++ref_depth_[std::string(r)];
    piece out = depth > max_ref_depth ? std::nullopt : schema(*target, std::string(r));
    --ref_depth_[std::string(r)];
    return out;
  }

  const json::value& root_;
  std::map<std::string, int> ref_depth_;
};

}  // namespace

std::string json_schema_regex(const json::value& schema) {
  compiler c(schema);
  piece p = c.schema(schema, "#");
  if (!p) throw structured_error("json_schema: the schema admits no finite value");
  return *p;
}

std::string json_schema_regex_of(std::string_view schema_json) {
  json::error_code ec;
  const json::value schema = json::parse(schema_json, ec);
  if (ec) throw structured_error("json_schema: the schema is not JSON: " + ec.message());
  return json_schema_regex(schema);
}

std::string json_object_regex(int max_depth) { return object_re(max_depth); }

std::string tool_calls_regex(std::string_view tools_json, std::string_view only_name, const tool_call_format& format,
                             bool parallel) {
  json::error_code ec;
  const json::value tools = json::parse(tools_json, ec);
  if (ec || !tools.is_array()) throw structured_error("tools: not a JSON array");
  std::vector<std::string> calls;
  for (const json::value& t : tools.get_array()) {
    const json::object* fn = t.is_object() && t.get_object().contains("function") ? t.get_object().at("function").if_object() : nullptr;
    const json::value* name = fn ? fn->if_contains("name") : nullptr;
    if (!name || !name->is_string()) throw structured_error("tools: a function without a name");
    if (!only_name.empty() && name->get_string() != only_name) continue;
    json::value params = json::object{{"type", "object"}};
    if (const json::value* p = fn->if_contains("parameters"); p && p->is_object()) params = *p;
    try {
      if (!format.args_marker.empty()) {
        calls.push_back(escape_regex(format.open) + escape_regex(name->get_string()) + escape_regex(format.args_marker) +
                        json_schema_regex(params) + escape_regex(format.close));
        continue;
      }
      json::object call{{"type", "object"},
                        {"properties", json::object{{"name", json::object{{"const", *name}}}, {format.args_key, params}}},
                        {"required", json::array{"name", json::string(format.args_key)}}};
      if (params.is_object()) {  // $defs of the parameters, where their $refs look
        for (const char* defs : {"$defs", "definitions"}) {
          if (const json::value* d = params.get_object().if_contains(defs)) call[defs] = *d;
        }
      }
      calls.push_back(escape_regex(format.open) + json_schema_regex(call) + escape_regex(format.close));
    } catch (const structured_error& e) {
      throw structured_error("tool `" + std::string(name->get_string()) + "`: " + e.what());
    }
  }
  if (calls.empty()) throw structured_error("tool_choice names no function of `tools`");
  const std::string one = alternatives(calls);
  return escape_regex(format.list_open) + (parallel ? one + "(?:" + escape_regex(format.separator) + one + ")*" : one) +
         escape_regex(format.list_close);
}

}  // namespace anvil::sampler::structured
