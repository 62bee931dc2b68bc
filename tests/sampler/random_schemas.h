// Random JSON schemas of the kinds structured output supports (objects with required and
// optional properties, arrays, anyOf, enums, nullable strings, numbers), every one bounded so its
// outputs are finite, and a validator for exactly those kinds. Shared by the structured-output
// suites (sampler: automata; engine: decoding through a model).
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include <boost/json.hpp>

namespace anvil::testing {

namespace json = boost::json;


class schema_gen {
 public:
  explicit schema_gen(std::uint64_t seed) : rng_(seed) {}
  json::value schema(int depth) {
    const int kind = pick(depth > 0 ? 9 : 6);
    switch (kind) {
      case 0: return {{"type", "string"}, {"maxLength", pick(12)}};
      case 1: return {{"type", "integer"}};
      case 2: return {{"type", "number"}};
      case 3: return {{"type", "boolean"}};
      case 4: return {{"enum", json::array{"red", 3, nullptr, "x\"y"}}};
      case 5: return {{"type", json::array{"string", "null"}}, {"maxLength", 5}};
      case 6: return {{"type", "array"}, {"items", schema(depth - 1)}, {"maxItems", 1 + pick(3)}};
      case 7: return {{"anyOf", json::array{schema(depth - 1), schema(depth - 1)}}};
      default: {
        json::object props;
        json::array required;
        const int n = 1 + pick(4);
        for (int i = 0; i < n; ++i) {
          const std::string name = "p" + std::to_string(i) + (pick(3) == 0 ? "é" : "");
          props[name] = schema(depth - 1);
          if (pick(2)) required.push_back(json::string(name));
        }
        return {{"type", "object"}, {"properties", props}, {"required", required}};
      }
    }
  }
  int pick(int n) { return int(rng_() % std::uint64_t(n)); }
  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
};

// The schema's meaning, for the kinds the generator makes.
inline bool validates(const json::value& v, const json::value& s) {
  const json::object& o = s.as_object();
  if (const json::value* e = o.if_contains("enum")) {
    for (const json::value& x : e->as_array()) {
      if (x == v) return true;
    }
    return false;
  }
  if (const json::value* any = o.if_contains("anyOf")) {
    for (const json::value& x : any->as_array()) {
      if (validates(v, x)) return true;
    }
    return false;
  }
  const json::value& type = o.at("type");
  if (type.is_array()) {
    for (const json::value& t : type.as_array()) {
      json::object one = o;
      one["type"] = t;
      if (validates(v, one)) return true;
    }
    return false;
  }
  const std::string_view t = type.as_string();
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_bool();
  if (t == "integer") return v.is_int64() || v.is_uint64();
  if (t == "number") return v.is_number();
  if (t == "string") {
    if (!v.is_string()) return false;
    std::size_t chars = 0;  // code points
    for (const char c : v.as_string()) chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    return !o.contains("maxLength") || chars <= std::size_t(o.at("maxLength").as_int64());
  }
  if (t == "array") {
    if (!v.is_array() || v.as_array().size() > std::size_t(o.at("maxItems").as_int64())) return false;
    for (const json::value& x : v.as_array()) {
      if (!validates(x, o.at("items"))) return false;
    }
    return true;
  }
  if (!v.is_object()) return false;
  const json::object& props = o.at("properties").as_object();
  for (const json::value& r : o.at("required").as_array()) {
    if (!v.as_object().contains(r.as_string())) return false;
  }
  for (const auto& kv : v.as_object()) {
    if (!props.contains(kv.key()) || !validates(kv.value(), props.at(kv.key()))) return false;
  }
  return true;
}

}  // namespace anvil::testing
