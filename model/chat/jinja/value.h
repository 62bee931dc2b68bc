// The values a chat template computes with, with Python's semantics where a template can see them:
// truthiness, ==, <, str() and repr(), and json.dumps as transformers' `tojson` filter calls it.
// Lists and dicts are shared (as Python objects are); the sandbox transformers renders in forbids
// mutating them, so sharing never shows, except for namespace() objects, whose attributes
// `{% set ns.x = ... %}` assigns.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <boost/json/fwd.hpp>

namespace anvil::model::jinja {

struct value;

// Jinja's Undefined: what a missing variable, key or attribute evaluates to. `hint` says what was
// missing, for the error raised when it is used as more than "nothing".
struct undefined {
  std::string hint;
};

struct list_value {
  std::vector<value> items;
  bool tuple = false;  // printed as (a, b) rather than [a, b]
  int depth = 1;       // containers nested in it, itself included (bounded: see max_nesting)
};

// A dict with string keys in insertion order (Python's dicts, and JSON objects, keep it).
struct dict_value {
  std::vector<std::pair<std::string, value>> items;
  bool is_namespace = false;  // namespace(): attributes may be assigned
  int depth = 1;              // as list_value::depth

  const value* find(std::string_view key) const;
  void set(std::string key, value v);
};

// The arguments of a call: positional, then keyword ones in the order given.
struct call_args {
  std::vector<value> positional;
  std::vector<std::pair<std::string, value>> keywords;
};

// A global function, a macro, or a method bound to its object ("a b".split).
struct callable_value {
  std::string name;
  std::function<value(call_args&)> call;
};

struct value {
  using list_ptr = std::shared_ptr<list_value>;
  using dict_ptr = std::shared_ptr<dict_value>;
  using callable_ptr = std::shared_ptr<const callable_value>;
  std::variant<undefined, std::nullptr_t, bool, std::int64_t, double, std::string, list_ptr, dict_ptr, callable_ptr> v;

  value() : v(undefined{}) {}
  value(undefined u) : v(std::move(u)) {}
  value(std::nullptr_t) : v(nullptr) {}
  value(bool b) : v(b) {}
  value(int i) : v(std::int64_t(i)) {}
  value(std::int64_t i) : v(i) {}
  value(double d) : v(d) {}
  value(std::string s) : v(std::move(s)) {}
  value(std::string_view s) : v(std::string(s)) {}
  value(const char* s) : v(std::string(s)) {}
  value(list_ptr l) : v(std::move(l)) {}
  value(dict_ptr d) : v(std::move(d)) {}
  value(callable_ptr c) : v(std::move(c)) {}

  // Containers nest at most max_nesting deep (printing, comparing and freeing them recurse);
  // building a deeper one throws template_error.
  static constexpr int max_nesting = 128;
  static value list(std::vector<value> items = {}, bool tuple = false);
  static value dict(std::vector<std::pair<std::string, value>> items = {});
  int nesting() const;  // a container's depth; 0 for anything else
  static value function(std::string name, std::function<value(call_args&)> fn);

  bool is_undefined() const { return std::holds_alternative<undefined>(v); }
  bool is_none() const { return std::holds_alternative<std::nullptr_t>(v); }
  bool is_bool() const { return std::holds_alternative<bool>(v); }
  bool is_int() const { return std::holds_alternative<std::int64_t>(v); }  // bool is not int here
  bool is_float() const { return std::holds_alternative<double>(v); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return std::holds_alternative<std::string>(v); }
  bool is_list() const { return std::holds_alternative<list_ptr>(v); }
  bool is_dict() const { return std::holds_alternative<dict_ptr>(v); }
  bool is_callable() const { return std::holds_alternative<callable_ptr>(v); }

  const std::string& str() const { return std::get<std::string>(v); }
  list_value& as_list() const { return *std::get<list_ptr>(v); }
  dict_value& as_dict() const { return *std::get<dict_ptr>(v); }
  const callable_value& as_callable() const { return *std::get<callable_ptr>(v); }
  double as_double() const;  // numbers (bool included) as a double

  // Python's bool(x); an undefined value is false.
  bool truthy() const;
  // Python's type name, for error messages: "str", "int", "list", "dict", "NoneType", ...
  std::string_view type_name() const;
};

// Thrown for every error a template makes or raises. `message` reads like Python's
// ("TypeError: ...", "UndefinedError: 'x' is undefined", or raise_exception's text); `line` is the
// template line (0 until the statement or expression that raised sets it).
struct template_error {
  std::string message;
  int line = 0;
};

// Python's ==, with Jinja's Undefined equal only to Undefined.
bool equal(const value& a, const value& b);
// Python's <; throws template_error for types Python cannot order.
bool less(const value& a, const value& b);

// str(x) as Jinja prints it ({{ x }}): undefined prints nothing, None "None", True "True",
// floats like Python's repr, containers with repr() of their items.
std::string to_str(const value& x);
// repr(x).
std::string to_repr(const value& x);
// json.dumps(x, ensure_ascii=False, indent=indent, sort_keys=sort_keys): indent < 0 means None
// (", " and ": " separators), otherwise newlines and `indent_text` per level.
std::string to_json(const value& x, const std::string* indent_text, bool sort_keys = false);
// Python's repr of a float ("1.0", "1e-05", "inf").
std::string float_repr(double d);

// JSON (a request's messages and tools) as template values, key order kept.
value from_json(const boost::json::value& j);

}  // namespace anvil::model::jinja
