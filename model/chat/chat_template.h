// Chat templates: turn OpenAI-style messages into the prompt text a model was trained on.
// A GGUF carries its template as Jinja source (tokenizer.chat_template); anvil runs it with its
// own Jinja interpreter (jinja/template.h), with the variables transformers' apply_chat_template
// passes: messages, tools, add_generation_prompt, bos_token, eos_token, and any extra keyword
// (enable_thinking, date_string, ...). A rendering is byte for byte transformers' output for the
// same inputs (tests/data/chat/goldens.json, made by tools/chat/render_goldens.py, checks this).
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <boost/json/fwd.hpp>

namespace anvil::model {

namespace jinja {
class template_program;
}

// One message of a conversation, as the OpenAI API carries it.
struct chat_message {
  std::string role;               // "system", "user", "assistant", "tool", ... (the template decides what it accepts)
  std::string content;            // UTF-8 text (text content parts joined)
  bool content_is_null = false;   // content was null or absent (an assistant turn that only calls tools)
  std::string tool_calls_json{};  // assistant: JSON array of {id, type, function: {name, arguments}}, arguments an
                                  // object (as transformers' templates expect); "" when the message has none
  std::string tool_call_id{};     // tool: the id of the call this message answers ("" = absent)
  std::string name{};             // tool: the function's name ("" = absent)
  std::string reasoning_content{};// assistant: thinking returned apart from the content ("" = absent)
};

// What one rendering needs besides the messages.
struct chat_inputs {
  std::span<const chat_message> messages;
  bool add_generation_prompt = true;       // open the assistant's turn at the end
  std::string_view tools_json{};           // JSON array of tool definitions ("" = tools is None)
  std::string_view template_kwargs_json{}; // JSON object of extra template variables ("" = none)
};

class chat_template {
 public:
  // Parses the Jinja source; throws model_error("chat template, line N: ...") for a syntax error.
  // bos/eos are the tokenizer's BOS/EOS token strings (the template's bos_token / eos_token).
  chat_template(std::string_view template_source, std::string bos_token, std::string eos_token);
  ~chat_template();
  chat_template(chat_template&&) noexcept;
  chat_template& operator=(chat_template&&) noexcept;

  // Throws model_error("chat template, line N: ...") when the template raises (raise_exception,
  // a conversation it does not accept) or fails, or when tools / kwargs are not the JSON asked for.
  // For gpt-oss's harmony template, an assistant message as OpenAI clients send it back reaches
  // the template in the form it accepts: a null `content` is left out (the template tests it as
  // a string), and a tool-call message with both content and reasoning keeps the reasoning only
  // (the template renders one of them as the call's analysis and raises on both).
  std::string render(const chat_inputs& in) const;
  std::string render(std::span<const chat_message> messages, bool add_generation_prompt) const {
    return render(chat_inputs{.messages = messages, .add_generation_prompt = add_generation_prompt});
  }

  // The lower level: the template's variables as JSON (messages as the template will see them,
  // tools, ...); bos_token and eos_token are added unless given. For tests and tools.
  std::string render_variables(const boost::json::object& variables) const;

  // What strftime_now() reads: the local time at each rendering unless pinned (tests pin it).
  void pin_clock(const std::tm& now) { pinned_now_ = now; }

 private:
  std::unique_ptr<jinja::template_program> program_;
  // gpt-oss's harmony template (chat_output.h): its history rules differ (render()).
  bool harmony_ = false;
  std::string bos_;
  std::string eos_;
  std::optional<std::tm> pinned_now_;
};

// The message fields a template sees, as a JSON object: role and content (null when
// content_is_null), and tool_calls, tool_call_id, name, reasoning_content when present;
// reasoning_content also as `thinking`, the field gpt-oss's template reads.
// Throws model_error when tool_calls_json is not a JSON array.
boost::json::object chat_message_json(const chat_message& m);

}  // namespace anvil::model
