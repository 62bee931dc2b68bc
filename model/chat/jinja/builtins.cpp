#include "model/chat/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "model/chat/jinja/py_string.h"

namespace anvil::model::jinja {
namespace {

[[noreturn]] void type_error(const std::string& what) { throw template_error{"TypeError: " + what}; }

// The largest string (bytes) or list (items) an operation may build: a template's values are
// prompt-sized, and a hostile one must not take the server's memory.
constexpr std::size_t max_value_size = std::size_t(16) << 20;

void check_size(std::size_t n) {
  if (n > max_value_size) throw template_error{"MemoryError: a value of more than 16 MiB"};
}

// The bytes a value holds without following shared containers: a string's, or a list's strings.
std::size_t shallow_size(const value& v) {
  if (v.is_string()) return v.str().size();
  if (!v.is_list()) return 1;
  std::size_t n = 0;
  for (const value& x : v.as_list().items) n += 1 + (x.is_string() ? x.str().size() : 0);
  return n;
}

// s.replace(from, to, count) when its result stays within max_value_size.
std::string checked_replace(const std::string& s, const std::string& from, const std::string& to, std::int64_t count) {
  const std::uint64_t hits = std::uint64_t(from.empty() ? py::length(s) + 1 : py::count(s, from));
  const std::uint64_t n = count < 0 ? hits : std::min<std::uint64_t>(hits, std::uint64_t(count));
  if (to.size() > from.size() && n > 0 && (to.size() - from.size()) > (max_value_size - std::min(s.size(), max_value_size)) / n) {
    check_size(max_value_size + 1);
  }
  return py::replace(s, from, to, count);
}

std::string quoted_type(const value& v) { return "'" + std::string(v.type_name()) + "'"; }

// Positional-or-keyword arguments of a builtin, Python style.
struct args_of {
  call_args& a;
  std::string_view fn;

