// A model's chat output split the way its template wrote the history: reasoning (Qwen3 and
// DeepSeek-R1 `<think>...</think>`), the answer's content, and tool calls in the family's syntax:
//   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>   (Qwen2.5, Qwen3, Hermes)
//   llama3_json  {"name": ..., "parameters": {...}} as the whole answer      (Llama 3.1 / 3.2 / 3.3)
//   mistral_json [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]      (Mistral v0.3, Nemo)
//   mistral_args [TOOL_CALLS]name[ARGS]{...} per call                      (Mistral Small 3.2, Magistral)
// Mistral's markers are control tokens: the engine keeps their text in a parsed output
// (chat_syntax::markers) so that the parser sees them.
// The syntax is read from the template source. The parser is incremental, so a stream can show
// reasoning and content as they come while holding back only what may start a marker.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <boost/json/fwd.hpp>

namespace anvil::model {

enum class tool_call_syntax { none, hermes, llama3_json, mistral_json, mistral_args };

struct chat_syntax {
  tool_call_syntax tools = tool_call_syntax::none;
  bool think_tags = false;  // the template writes reasoning as <think>...</think>

  bool mistral() const { return tools == tool_call_syntax::mistral_json || tools == tool_call_syntax::mistral_args; }
  // The marker strings the parser reads; where the vocabulary has them as control tokens (which
  // a plain output skips), an output that is parsed shows them as this text.
  std::vector<std::string_view> markers() const;
};

// What the template's source says about its outputs.
chat_syntax detect_chat_syntax(std::string_view template_source);

// True when a rendered prompt leaves the model inside a <think> block (DeepSeek-R1 distills and
// Qwen3 thinking-2507 open it in the generation prompt), so the output starts as reasoning.
bool prompt_opens_thinking(std::string_view prompt);

struct parsed_tool_call {
  std::string name;
  std::string arguments;  // a JSON object, serialised (what OpenAI's `function.arguments` holds)
};

// An id for a returned call. Mistral's templates accept only 9 letters and digits (and raise on
// anything else when the call comes back in the history); others get "call_" and 24.
std::string new_tool_call_id(const chat_syntax& syntax);

class chat_output_parser {
 public:
  // parse_tools: tools were offered (and tool_choice is not "none"); in_thinking: the prompt
  // opened a <think> block; parallel: several calls may be returned (else only the first).
  chat_output_parser(chat_syntax syntax, bool parse_tools, bool in_thinking, bool parallel = true);

  struct piece {
    std::string reasoning;
    std::string content;
  };
  // Feeds the next output text; returns what can be shown now. With `last`, that text ends the
  // output: everything held back comes out too, and tool_calls() is complete. A call that does
  // not parse stays in the content as the model wrote it.
  piece push(std::string_view text, bool last = false);
  const std::vector<parsed_tool_call>& tool_calls() const { return calls_; }

 private:
  enum class state { start, thinking, content, tool_body, json_answer, mistral_calls };
  void run(piece& out, bool final);
  bool take_call(std::string_view body);          // parses one call's JSON; false when it does not parse
  bool take_call(const boost::json::value& call);  // {"name": ..., "arguments" | "parameters": ...}
  bool take_json_calls(std::string_view text);     // one call, a JSON array of them, or ';'-separated
  bool take_mistral_calls(std::string_view text);  // what follows the first [TOOL_CALLS]
  std::string_view call_marker() const;            // what starts a call in the content

  chat_syntax syntax_;
  bool parse_tools_;
  bool parallel_;
  state state_;
  std::string pending_;
  bool content_started_ = true;  // false after </think> or a tool call: whitespace there is dropped until text comes
  std::vector<parsed_tool_call> calls_;
};

}  // namespace anvil::model
