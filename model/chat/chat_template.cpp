#include "model/chat/chat_template.h"

#include <boost/json.hpp>

#include "model/chat/chat_output.h"
#include "model/chat/jinja/template.h"
#include "model/model_error.h"

namespace anvil::model {
namespace {

namespace json = boost::json;

[[noreturn]] void fail(const jinja::template_error& e) {
  throw model_error("chat template" + (e.line > 0 ? ", line " + std::to_string(e.line) : std::string()) + ": " + e.message);
}

json::value parse_json(std::string_view text, std::string_view what) {
  json::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec) throw model_error(std::string(what) + " is not valid JSON: " + ec.message());
  return v;
}

}  // namespace

json::object chat_message_json(const chat_message& m) {
  json::object o;
  o["role"] = m.role;
  o["content"] = m.content_is_null ? json::value(nullptr) : json::value(m.content);
  if (!m.tool_calls_json.empty()) {
    json::value calls = parse_json(m.tool_calls_json, "tool_calls");
    if (!calls.is_array()) throw model_error("tool_calls must be a JSON array");
    o["tool_calls"] = std::move(calls);
  }
  if (!m.tool_call_id.empty()) o["tool_call_id"] = m.tool_call_id;
  if (!m.name.empty()) o["name"] = m.name;
  if (!m.reasoning_content.empty()) {
    o["reasoning_content"] = m.reasoning_content;
    o["thinking"] = m.reasoning_content;  // the name gpt-oss's template reads it by
  }
  return o;
}

chat_template::chat_template(std::string_view template_source, std::string bos_token, std::string eos_token)
    : harmony_(detect_chat_syntax(template_source).harmony()), bos_(std::move(bos_token)), eos_(std::move(eos_token)) {
  try {
    program_ = std::make_unique<jinja::template_program>(template_source);
  } catch (const jinja::template_error& e) {
    fail(e);
  }
}

chat_template::~chat_template() = default;
chat_template::chat_template(chat_template&&) noexcept = default;
chat_template& chat_template::operator=(chat_template&&) noexcept = default;

std::string chat_template::render(const chat_inputs& in) const {
  json::object vars;
  json::array messages;
  for (const chat_message& m : in.messages) {
    json::object o = chat_message_json(m);
    if (harmony_ && m.role == "assistant") {
      if (m.content_is_null) o.erase("content");
      if (!m.tool_calls_json.empty() && !m.content.empty() && o.contains("thinking")) o.erase("content");
    }
    messages.push_back(std::move(o));
  }
  if (!in.template_kwargs_json.empty()) {
    json::value kw = parse_json(in.template_kwargs_json, "chat_template_kwargs");
    if (!kw.is_object()) throw model_error("chat_template_kwargs must be a JSON object");
    for (auto& kv : kw.get_object()) vars[kv.key()] = std::move(kv.value());
  }
  // The call's own variables win over kwargs of the same name, as in apply_chat_template.
  vars["messages"] = std::move(messages);
  vars["tools"] = in.tools_json.empty() ? json::value(nullptr) : parse_json(in.tools_json, "tools");
  vars["add_generation_prompt"] = in.add_generation_prompt;
  return render_variables(vars);
}

std::string chat_template::render_variables(const json::object& variables) const {
  std::vector<std::pair<std::string, jinja::value>> vars;
  vars.reserve(variables.size() + 2);
  for (const auto& kv : variables) vars.emplace_back(std::string(kv.key()), jinja::from_json(kv.value()));
  if (!variables.contains("bos_token")) vars.emplace_back("bos_token", jinja::value(bos_));
  if (!variables.contains("eos_token")) vars.emplace_back("eos_token", jinja::value(eos_));
  std::tm now{};
  if (pinned_now_) {
    now = *pinned_now_;
  } else {
    const std::time_t t = std::time(nullptr);
    localtime_r(&t, &now);
  }
  try {
    return program_->render(vars, now);
  } catch (const jinja::template_error& e) {
    fail(e);
  }
}

}  // namespace anvil::model