  const value* get(std::size_t pos, std::string_view name) const {
    if (pos < a.positional.size()) return &a.positional[pos];
    for (const auto& [k, v] : a.keywords) {
      if (k == name) return &v;
    }
    return nullptr;
  }
  value or_default(std::size_t pos, std::string_view name, value dflt) const {
    const value* v = get(pos, name);
    return v ? *v : std::move(dflt);
  }
  const value& need(std::size_t pos, std::string_view name) const {
    const value* v = get(pos, name);
    if (!v) type_error(std::string(fn) + "() missing required argument '" + std::string(name) + "'");
    return *v;
  }
  std::string string(std::size_t pos, std::string_view name) const {
    const value& v = need(pos, name);
    if (!v.is_string()) type_error(std::string(fn) + "() argument '" + std::string(name) + "' must be str, not " + std::string(v.type_name()));
    return v.str();
  }
  std::optional<std::string> opt_string(std::size_t pos, std::string_view name) const {
    const value* v = get(pos, name);
    if (!v || v->is_none()) return std::nullopt;
    if (!v->is_string()) type_error(std::string(fn) + "() argument '" + std::string(name) + "' must be str or None");
    return v->str();
  }
  std::int64_t integer(std::size_t pos, std::string_view name, std::int64_t dflt) const {
    const value* v = get(pos, name);
    if (!v || v->is_none()) return dflt;
    if (v->is_int()) return std::get<std::int64_t>(v->v);
    if (v->is_bool()) return std::get<bool>(v->v);
    type_error(std::string(fn) + "() argument '" + std::string(name) + "' must be an integer");
  }
  bool boolean(std::size_t pos, std::string_view name, bool dflt) const {
    const value* v = get(pos, name);
    return v ? v->truthy() : dflt;
  }
};

std::int64_t as_int(const value& v) {
  if (v.is_bool()) return std::get<bool>(v.v);
  return std::get<std::int64_t>(v.v);
}

value list_of_strings(const std::vector<std::string>& parts) {
  std::vector<value> items;
  items.reserve(parts.size());
  for (const auto& p : parts) items.emplace_back(p);
  return value::list(std::move(items));
}

// A bound method: `fn` is called with the object and the call's arguments.
value method(const value& self, std::string name, value (*fn)(const value&, args_of&)) {
  return value::function(name, [self, name, fn](call_args& a) {
    args_of args{a, name};
    return fn(self, args);
  });
}

bool starts_or_ends(const value& self, args_of& a, bool ends) {
  const value& what = a.need(0, "prefix");
  const std::string& s = self.str();
  const auto one = [&](const value& p) {
    if (!p.is_string()) type_error("startswith/endswith takes a str or a tuple of str");
    const std::string& x = p.str();
    return ends ? s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0 : s.rfind(x, 0) == 0;
  };
  if (what.is_list()) {
    return std::any_of(what.as_list().items.begin(), what.as_list().items.end(), one);
  }
  return one(what);
}

template <class Pred>
bool all_chars(const std::string& s, Pred p) {
  const std::u32string u = py::decode(s);
  return !u.empty() && std::all_of(u.begin(), u.end(), p);
}

value string_method(const value& self, const std::string& name) {
  using A = args_of;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    if (name == "strip") return method(self, name, [](const value& s, A& a) { return value(py::strip(s.str(), a.opt_string(0, "chars"), true, true)); });
    if (name == "lstrip") return method(self, name, [](const value& s, A& a) { return value(py::strip(s.str(), a.opt_string(0, "chars"), true, false)); });
    return method(self, name, [](const value& s, A& a) { return value(py::strip(s.str(), a.opt_string(0, "chars"), false, true)); });
  }
  if (name == "split") {
    return method(self, name, [](const value& s, A& a) {
      return list_of_strings(py::split(s.str(), a.opt_string(0, "sep"), a.integer(1, "maxsplit", -1)));
    });
  }
  if (name == "rsplit") {
    return method(self, name, [](const value& s, A& a) {
      return list_of_strings(py::split(s.str(), a.opt_string(0, "sep"), a.integer(1, "maxsplit", -1), true));
    });
  }
  if (name == "splitlines") {
    return method(self, name, [](const value& s, A& a) { return list_of_strings(py::splitlines(s.str(), a.boolean(0, "keepends", false))); });
  }
  if (name == "startswith") return method(self, name, [](const value& s, A& a) { return value(starts_or_ends(s, a, false)); });
  if (name == "endswith") return method(self, name, [](const value& s, A& a) { return value(starts_or_ends(s, a, true)); });
  if (name == "replace") {
    return method(self, name, [](const value& s, A& a) {
      return value(checked_replace(s.str(), a.string(0, "old"), a.string(1, "new"), a.integer(2, "count", -1)));
    });
  }
  if (name == "upper") return method(self, name, [](const value& s, A&) { return value(py::upper(s.str())); });
  if (name == "lower") return method(self, name, [](const value& s, A&) { return value(py::lower(s.str())); });
  if (name == "title") return method(self, name, [](const value& s, A&) { return value(py::title(s.str())); });
  if (name == "capitalize") return method(self, name, [](const value& s, A&) { return value(py::capitalize(s.str())); });
  if (name == "find") return method(self, name, [](const value& s, A& a) { return value(py::find(s.str(), a.string(0, "sub"), false)); });
  if (name == "rfind") return method(self, name, [](const value& s, A& a) { return value(py::find(s.str(), a.string(0, "sub"), true)); });
  if (name == "index" || name == "rindex") {
    if (name == "index") {
      return method(self, name, [](const value& s, A& a) {
        const auto i = py::find(s.str(), a.string(0, "sub"), false);
        if (i < 0) throw template_error{"ValueError: substring not found"};
        return value(i);
      });
    }
    return method(self, name, [](const value& s, A& a) {
      const auto i = py::find(s.str(), a.string(0, "sub"), true);
      if (i < 0) throw template_error{"ValueError: substring not found"};
      return value(i);
    });
  }
  if (name == "count") return method(self, name, [](const value& s, A& a) { return value(py::count(s.str(), a.string(0, "sub"))); });
  if (name == "join") {
    return method(self, name, [](const value& s, A& a) {
      std::string out;
      bool first = true;
      for (const value& v : iterate(a.need(0, "iterable"))) {
        if (!v.is_string()) type_error("sequence item: expected str instance, " + std::string(v.type_name()) + " found");
        if (!first) out += s.str();
        out += v.str();
        check_size(out.size());
        first = false;
      }
      return value(std::move(out));
    });
  }
  if (name == "isdigit") return method(self, name, [](const value& s, A&) { return value(all_chars(s.str(), [](char32_t c) { return c >= '0' && c <= '9'; })); });
  if (name == "isspace") return method(self, name, [](const value& s, A&) { return value(all_chars(s.str(), py::is_space)); });
  if (name == "isalpha") {
    return method(self, name, [](const value& s, A&) {
      return value(all_chars(s.str(), [](char32_t c) { return (c | 32) >= 'a' && (c | 32) <= 'z'; }));
    });
  }
  if (name == "isalnum") {
    return method(self, name, [](const value& s, A&) {
      return value(all_chars(s.str(), [](char32_t c) { return ((c | 32) >= 'a' && (c | 32) <= 'z') || (c >= '0' && c <= '9'); }));
    });
  }
  if (name == "islower") return method(self, name, [](const value& s, A&) { return value(py::lower(s.str()) == s.str() && py::upper(s.str()) != s.str()); });
  if (name == "isupper") return method(self, name, [](const value& s, A&) { return value(py::upper(s.str()) == s.str() && py::lower(s.str()) != s.str()); });
  if (name == "format") {
    return method(self, name, [](const value& s, A& a) {  // "{}" and "{0}" placeholders
      std::string out;
      const std::string& f = s.str();
      std::size_t next = 0;
      for (std::size_t i = 0; i < f.size(); ++i) {
        if (f[i] == '{' && i + 1 < f.size() && f[i + 1] == '{') {
          out += '{';
          ++i;
        } else if (f[i] == '}' && i + 1 < f.size() && f[i + 1] == '}') {
          out += '}';
          ++i;
        } else if (f[i] == '{') {
          const std::size_t close = f.find('}', i);
          if (close == std::string::npos) throw template_error{"ValueError: Single '{' encountered in format string"};
          const std::string field = f.substr(i + 1, close - i - 1);
          const value* v = field.empty() ? a.get(next++, "") : field.find_first_not_of("0123456789") == std::string::npos
                                                                     ? a.get(std::stoul(field), "")
                                                                     : a.get(std::size_t(-1), field);
          if (!v) throw template_error{"IndexError: format field '" + field + "' has no argument"};
          out += to_str(*v);
          i = close;
        } else {
          out += f[i];
        }
      }
      return value(std::move(out));
    });
  }
  return value(undefined{"'str object' has no attribute '" + name + "'"});
}

value dict_method(const value& self, const std::string& name) {
  using A = args_of;
  if (name == "items") {
    return method(self, name, [](const value& d, A&) {
      std::vector<value> items;
      for (const auto& [k, v] : d.as_dict().items) items.push_back(value::list({value(k), v}, true));
      return value::list(std::move(items));
    });
  }
  if (name == "keys") {
    return method(self, name, [](const value& d, A&) {
      std::vector<value> items;
      for (const auto& kv : d.as_dict().items) items.emplace_back(kv.first);
      return value::list(std::move(items));
    });
  }
  if (name == "values") {
    return method(self, name, [](const value& d, A&) {
      std::vector<value> items;
      for (const auto& kv : d.as_dict().items) items.push_back(kv.second);
      return value::list(std::move(items));
    });
  }
  if (name == "get") {
    return method(self, name, [](const value& d, A& a) {
      const value& key = a.need(0, "key");
      const value* v = key.is_string() ? d.as_dict().find(key.str()) : nullptr;
      return v ? *v : a.or_default(1, "default", value(nullptr));
    });
  }
  return value(undefined{});
}

value list_method(const value& self, const std::string& name) {
  if (name == "index") {
    return method(self, name, [](const value& l, args_of& a) {
      const value& x = a.need(0, "value");
      const auto& items = l.as_list().items;
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (equal(items[i], x)) return value(std::int64_t(i));
      }
      throw template_error{"ValueError: " + to_repr(x) + " is not in list"};
    });
  }
  if (name == "count") {
    return method(self, name, [](const value& l, args_of& a) {
      const value& x = a.need(0, "value");
      const auto& items = l.as_list().items;
      return value(std::int64_t(std::count_if(items.begin(), items.end(), [&](const value& v) { return equal(v, x); })));
    });
  }
  static constexpr std::string_view mutators[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};
  if (std::find(std::begin(mutators), std::end(mutators), name) != std::end(mutators)) {
    return value::function(name, [name](call_args&) -> value {
      throw template_error{"SecurityError: access to attribute '" + name + "' of 'list' object is unsafe."};
    });
  }
  return value(undefined{"'list object' has no attribute '" + name + "'"});
}

