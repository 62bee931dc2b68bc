// A model's chat output split the way its template wrote the history: reasoning (Qwen3 and
// DeepSeek-R1 `<think>...</think>`), the answer's content, and tool calls in the family's syntax:
//   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>   (Qwen2.5, Qwen3, Hermes)
//   llama3_json  {"name": ..., "parameters": {...}} as the whole answer      (Llama 3.1 / 3.2 / 3.3)
//   mistral_json [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]      (Mistral v0.3, Nemo)
//   mistral_args [TOOL_CALLS]name[ARGS]{...} per call                      (Mistral Small 3.2, Magistral)
//   harmony      messages with channels, reasoning included                 (gpt-oss)
// Mistral's and harmony's markers are control tokens: the engine keeps their text in a parsed
// output (chat_syntax::markers) so that the parser sees them.
//
// Harmony (OpenAI's format for gpt-oss): the output is a series of messages
//   <|start|>HEADER<|message|>BODY<|end|>      (the prompt ends "<|start|>assistant", so the first
//                                              message starts inside its header, after the role)
// HEADER is the role (`assistant`), then `<|channel|>CHANNEL`, optionally a content type (`json`
// or `<|constrain|>json`), with the recipient `to=RECIPIENT` in the role part or the channel part:
//   <|channel|>analysis<|message|>...<|end|>                              -> reasoning
//   <|start|>assistant<|channel|>final<|message|>...<|return|>            -> content
//   <|start|>assistant<|channel|>commentary<|message|>...<|end|>          -> content (a preamble)
//   <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
//   <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>
//                                                                         -> a tool call NAME
// A body ends at <|end|>, <|return|> or <|call|> (or where <|start|> or <|channel|> begins another
// message); <|return|> and <|call|> end the generation, so what follows them is dropped. A message
// the parser does not take apart (a call when tools are not parsed or whose body is not a JSON
// object, another recipient such as a built-in `python` or `browser.*`, an unknown channel or
// role, a header cut short or broken) is kept as the model wrote it, header and markers
// included: reasoning when its channel is analysis, content otherwise. Text outside any message
// is content.
//
// The syntax is read from the template source. The parser is incremental, so a stream can show
// reasoning and content as they come while holding back only what may start a marker (in
// harmony, a message's header until its <|message|>).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <boost/json/fwd.hpp>

namespace anvil::model {

enum class tool_call_syntax { none, hermes, llama3_json, mistral_json, mistral_args, harmony };

struct chat_syntax {
  tool_call_syntax tools = tool_call_syntax::none;
  bool think_tags = false;  // the template writes reasoning as <think>...</think>

  bool mistral() const { return tools == tool_call_syntax::mistral_json || tools == tool_call_syntax::mistral_args; }
  bool harmony() const { return tools == tool_call_syntax::harmony; }
  // Whether outputs carry reasoning to split off even when no tools are offered (a chat's output
  // then needs the parser whatever the request).
  bool reasoning() const { return think_tags || harmony(); }
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
  // opened a <think> block (harmony ignores it: its channels say); parallel: several calls may be
  // returned (else only the first).
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
  // Harmony's: between messages, in text outside any, in a message's header, in its body, and
  // after <|return|> or <|call|>.
  enum class h_state { between, loose, header, body, done };
  enum class goes_to { reasoning, content, call };  // where a harmony body goes
  void run(piece& out, bool final);
  // One harmony step each; false when it needs more text (or, with `final`, is done).
  bool harmony_between(bool final);
  bool harmony_loose(piece& out, bool final);
  bool harmony_header(piece& out, bool final);
  bool harmony_body(piece& out, bool final);
  void open_body(piece& out, std::string_view header);  // the header read: where the body goes
  void close_call(piece& out);                           // the call's body whole: a call, or the text as written
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
  h_state h_state_ = h_state::between;
  // Harmony: the current message as written up to its body ("<|start|>" when it had one, the
  // header, "<|message|>"), kept to show it when it is not taken apart.
  std::string head_;
  goes_to body_ = goes_to::content;
  goes_to fallback_ = goes_to::content;  // where head_ and a call's body go when the call does not parse
  std::string call_name_, call_body_;
  bool message_seen_ = false;  // whitespace between messages is dropped, before the first kept
};

}  // namespace anvil::model
