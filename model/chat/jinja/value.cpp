#include "model/chat/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <boost/json.hpp>

#include "model/chat/jinja/py_string.h"

namespace anvil::model::jinja {

const value* dict_value::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void dict_value::set(std::string key, value v) {
  // A namespace is the one mutable container: its depth grows with what it is given, and
  // nothing holding a namespace may go into one (a cycle would never be freed or printed).
  const int d = v.nesting() + 1;
  if (d > value::max_nesting) throw template_error{"RecursionError: values nest deeper than " + std::to_string(value::max_nesting)};
  depth = std::max(depth, d);
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(v));
}

namespace {
int checked_depth(int deepest_item) {
  if (deepest_item + 1 > value::max_nesting) {
    throw template_error{"RecursionError: values nest deeper than " + std::to_string(value::max_nesting)};
  }
  return deepest_item + 1;
}
}  // namespace

int value::nesting() const {
  if (is_list()) return as_list().depth;
  if (is_dict()) return as_dict().depth;
  return 0;
}

value value::list(std::vector<value> items, bool tuple) {
  int deepest = 0;
  for (const value& v : items) deepest = std::max(deepest, v.nesting());
  const int depth = checked_depth(deepest);
  return value(std::make_shared<list_value>(list_value{std::move(items), tuple, depth}));
}

value value::dict(std::vector<std::pair<std::string, value>> items) {
  int deepest = 0;
  for (const auto& kv : items) deepest = std::max(deepest, kv.second.nesting());
  const int depth = checked_depth(deepest);
  return value(std::make_shared<dict_value>(dict_value{std::move(items), false, depth}));
}

value value::function(std::string name, std::function<value(call_args&)> fn) {
  return value(std::make_shared<const callable_value>(callable_value{std::move(name), std::move(fn)}));
}

double value::as_double() const {
  if (is_bool()) return std::get<bool>(v) ? 1.0 : 0.0;
  if (is_int()) return double(std::get<std::int64_t>(v));
  return std::get<double>(v);
}

bool value::truthy() const {
  return std::visit(
      [](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, undefined> || std::is_same_v<T, std::nullptr_t>) return false;
        else if constexpr (std::is_same_v<T, bool>) return x;
        else if constexpr (std::is_same_v<T, std::int64_t>) return x != 0;
        else if constexpr (std::is_same_v<T, double>) return x != 0.0;
        else if constexpr (std::is_same_v<T, std::string>) return !x.empty();
        else if constexpr (std::is_same_v<T, list_ptr>) return !x->items.empty();
        else if constexpr (std::is_same_v<T, dict_ptr>) return x->is_namespace || !x->items.empty();
        else return true;
      },
      v);
}

std::string_view value::type_name() const {
  switch (v.index()) {
    case 0: return "Undefined";
    case 1: return "NoneType";
    case 2: return "bool";
    case 3: return "int";
    case 4: return "float";
    case 5: return "str";
    case 6: return as_list().tuple ? "tuple" : "list";
    case 7: return as_dict().is_namespace ? "Namespace" : "dict";
    default: return "function";
  }
}

bool equal(const value& a, const value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    const auto as_int = [](const value& x) { return x.is_bool() ? std::int64_t(std::get<bool>(x.v)) : std::get<std::int64_t>(x.v); };
    return as_int(a) == as_int(b);
  }
  if (a.v.index() != b.v.index()) return false;
  if (a.is_undefined() || a.is_none()) return true;
  if (a.is_string()) return a.str() == b.str();
  if (a.is_list()) {
    const list_value &x = a.as_list(), &y = b.as_list();
    if (x.tuple != y.tuple || x.items.size() != y.items.size()) return false;
    for (std::size_t i = 0; i < x.items.size(); ++i) {
      if (!equal(x.items[i], y.items[i])) return false;
    }
    return true;
  }
  if (a.is_dict()) {
    const dict_value &x = a.as_dict(), &y = b.as_dict();
    if (&x == &y) return true;
    if (x.is_namespace || y.is_namespace || x.items.size() != y.items.size()) return false;
    for (const auto& [k, v] : x.items) {
      const value* other = y.find(k);
      if (!other || !equal(v, *other)) return false;
    }
    return true;
  }
  return &a.as_callable() == &b.as_callable();
}