// "a.b.0": attribute, then item, per dot; what `map(attribute=...)` and friends look up.
value attribute_path(const value& obj, const value& path) {
  if (path.is_int()) return get_item(obj, path);
  value cur = obj;
  for (const std::string& part : py::split(to_str(path), std::string("."), -1)) {
    const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    cur = digits ? get_item(cur, value(std::int64_t(std::stoll(part)))) : get_item(cur, value(part));
  }
  return cur;
}

value number_of(const value& v, bool want_float, const value& dflt) {
  if (v.is_int() || v.is_bool()) return want_float ? value(v.as_double()) : value(as_int(v));
  if (v.is_float()) return want_float ? v : value(std::int64_t(std::trunc(v.as_double())));
  if (v.is_string()) {
    const std::string s = py::strip(v.str(), std::nullopt, true, true);
    try {
      std::size_t used = 0;
      if (!want_float) {
        const long long i = std::stoll(s, &used);
        if (used == s.size()) return value(std::int64_t(i));
      }
      const double d = std::stod(s, &used);
      if (used == s.size()) return want_float ? value(d) : value(std::int64_t(std::trunc(d)));
    } catch (const std::exception&) {
    }
  }
  return dflt;
}

// The key a sort/min/max compares by: the attribute if given, lower-cased strings unless
// case-sensitive (jinja2's defaults).
value sort_key(const value& v, const value* attribute, bool case_sensitive) {
  value k = attribute ? attribute_path(v, *attribute) : v;
  if (!case_sensitive && k.is_string()) return value(py::lower(k.str()));
  return k;
}

