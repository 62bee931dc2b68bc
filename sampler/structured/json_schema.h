// JSON schemas as regular expressions (regex.h), so that every output the automaton allows is
// JSON that validates. Supported: `type` (object, array, string, integer, number, boolean, null,
// or a list of them), `properties` + `required` (properties in the schema's order; optional ones
// may be left out; no others are generated), `items`, `minItems`/`maxItems`, `enum`, `const`,
// `anyOf`/`oneOf`, `$ref` into `$defs`/`definitions` (recursion unrolled to a fixed depth),
// `minLength`/`maxLength`, `pattern`, `format` (date, time, date-time, uuid, email) and
// integer `minimum` >= 0. Anything that would change what validates and is not in this list
// (`not`, `allOf`, `patternProperties`, `if`, numeric bounds that cannot be written as digits,
// ...) is refused with a structured_error naming it, never ignored.
//
// Whitespace: none inside the JSON but one optional space after ':' and ','; strings are JSON
// strings of any UTF-8 (escapes included) unless the schema bounds them.
#pragma once

#include <string>
#include <string_view>

#include <boost/json/fwd.hpp>

namespace anvil::sampler::structured {

// Throws structured_error for a schema it cannot express.
std::string json_schema_regex(const boost::json::value& schema);

// The same from the schema's JSON text (throws structured_error when it is not JSON).
std::string json_schema_regex_of(std::string_view schema_json);

// Tool calls as a model writes them (tool_choice "required" or a named function): one call, or
// with `parallel` several joined by `separator`, all between `list_open` and `list_close`; each
// call is `open` + {"name": ..., "<args_key>": ...} + `close`, or, where `args_marker` is set,
// `open` + name + args_marker + the arguments + `close` (Mistral's [TOOL_CALLS]name[ARGS]{...}).
// The arguments are valid against that tool's `parameters` (any object when it has none).
// tools_json is the request's OpenAI `tools` array; only_name, when not empty, keeps that one.
// Throws structured_error when a parameters schema cannot be expressed or the name is unknown.
struct tool_call_format {
  std::string_view open{};         // "<tool_call>\n" (Hermes/Qwen), "" (Llama 3 JSON), "[TOOL_CALLS]" (Mistral)
  std::string_view close{};        // "\n</tool_call>" or ""
  std::string_view args_key{};     // "arguments" or "parameters"
  std::string_view separator = "\n";
  std::string_view list_open{};    // "[TOOL_CALLS][" (Mistral's JSON list)
  std::string_view list_close{};   // "]"
  std::string_view args_marker{};  // "[ARGS]": the name written bare before it, the arguments after
};
std::string tool_calls_regex(std::string_view tools_json, std::string_view only_name, const tool_call_format& format,
                             bool parallel);

// Any JSON object (response_format json_object), nested at most `max_depth` levels.
std::string json_object_regex(int max_depth = 3);

}  // namespace anvil::sampler::structured