bool less(const value& a, const value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 byte order is code point order
  if (a.is_list() && b.is_list() && a.as_list().tuple == b.as_list().tuple) {
    const auto &x = a.as_list().items, &y = b.as_list().items;
    for (std::size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      if (!equal(x[i], y[i])) return less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  throw template_error{"TypeError: '<' not supported between instances of '" + std::string(a.type_name()) +
                       "' and '" + std::string(b.type_name()) + "'"};
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // "-1.2345e+05": the shortest digits that round-trip
  const std::size_t e = sci.find('e');
  const int exponent = std::stoi(sci.substr(e + 1));
  const bool negative = sci[0] == '-';
  std::string digits;
  for (std::size_t i = negative ? 1 : 0; i < e; ++i) {
    if (sci[i] != '.') digits += sci[i];
  }
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ex[16];
    std::snprintf(ex, sizeof ex, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + ex;
  }
  if (exponent < 0) return out + "0." + std::string(std::size_t(-exponent - 1), '0') + digits;
  const std::size_t int_digits = std::size_t(exponent) + 1;
  if (digits.size() <= int_digits) return out + digits + std::string(int_digits - digits.size(), '0') + ".0";
  return out + digits.substr(0, int_digits) + "." + digits.substr(int_digits);
}

namespace {

bool printable(char32_t c) {
  if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) || (c >= 0x205f && c <= 0x206f)) {
    return false;
  }
  return !(c == 0x3000 || c == 0xfeff || (c >= 0xfff9 && c <= 0xfffb) || (c >= 0xd800 && c <= 0xf8ff));
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::u32string out;
  out += quote;
  for (const char32_t c : py::decode(s)) {
    if (c == char32_t(quote) || c == U'\\') {
      out += U'\\';
      out += c;
    } else if (c == '\n') {
      out += U"\\n";
    } else if (c == '\r') {
      out += U"\\r";
    } else if (c == '\t') {
      out += U"\\t";
    } else if (!printable(c)) {
      char buf[16];
      std::snprintf(buf, sizeof buf, c < 0x100 ? "\\x%02x" : c < 0x10000 ? "\\u%04x" : "\\U%08x", unsigned(c));
      for (const char* p = buf; *p; ++p) out += char32_t(*p);
    } else {
      out += c;
    }
  }
  out += quote;
  return py::encode(out);
}

void json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

constexpr std::size_t max_text = std::size_t(32) << 20;  // what tojson / repr may build

void check_text(const std::string& out) {
  if (out.size() > max_text) throw template_error{"MemoryError: a text of more than 32 MiB"};
}

void json_write(std::string& out, const value& x, const std::string* indent, bool sort_keys, int level) {
  check_text(out);
  const auto newline = [&](int lvl) {
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += *indent;
  };
  if (x.is_none()) {
    out += "null";
  } else if (x.is_bool()) {
    out += std::get<bool>(x.v) ? "true" : "false";
  } else if (x.is_int()) {
    out += std::to_string(std::get<std::int64_t>(x.v));
  } else if (x.is_float()) {
    const double d = std::get<double>(x.v);
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : float_repr(d);
  } else if (x.is_string()) {
    json_string(out, x.str());
  } else if (x.is_list()) {
    const auto& items = x.as_list().items;
    if (items.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i) out += indent ? "," : ", ";
      if (indent) newline(level + 1);
      json_write(out, items[i], indent, sort_keys, level + 1);
    }
    if (indent) newline(level);
    out += ']';
  } else if (x.is_dict() && !x.as_dict().is_namespace) {
    std::vector<const std::pair<std::string, value>*> items;
    for (const auto& kv : x.as_dict().items) items.push_back(&kv);
    if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
    if (items.empty()) {
      out += "{}";
      return;
    }
    out += '{';
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i) out += indent ? "," : ", ";
      if (indent) newline(level + 1);
      json_string(out, items[i]->first);
      out += ": ";
      json_write(out, items[i]->second, indent, sort_keys, level + 1);
    }
    if (indent) newline(level);
    out += '}';
  } else {
    throw template_error{"TypeError: Object of type " + std::string(x.type_name()) + " is not JSON serializable"};
  }
}

}  // namespace

std::string to_repr(const value& x) {
  if (x.is_undefined()) return "Undefined";
  if (x.is_string()) return string_repr(x.str());
  if (x.is_list()) {
    const list_value& l = x.as_list();
    std::string out = l.tuple ? "(" : "[";
    for (std::size_t i = 0; i < l.items.size(); ++i) {
      out += (i ? ", " : "") + to_repr(l.items[i]);
      check_text(out);
    }
    if (l.tuple && l.items.size() == 1) out += ",";
    return out + (l.tuple ? ")" : "]");
  }
  if (x.is_dict()) {
    const dict_value& d = x.as_dict();
    std::string out = d.is_namespace ? "<Namespace {" : "{";
    for (std::size_t i = 0; i < d.items.size(); ++i) {
      out += (i ? ", " : "") + string_repr(d.items[i].first) + ": " + to_repr(d.items[i].second);
      check_text(out);
    }
    return out + (d.is_namespace ? "}>" : "}");
  }
  return to_str(x);
}

std::string to_str(const value& x) {
  return std::visit(
      [&](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, undefined>) return "";
        else if constexpr (std::is_same_v<T, std::nullptr_t>) return "None";
        else if constexpr (std::is_same_v<T, bool>) return v ? "True" : "False";
        else if constexpr (std::is_same_v<T, std::int64_t>) return std::to_string(v);
        else if constexpr (std::is_same_v<T, double>) return float_repr(v);
        else if constexpr (std::is_same_v<T, std::string>) return v;
        else if constexpr (std::is_same_v<T, value::callable_ptr>) return "<function " + v->name + ">";
        else return to_repr(x);
      },
      x.v);
}

std::string to_json(const value& x, const std::string* indent_text, bool sort_keys) {
  std::string out;
  json_write(out, x, indent_text, sort_keys, 0);
  return out;
}

value from_json(const boost::json::value& j) {
  switch (j.kind()) {
    case boost::json::kind::null: return value(nullptr);
    case boost::json::kind::bool_: return value(j.get_bool());
    case boost::json::kind::int64: return value(j.get_int64());
    case boost::json::kind::uint64:
      return j.get_uint64() <= std::uint64_t(INT64_MAX) ? value(std::int64_t(j.get_uint64())) : value(double(j.get_uint64()));
    case boost::json::kind::double_: return value(j.get_double());
    case boost::json::kind::string: return value(std::string(j.get_string()));
    case boost::json::kind::array: {
      std::vector<value> items;
      items.reserve(j.get_array().size());
      for (const auto& e : j.get_array()) items.push_back(from_json(e));
      return value::list(std::move(items));
    }
    case boost::json::kind::object: {
      std::vector<std::pair<std::string, value>> items;
      items.reserve(j.get_object().size());
      for (const auto& kv : j.get_object()) items.emplace_back(std::string(kv.key()), from_json(kv.value()));
      return value::dict(std::move(items));
    }
  }
  return value();
}

}  // namespace anvil::model::jinja