std::vector<value> select_items(const value& seq, args_of& a, bool by_attribute, bool keep_if) {
  std::vector<value> out;
  std::size_t next = 0;
  const value* attr = by_attribute ? &a.need(next++, "attribute") : nullptr;
  const value* test = a.get(next++, "test");
  call_args rest;
  for (std::size_t i = next; i < a.a.positional.size(); ++i) rest.positional.push_back(a.a.positional[i]);
  for (const value& item : iterate(seq)) {
    const value subject = attr ? attribute_path(item, *attr) : item;
    bool pass = subject.truthy();
    if (test) {
      call_args copy = rest;
      pass = apply_test(to_str(*test), subject, copy);
    }
    if (pass == keep_if) out.push_back(item);
  }
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

void require_defined(const value& v) {
  if (!v.is_undefined()) return;
  const std::string& hint = std::get<undefined>(v.v).hint;
  throw template_error{"UndefinedError: " + (hint.empty() ? std::string("a value is undefined") : hint)};
}

value get_attribute(const value& obj, const std::string& name) {
  require_defined(obj);
  if (obj.is_dict()) {
    const dict_value& d = obj.as_dict();
    if (!d.is_namespace) {
      value m = dict_method(obj, name);
      if (!m.is_undefined()) return m;
    }
    if (const value* v = d.find(name)) return *v;
    return value(undefined{"'dict object' has no attribute '" + name + "'"});
  }
  if (obj.is_string()) return string_method(obj, name);
  if (obj.is_list()) return list_method(obj, name);
  return value(undefined{"'" + std::string(obj.type_name()) + " object' has no attribute '" + name + "'"});
}

value get_item(const value& obj, const value& key) {
  require_defined(obj);
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const value* v = obj.as_dict().find(key.str())) return *v;
      if (!obj.as_dict().is_namespace) {
        value m = dict_method(obj, key.str());
        if (!m.is_undefined()) return m;
      }
    }
    return value(undefined{"'dict object' has no attribute " + to_repr(key)});
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    const std::int64_t n = obj.is_list() ? std::int64_t(obj.as_list().items.size()) : std::int64_t(py::length(obj.str()));
    std::int64_t i = as_int(key);
    if (i < 0) i += n;
    if (i < 0 || i >= n) return value(undefined{std::string(obj.type_name()) + " index out of range"});
    if (obj.is_list()) return obj.as_list().items[std::size_t(i)];
    return value(py::slice(obj.str(), i, i + 1, 1));
  }
  if (key.is_string()) return get_attribute(obj, key.str());
  return value(undefined{"'" + std::string(obj.type_name()) + " object' has no item " + to_repr(key)});
}

value get_slice(const value& obj, const value& start, const value& stop, const value& step) {
  require_defined(obj);
  const auto part = [](const value& v) -> std::optional<std::int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) type_error("slice indices must be integers or None");
    return as_int(v);
  };
  if (obj.is_string()) return value(py::slice(obj.str(), part(start), part(stop), part(step)));
  if (!obj.is_list()) type_error(quoted_type(obj) + " object is not subscriptable");
  const list_value& l = obj.as_list();
  std::vector<value> out;
  for (const std::size_t i : py::slice_indices(l.items.size(), part(start), part(stop), part(step))) out.push_back(l.items[i]);
  return value::list(std::move(out), l.tuple);
}

