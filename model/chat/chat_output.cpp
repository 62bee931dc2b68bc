#include "model/chat/chat_output.h"

#include <algorithm>

#include <boost/json.hpp>

namespace anvil::model {
namespace {

namespace json = boost::json;

constexpr std::string_view think_open = "<think>", think_close = "</think>";
constexpr std::string_view call_open = "<tool_call>", call_close = "</tool_call>";

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view lstrip(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  return s;
}

// The length of the longest tail of `s` that begins `marker` (what may be a marker cut in two).
std::size_t marker_tail(std::string_view s, std::string_view marker) {
  for (std::size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n) {
    if (marker.substr(0, n) == s.substr(s.size() - n)) return n;
  }
  return 0;
}

}  // namespace

chat_syntax detect_chat_syntax(std::string_view src) {
  chat_syntax s;
  if (src.find(call_open) != std::string_view::npos) {
    s.tools = tool_call_syntax::hermes;
  } else if (src.find("<|python_tag|>") != std::string_view::npos ||
             src.find("Given the following functions") != std::string_view::npos) {
    s.tools = tool_call_syntax::llama3_json;
  }
  s.think_tags = src.find(think_open) != std::string_view::npos && src.find(think_close) != std::string_view::npos;
  return s;
}

bool prompt_opens_thinking(std::string_view prompt) {
  while (!prompt.empty() && is_ws(prompt.back())) prompt.remove_suffix(1);
  return prompt.ends_with(think_open);
}

chat_output_parser::chat_output_parser(chat_syntax syntax, bool parse_tools, bool in_thinking, bool parallel)
    : syntax_(syntax), parse_tools_(parse_tools && syntax.tools != tool_call_syntax::none), parallel_(parallel),
      state_(in_thinking && syntax.think_tags ? state::thinking : state::start) {}

chat_output_parser::piece chat_output_parser::push(std::string_view text, bool last) {
  pending_ += text;
  piece out;
  run(out, last);
  if (last && !parallel_ && calls_.size() > 1) calls_.resize(1);
  return out;
}

bool chat_output_parser::take_call(std::string_view body) {
  json::error_code ec;
  json::value v = json::parse(lstrip(body), ec);
  if (ec || !v.is_object()) return false;
  const json::object& o = v.get_object();
  const json::value* name = o.if_contains("name");
  if (!name || !name->is_string() || name->get_string().empty()) return false;
  const json::value* args = o.if_contains("arguments");
  if (!args) args = o.if_contains("parameters");
  std::string arguments = "{}";
  if (args && args->is_string()) {  // already serialised by the model
    json::value inner = json::parse(args->get_string(), ec);
    if (ec || !inner.is_object()) return false;
    arguments = json::serialize(inner);
  } else if (args && args->is_object()) {
    arguments = json::serialize(*args);
  } else if (args && !args->is_null()) {
    return false;
  }
  calls_.push_back({std::string(name->get_string()), std::move(arguments)});
  return true;
}

void chat_output_parser::run(piece& out, bool final) {
  for (;;) {
    switch (state_) {
      case state::start: {
        const std::string_view v = lstrip(pending_);
        if (v.empty() && !final) return;
        if (syntax_.think_tags && v.starts_with(think_open)) {
          pending_ = std::string(v.substr(think_open.size()));
          state_ = state::thinking;
          continue;
        }
        if (syntax_.think_tags && think_open.starts_with(v) && !final) return;
        state_ = parse_tools_ && syntax_.tools == tool_call_syntax::llama3_json && v.starts_with('{') ? state::json_answer
                                                                                                     : state::content;
        continue;
      }
      case state::thinking: {
        const std::size_t at = pending_.find(think_close);
        if (at != std::string::npos) {
          out.reasoning += pending_.substr(0, at);
          pending_.erase(0, at + think_close.size());
          state_ = state::content;
          content_started_ = false;
          continue;
        }
        const std::size_t keep = final ? 0 : marker_tail(pending_, think_close);
        out.reasoning += pending_.substr(0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      case state::content: {
        if (!content_started_) {  // the newlines after </think> or between tool calls
          pending_.erase(0, std::min(pending_.size(), pending_.find_first_not_of(" \t\r\n")));
          if (pending_.empty()) return;
          content_started_ = true;
        }
        if (!parse_tools_ || syntax_.tools != tool_call_syntax::hermes) {
          out.content += pending_;
          pending_.clear();
          return;
        }
        const std::size_t at = pending_.find(call_open);
        if (at != std::string::npos) {
          out.content += pending_.substr(0, at);
          pending_.erase(0, at + call_open.size());
          state_ = state::tool_body;
          continue;
        }
        const std::size_t keep = final ? 0 : marker_tail(pending_, call_open);
        out.content += pending_.substr(0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      case state::tool_body: {
        const std::size_t at = pending_.find(call_close);
        if (at == std::string::npos && !final) return;
        const std::string body = pending_.substr(0, at);
        if (!take_call(body)) {  // not a call after all: the text as the model wrote it
          out.content += std::string(call_open) + body + (at == std::string::npos ? "" : std::string(call_close));
        }
        pending_.erase(0, at == std::string::npos ? pending_.size() : at + call_close.size());
        state_ = state::content;
        content_started_ = false;
        if (pending_.empty()) return;
        continue;
      }
      case state::json_answer: {
        if (!final) return;
        // One call, or several as a JSON array or separated by ';' (Llama 3.2's parallel form).
        json::error_code ec;
        const json::value whole = json::parse(pending_, ec);
        bool ok = false;
        const std::size_t before = calls_.size();
        if (!ec && whole.is_array()) {
          ok = !whole.get_array().empty();
          for (const json::value& c : whole.get_array()) ok = ok && take_call(json::serialize(c));
        } else if (!ec) {
          ok = take_call(pending_);
        } else {
          ok = true;
          std::string_view rest = pending_;
          while (ok && !lstrip(rest).empty()) {
            const std::size_t semi = rest.find(';');
            ok = take_call(rest.substr(0, semi));
            rest = semi == std::string_view::npos ? std::string_view() : rest.substr(semi + 1);
          }
        }
        if (!ok) {
          calls_.resize(before);
          out.content += pending_;
        }
        pending_.clear();
        state_ = state::content;
        return;
      }
    }
  }
}

}  // namespace anvil::model
