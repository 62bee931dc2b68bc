// What a template can call and apply: operators, attribute and item access, the methods of str,
// dict and list, jinja2's filters and tests, and the globals transformers provides. Each behaves
// as it does under transformers' ImmutableSandboxedEnvironment (lists and dicts cannot be
// mutated); anything else is a template_error naming it.
#pragma once

#include <ctime>
#include <string>
#include <string_view>
#include <vector>

#include "model/chat/jinja/value.h"

namespace anvil::model::jinja {

// obj.name: a dict's methods (items, keys, values, get) before its keys, a string's methods, a
// namespace's attributes; Undefined when there is none. Throws when obj is Undefined.
value get_attribute(const value& obj, const std::string& name);
// obj[key]: dict keys, list and string indices (negative from the end); Undefined when absent.
value get_item(const value& obj, const value& key);
// obj[start:stop:step] of a list, tuple or string.
value get_slice(const value& obj, const value& start, const value& stop, const value& step);

value binary_op(std::string_view op, const value& a, const value& b);  // + - * / // % ** ~ == ... in notin

// What `for x in v` visits: list items, dict keys, string characters; nothing for Undefined.
std::vector<value> iterate(const value& v);

value apply_filter(const std::string& name, const value& operand, call_args& args);
bool apply_test(const std::string& name, const value& operand, call_args& args);

// range, namespace, dict, raise_exception, strftime_now (formatting `now`); Undefined for others.
value global_value(std::string_view name, const std::tm& now);

// Throws UndefinedError for an Undefined value that is about to be used as more than "nothing".
void require_defined(const value& v);

}  // namespace anvil::model::jinja