std::vector<value> iterate(const value& v) {
  if (v.is_undefined()) return {};
  if (v.is_list()) return v.as_list().items;
  if (v.is_dict()) {
    std::vector<value> keys;
    for (const auto& kv : v.as_dict().items) keys.emplace_back(kv.first);
    return keys;
  }
  if (v.is_string()) {
    std::vector<value> chars;
    for (const char32_t c : py::decode(v.str())) chars.emplace_back(py::encode(std::u32string(1, c)));
    return chars;
  }
  type_error(quoted_type(v) + " object is not iterable");
}

value binary_op(std::string_view op, const value& a, const value& b) {
  if (op == "==") return value(equal(a, b));
  if (op == "!=") return value(!equal(a, b));
  if (op == "~") {
    std::string l = to_str(a), r = to_str(b);
    check_size(l.size() + r.size());
    return value(l + r);
  }
  if (op == "in" || op == "notin") {
    require_defined(b);
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string()) type_error("'in <string>' requires string as left operand, not " + std::string(a.type_name()));
      found = b.str().find(a.str()) != std::string::npos;
    } else if (b.is_dict()) {
      found = a.is_string() && b.as_dict().find(a.str()) != nullptr;
    } else if (b.is_list()) {
      const auto& items = b.as_list().items;
      found = std::any_of(items.begin(), items.end(), [&](const value& x) { return equal(x, a); });
    } else {
      type_error("argument of type " + quoted_type(b) + " is not iterable");
    }
    return value(op == "in" ? found : !found);
  }
  if (op == "<") return value(less(a, b));
  if (op == ">") return value(less(b, a));
  if (op == "<=") return value(!less(b, a));
  if (op == ">=") return value(!less(a, b));
  require_defined(a);
  require_defined(b);
  const auto unsupported = [&]() -> value {
    type_error("unsupported operand type(s) for " + std::string(op) + ": " + quoted_type(a) + " and " + quoted_type(b));
  };
  if (a.is_number() && b.is_number()) {
    const bool ints = !a.is_float() && !b.is_float();
    if (op == "+") return ints ? value(as_int(a) + as_int(b)) : value(a.as_double() + b.as_double());
    if (op == "-") return ints ? value(as_int(a) - as_int(b)) : value(a.as_double() - b.as_double());
    if (op == "*") return ints ? value(as_int(a) * as_int(b)) : value(a.as_double() * b.as_double());
    if (op == "/") {
      if (b.as_double() == 0) throw template_error{"ZeroDivisionError: division by zero"};
      return value(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
      if (b.as_double() == 0) throw template_error{"ZeroDivisionError: integer division or modulo by zero"};
      if (ints) {
        const std::int64_t x = as_int(a), y = as_int(b);
        std::int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          --q;
          r += y;
        }
        return op == "//" ? value(q) : value(r);
      }
      const double x = a.as_double(), y = b.as_double();
      const double q = std::floor(x / y);
      return op == "//" ? value(q) : value(x - q * y);
    }
    if (op == "**") {
      if (ints && as_int(b) >= 0) {
        std::int64_t r = 1;
        for (std::int64_t i = 0; i < std::min<std::int64_t>(as_int(b), 64); ++i) r *= as_int(a);
        return value(r);
      }
      return value(std::pow(a.as_double(), b.as_double()));
    }
    return unsupported();
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      check_size(a.str().size() + b.str().size());
      return value(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && a.as_list().tuple == b.as_list().tuple) {
      check_size(shallow_size(a) + shallow_size(b));
      std::vector<value> items = a.as_list().items;
      items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
      return value::list(std::move(items), a.as_list().tuple);
    }
    if (a.is_string() || b.is_string()) type_error("can only concatenate str (not " + quoted_type(a.is_string() ? b : a) + ") to str");
  }
  if (op == "*" && (a.is_int() || b.is_int()) && (a.is_string() || b.is_string() || a.is_list() || b.is_list())) {
    const value& seq = a.is_int() ? b : a;
    const std::int64_t n = std::max<std::int64_t>(0, as_int(a.is_int() ? a : b));
    const std::size_t unit = shallow_size(seq);
    if (unit > 0 && std::uint64_t(n) > max_value_size / unit) check_size(max_value_size + 1);
    if (seq.is_string()) {
      std::string out;
      for (std::int64_t i = 0; i < n; ++i) out += seq.str();
      return value(std::move(out));
    }
    std::vector<value> items;
    for (std::int64_t i = 0; i < n; ++i) items.insert(items.end(), seq.as_list().items.begin(), seq.as_list().items.end());
    return value::list(std::move(items), seq.as_list().tuple);
  }
  return unsupported();
}

value apply_filter(const std::string& name, const value& x, call_args& ca) {
  args_of a{ca, name};
  if (name == "default" || name == "d") {
    const bool boolean = a.boolean(1, "boolean", false);
    if (x.is_undefined() || (boolean && !x.truthy())) return a.or_default(0, "default_value", value(""));
    return x;
  }
  if (name == "length" || name == "count") {
    if (x.is_undefined()) return value(std::int64_t(0));
    if (x.is_string()) return value(std::int64_t(py::length(x.str())));
    if (x.is_list()) return value(std::int64_t(x.as_list().items.size()));
    if (x.is_dict()) return value(std::int64_t(x.as_dict().items.size()));
    type_error("object of type " + quoted_type(x) + " has no len()");
  }
  if (name == "tojson") {
    const value indent = a.or_default(0, "indent", value(nullptr));
    std::string indent_text;
    if (indent.is_int()) indent_text = std::string(std::size_t(std::clamp<std::int64_t>(as_int(indent), 0, 64)), ' ');
    if (indent.is_string()) indent_text = indent.str();
    return value(to_json(x, indent.is_none() ? nullptr : &indent_text, a.boolean(99, "sort_keys", false)));
  }
  if (name == "safe" || name == "string") return name == "safe" ? x : value(to_str(x));
  if (name == "e" || name == "escape" || name == "forceescape") return value(html_escape(to_str(x)));
  if (name == "list") return value::list(iterate(x));
  if (name == "items") {
    if (x.is_undefined()) return value::list();
    if (!x.is_dict()) type_error("can only get item pairs from a mapping");
    call_args none;
    return get_attribute(x, "items").as_callable().call(none);
  }
  if (name == "first" || name == "last") {
    std::vector<value> items = iterate(x);
    if (items.empty()) return value(undefined{"No " + name + " item, sequence was empty."});
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    const std::string sep = a.get(0, "d") ? to_str(*a.get(0, "d")) : "";
    const value* attr = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const value& v : iterate(x)) {
      if (!first) out += sep;
      out += to_str(attr ? attribute_path(v, *attr) : v);
      check_size(out.size());
      first = false;
    }
    return value(std::move(out));
  }
  if (name == "map") {
    std::vector<value> out;
    const value* attr = a.get(99, "attribute");
    for (const value& v : iterate(x)) {
      if (attr) {
        value got = attribute_path(v, *attr);
        if (got.is_undefined() && a.get(99, "default")) got = *a.get(99, "default");
        out.push_back(std::move(got));
      } else {
        call_args rest;
        for (std::size_t i = 1; i < ca.positional.size(); ++i) rest.positional.push_back(ca.positional[i]);
        out.push_back(apply_filter(a.string(0, "filter"), v, rest));
      }
    }
    return value::list(std::move(out));
  }
  if (name == "select") return value::list(select_items(x, a, false, true));
  if (name == "reject") return value::list(select_items(x, a, false, false));
  if (name == "selectattr") return value::list(select_items(x, a, true, true));
  if (name == "rejectattr") return value::list(select_items(x, a, true, false));
  if (name == "trim") {
    require_defined(x);
    return value(py::strip(to_str(x), a.opt_string(0, "chars"), true, true));
  }
  if (name == "upper") return value(py::upper(to_str(x)));
  if (name == "lower") return value(py::lower(to_str(x)));
  if (name == "capitalize") return value(py::capitalize(to_str(x)));
  if (name == "title") return value(py::title(to_str(x)));
  if (name == "replace") {
    return value(checked_replace(to_str(x), to_str(a.need(0, "old")), to_str(a.need(1, "new")), a.integer(2, "count", -1)));
  }
  if (name == "int") return number_of(x, false, a.or_default(0, "default", value(std::int64_t(0))));
  if (name == "float") return number_of(x, true, a.or_default(0, "default", value(0.0)));
  if (name == "abs") {
    if (x.is_int()) return value(std::int64_t(std::llabs(as_int(x))));
    if (x.is_number()) return value(std::fabs(x.as_double()));
    type_error("bad operand type for abs(): " + quoted_type(x));
  }
  if (name == "round") {
    if (!x.is_number()) type_error("round() needs a number");
    const double scale = std::pow(10.0, double(a.integer(0, "precision", 0)));
    const std::string method_name = a.get(1, "method") ? to_str(*a.get(1, "method")) : "common";
    const double v = x.as_double() * scale;
    const double r = method_name == "floor" ? std::floor(v) : method_name == "ceil" ? std::ceil(v) : std::round(v);
    return value(r / scale);
  }
  if (name == "reverse") {
    if (x.is_string()) return value(py::slice(x.str(), std::nullopt, std::nullopt, -1));
    std::vector<value> items = iterate(x);
    std::reverse(items.begin(), items.end());
    return value::list(std::move(items));
  }
  if (name == "sort" || name == "dictsort") {
    const bool reverse = a.boolean(name == "sort" ? 0 : 2, "reverse", false);
    const bool case_sensitive = a.boolean(1, "case_sensitive", false);
    std::vector<value> items;
    const value* attr = name == "sort" ? a.get(2, "attribute") : nullptr;
    value key_attr;
    if (name == "dictsort") {
      call_args none;
      items = apply_filter("items", x, none).as_list().items;
      const bool by_value = a.get(1, "by") && to_str(*a.get(1, "by")) == "value";
      key_attr = value(std::int64_t(by_value ? 1 : 0));
      attr = &key_attr;
    } else {
      items = iterate(x);
    }
    std::stable_sort(items.begin(), items.end(), [&](const value& l, const value& r) {
      const value kl = sort_key(l, attr, case_sensitive), kr = sort_key(r, attr, case_sensitive);
      return reverse ? less(kr, kl) : less(kl, kr);
    });
    return value::list(std::move(items));
  }
  if (name == "unique") {
    std::vector<value> out;
    const value* attr = a.get(1, "attribute");
    const bool case_sensitive = a.boolean(0, "case_sensitive", false);
    for (const value& v : iterate(x)) {
      const value k = sort_key(v, attr, case_sensitive);
      if (std::none_of(out.begin(), out.end(), [&](const value& o) { return equal(sort_key(o, attr, case_sensitive), k); })) {
        out.push_back(v);
      }
    }
    return value::list(std::move(out));
  }
  if (name == "min" || name == "max") {
    const std::vector<value> items = iterate(x);
    if (items.empty()) return value(undefined{"No aggregated item, sequence was empty."});
    const value* attr = a.get(1, "attribute");
    const bool case_sensitive = a.boolean(0, "case_sensitive", false);
    const value* best = &items[0];
    for (const value& v : items) {
      const bool better = name == "min" ? less(sort_key(v, attr, case_sensitive), sort_key(*best, attr, case_sensitive))
                                        : less(sort_key(*best, attr, case_sensitive), sort_key(v, attr, case_sensitive));
      if (better) best = &v;
    }
    return *best;
  }
  if (name == "sum") {
    const value* attr = a.get(0, "attribute");
    value total = a.or_default(1, "start", value(std::int64_t(0)));
    for (const value& v : iterate(x)) total = binary_op("+", total, attr ? attribute_path(v, *attr) : v);
    return total;
  }
  if (name == "indent") {
    const value width = a.or_default(0, "width", value(std::int64_t(4)));
    const std::string pad = width.is_string() ? width.str() : std::string(std::size_t(std::clamp<std::int64_t>(as_int(width), 0, 256)), ' ');
    const bool first = a.boolean(1, "first", false), blank = a.boolean(2, "blank", false);
    const std::vector<std::string> lines = py::splitlines(to_str(x) + "\n", false);
    std::string out;
    for (std::size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += "\n";
      if (i > 0 && (blank || !lines[i].empty())) out += pad;
      out += lines[i];
    }
    return value(first ? pad + out : out);
  }
  if (name == "wordcount") return value(std::int64_t(py::split(to_str(x), std::nullopt, -1).size()));
  if (name == "center") {
    const std::int64_t width = a.integer(0, "width", 80);
    const std::string s = to_str(x);
    const std::int64_t len = std::int64_t(py::length(s));
    if (width <= len) return value(s);
    const std::int64_t total = std::min<std::int64_t>(width - len, 4096);
    const std::int64_t left = total / 2 + (total & width & 1);
    return value(std::string(std::size_t(left), ' ') + s + std::string(std::size_t(total - left), ' '));
  }
  if (name == "attr") return get_attribute(x, a.string(0, "name"));
  if (name == "batch" || name == "slice" || name == "groupby" || name == "format" || name == "truncate" ||
      name == "wordwrap" || name == "urlencode" || name == "xmlattr" || name == "pprint" || name == "striptags") {
    throw template_error{"the filter '" + name + "' is not supported"};
  }
  throw template_error{"TemplateAssertionError: No filter named '" + name + "'."};
}

bool apply_test(const std::string& name, const value& x, call_args& ca) {
  args_of a{ca, name};
  if (name == "defined") return !x.is_undefined();
  if (name == "undefined") return x.is_undefined();
  if (name == "none") return x.is_none();
  if (name == "boolean") return x.is_bool();
  if (name == "true") return x.is_bool() && std::get<bool>(x.v);
  if (name == "false") return x.is_bool() && !std::get<bool>(x.v);
  if (name == "integer") return x.is_int();
  if (name == "float") return x.is_float();
  if (name == "number") return x.is_number();
  if (name == "string") return x.is_string();
  if (name == "mapping") return x.is_dict() && !x.as_dict().is_namespace;
  if (name == "iterable") return x.is_list() || x.is_dict() || x.is_string() || x.is_undefined();
  if (name == "sequence") return x.is_list() || x.is_dict() || x.is_string();
  if (name == "callable") return x.is_callable();
  if (name == "sameas") {
    const value& o = a.need(0, "other");
    if (x.is_list() && o.is_list()) return &x.as_list() == &o.as_list();
    if (x.is_dict() && o.is_dict()) return &x.as_dict() == &o.as_dict();
    return x.v.index() == o.v.index() && (x.is_none() || x.is_undefined() || (x.is_bool() && equal(x, o)));
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(x, a.need(0, "other"));
  if (name == "ne" || name == "!=") return !equal(x, a.need(0, "other"));
  if (name == "lt" || name == "lessthan" || name == "<") return less(x, a.need(0, "other"));
  if (name == "gt" || name == "greaterthan" || name == ">") return less(a.need(0, "other"), x);
  if (name == "le" || name == "<=") return !less(a.need(0, "other"), x);
  if (name == "ge" || name == ">=") return !less(x, a.need(0, "other"));
  if (name == "in") return binary_op("in", x, a.need(0, "seq")).truthy();
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!x.is_int() && !x.is_bool()) type_error(name + " needs an integer");
    const std::int64_t n = as_int(x);
    if (name == "divisibleby") {
      const std::int64_t d = a.integer(0, "num", 1);
      if (d == 0) throw template_error{"ZeroDivisionError: integer division or modulo by zero"};
      return n % d == 0;
    }
    return (n % 2 != 0) == (name == "odd");
  }
  if (name == "lower") return x.is_string() && py::lower(x.str()) == x.str();
  if (name == "upper") return x.is_string() && py::upper(x.str()) == x.str();
  throw template_error{"TemplateAssertionError: No test named '" + name + "'."};
}

value global_value(std::string_view name, const std::tm& now) {
  if (name == "range") {
    return value::function("range", [](call_args& ca) {
      args_of a{ca, "range"};
      std::int64_t start = 0, stop = 0, step = 1;
      if (ca.positional.size() == 1) {
        stop = a.integer(0, "stop", 0);
      } else {
        start = a.integer(0, "start", 0);
        stop = a.integer(1, "stop", 0);
        step = a.integer(2, "step", 1);
      }
      if (step == 0) throw template_error{"ValueError: range() arg 3 must not be zero"};
      std::vector<value> items;
      for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (items.size() >= 100000) throw template_error{"OverflowError: range too big, maximum size for range is 100000"};
        items.emplace_back(i);
      }
      return value::list(std::move(items));
    });
  }
  if (name == "namespace" || name == "dict") {
    const bool ns = name == "namespace";
    return value::function(std::string(name), [ns](call_args& ca) {
      auto d = std::make_shared<dict_value>();
      d->is_namespace = ns;
      for (const value& p : ca.positional) {
        if (!p.is_dict()) type_error("namespace()/dict() takes a mapping and keyword arguments");
        for (const auto& [k, v] : p.as_dict().items) d->set(k, v);
      }
      for (const auto& [k, v] : ca.keywords) d->set(k, v);
      return value(std::move(d));
    });
  }
  if (name == "raise_exception") {
    return value::function("raise_exception", [](call_args& ca) -> value {
      throw template_error{ca.positional.empty() ? std::string("raise_exception() was called") : to_str(ca.positional[0])};
    });
  }
  if (name == "strftime_now") {
    return value::function("strftime_now", [now](call_args& ca) {
      args_of a{ca, "strftime_now"};
      const std::string format = a.string(0, "format");
      char buf[256];
      const std::size_t n = format.size() < 128 ? std::strftime(buf, sizeof buf, format.c_str(), &now) : 0;
      return value(std::string(buf, n));
    });
  }
  return value(undefined{"'" + std::string(name) + "' is undefined"});
}

}  // namespace anvil::model::jinja
