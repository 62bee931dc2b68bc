#include "model/chat/chat_output.h"

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <random>
#include <utility>

#include <boost/json.hpp>

namespace anvil::model {
namespace {

namespace json = boost::json;

constexpr std::string_view think_open = "<think>", think_close = "</think>";
constexpr std::string_view call_open = "<tool_call>", call_close = "</tool_call>";
constexpr std::string_view mistral_calls = "[TOOL_CALLS]", mistral_args = "[ARGS]", mistral_call_id = "[CALL_ID]";

// Harmony's markers (control tokens in gpt-oss's vocabulary).
constexpr std::string_view h_start = "<|start|>", h_end = "<|end|>", h_message = "<|message|>", h_channel = "<|channel|>",
                           h_constrain = "<|constrain|>", h_return = "<|return|>", h_call = "<|call|>";
constexpr std::string_view h_functions = "functions.";
constexpr std::size_t h_max_header = 256;  // a longer one, or one with a newline, is not a header

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

// Where the first of `markers` stands in `s`, and which it is (npos and "" when none does).
std::pair<std::size_t, std::string_view> find_first(std::string_view s, std::initializer_list<std::string_view> markers) {
  std::pair<std::size_t, std::string_view> first{std::string_view::npos, {}};
  for (const std::string_view m : markers) {
    if (const std::size_t at = s.find(m); at < first.first) first = {at, m};
  }
  return first;
}

std::size_t markers_tail(std::string_view s, std::initializer_list<std::string_view> markers) {
  std::size_t keep = 0;
  for (const std::string_view m : markers) keep = std::max(keep, marker_tail(s, m));
  return keep;
}

// A harmony header: [ROLE] [to=RECIPIENT] [<|channel|>CHANNEL [to=RECIPIENT] [TYPE]] [<|constrain|>TYPE].
// The role is there when the message began with <|start|> (the prompt wrote the first one's).
struct header_fields {
  bool well_formed = true;  // no marker but <|channel|> and <|constrain|>, and a role where one is due
  std::string_view role, channel, recipient;
};

header_fields read_header(std::string_view h, bool with_role) {
  header_fields r;
  enum { role_part, channel_part, constrain_part } part = role_part;
  for (;;) {
    const std::size_t special = h.find("<|");
    std::string_view words = h.substr(0, special);
    bool first = true;  // the part's first word other than to=...: the role, the channel or a type
    while (!(words = lstrip(words)).empty()) {
      std::size_t end = 0;
      while (end < words.size() && !is_ws(words[end])) ++end;
      const std::string_view word = words.substr(0, end);
      words.remove_prefix(end);
      if (word.starts_with("to=")) {
        if (r.recipient.empty()) r.recipient = word.substr(3);
      } else if (first) {
        first = false;
        if (part == role_part && with_role) r.role = word;
        if (part == channel_part) r.channel = word;
      }
    }
    if (special == std::string_view::npos) break;
    h.remove_prefix(special);
    if (h.starts_with(h_channel) && part == role_part) {
      part = channel_part;
      h.remove_prefix(h_channel.size());
    } else if (h.starts_with(h_constrain)) {
      part = constrain_part;
      h.remove_prefix(h_constrain.size());
    } else {
      r.well_formed = false;
      break;
    }
  }
  if (with_role && r.role.empty()) r.well_formed = false;
  return r;
}

// A call from its name and arguments (an object, a string holding one, or absent).
std::optional<parsed_tool_call> call_of(std::string_view name, const json::value* args) {
  if (name.empty()) return std::nullopt;
  std::string arguments = "{}";
  if (args && args->is_string()) {  // already serialised by the model
    json::error_code ec;
    json::value inner = json::parse(args->get_string(), ec);
    if (ec || !inner.is_object()) return std::nullopt;
    arguments = json::serialize(inner);
  } else if (args && args->is_object()) {
    arguments = json::serialize(*args);
  } else if (args && !args->is_null()) {
    return std::nullopt;
  }
  return parsed_tool_call{std::string(name), std::move(arguments)};
}

}  // namespace

std::vector<std::string_view> chat_syntax::markers() const {
  std::vector<std::string_view> m;
  if (think_tags) m.insert(m.end(), {think_open, think_close});
  if (tools == tool_call_syntax::hermes) m.insert(m.end(), {call_open, call_close});
  if (mistral()) m.insert(m.end(), {mistral_calls, mistral_args, mistral_call_id});
  // Not <|return|> and <|call|>: they end the generation (a parsed output need not show them, and
  // a constraint that could write them as text would end it early).
  if (harmony()) m.insert(m.end(), {h_start, h_end, h_message, h_channel, h_constrain});
  return m;
}

std::string new_tool_call_id(const chat_syntax& syntax) {
  static constexpr std::string_view alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = syntax.mistral() ? "" : "call_";
  for (int i = 0, n = syntax.mistral() ? 9 : 24; i < n; ++i) id += alnum[rng() % alnum.size()];
  return id;
}

chat_syntax detect_chat_syntax(std::string_view src) {
  chat_syntax s;
  if (src.find(h_channel) != std::string_view::npos && src.find(h_message) != std::string_view::npos) {
    s.tools = tool_call_syntax::harmony;  // gpt-oss: its messages carry reasoning and calls alike
  } else if (src.find(mistral_calls) != std::string_view::npos) {
    s.tools = src.find(mistral_args) != std::string_view::npos ? tool_call_syntax::mistral_args
                                                                : tool_call_syntax::mistral_json;
  } else if (src.find(call_open) != std::string_view::npos) {
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

std::string_view chat_output_parser::call_marker() const {
  return syntax_.tools == tool_call_syntax::hermes ? call_open : syntax_.mistral() ? mistral_calls : std::string_view();
}

bool chat_output_parser::take_call(std::string_view body) {
  json::error_code ec;
  const json::value v = json::parse(lstrip(body), ec);
  return !ec && take_call(v);
}

bool chat_output_parser::take_call(const json::value& v) {
  const json::object* o = v.if_object();
  const json::value* name = o ? o->if_contains("name") : nullptr;
  if (!name || !name->is_string()) return false;
  const json::value* args = o->if_contains("arguments");
  if (!args) args = o->if_contains("parameters");
  std::optional<parsed_tool_call> call = call_of(name->get_string(), args);
  if (call) calls_.push_back(std::move(*call));
  return call.has_value();
}

bool chat_output_parser::take_json_calls(std::string_view text) {
  json::error_code ec;
  const json::value whole = json::parse(text, ec);
  if (!ec && whole.is_array()) {
    bool ok = !whole.get_array().empty();
    for (const json::value& c : whole.get_array()) ok = ok && take_call(c);
    return ok;
  }
  if (!ec) return take_call(whole);
  bool ok = true;  // Llama 3.2's parallel form: calls separated by ';'
  while (ok && !lstrip(text).empty()) {
    const std::size_t semi = text.find(';');
    ok = take_call(text.substr(0, semi));
    text = semi == std::string_view::npos ? std::string_view() : text.substr(semi + 1);
  }
  return ok;
}

bool chat_output_parser::take_mistral_calls(std::string_view text) {
  // Either form after the first marker: a JSON list, or name[ARGS]{...} (with an optional
  // [CALL_ID]id before [ARGS]) per call, each call after its own [TOOL_CALLS].
  if (lstrip(text).starts_with('[') || lstrip(text).starts_with('{')) return take_json_calls(text);
  while (!text.empty()) {
    const std::size_t next = text.find(mistral_calls);
    std::string_view one = text.substr(0, next);
    text = next == std::string_view::npos ? std::string_view() : text.substr(next + mistral_calls.size());
    const std::size_t args_at = one.find(mistral_args);
    if (args_at == std::string_view::npos) return false;
    std::string_view name = one.substr(0, args_at);
    name = name.substr(0, name.find(mistral_call_id));
    while (!name.empty() && is_ws(name.back())) name.remove_suffix(1);
    json::error_code ec;
    const json::value args = json::parse(one.substr(args_at + mistral_args.size()), ec);
    if (ec) return false;
    std::optional<parsed_tool_call> call = call_of(lstrip(name), &args);
    if (!call || call->name.find_first_of(" \t\n{}[]\"") != std::string::npos) return false;
    calls_.push_back(std::move(*call));
  }
  return true;
}

void chat_output_parser::run(piece& out, bool final) {
  if (syntax_.harmony()) {
    for (bool more = true; more;) {
      switch (h_state_) {
        case h_state::between: more = harmony_between(final); break;
        case h_state::loose: more = harmony_loose(out, final); break;
        case h_state::header: more = harmony_header(out, final); break;
        case h_state::body: more = harmony_body(out, final); break;
        case h_state::done: pending_.clear(); more = false; break;  // the generation ended
      }
    }
    return;
  }
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
        const std::string_view marker = parse_tools_ ? call_marker() : std::string_view();
        if (marker.empty()) {
          out.content += pending_;
          pending_.clear();
          return;
        }
        const std::size_t at = pending_.find(marker);
        if (at != std::string::npos) {
          out.content += pending_.substr(0, at);
          pending_.erase(0, at + marker.size());
          state_ = syntax_.mistral() ? state::mistral_calls : state::tool_body;
          continue;
        }
        const std::size_t keep = final ? 0 : marker_tail(pending_, marker);
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
      case state::json_answer:
      case state::mistral_calls: {
        if (!final) return;
        const std::size_t before = calls_.size();
        const bool ok = state_ == state::json_answer ? take_json_calls(pending_) : take_mistral_calls(pending_);
        if (!ok) {  // not calls after all: the text as the model wrote it
          calls_.resize(before);
          out.content += (state_ == state::mistral_calls ? std::string(mistral_calls) : std::string()) + pending_;
        }
        pending_.clear();
        state_ = state::content;
        return;
      }
    }
  }
}

// Harmony: what comes next is a message (its header: after <|start|>, or the first message's,
// whose role the prompt wrote), the end of the generation, or text outside any message.
bool chat_output_parser::harmony_between(bool final) {
  const std::string_view v = lstrip(pending_);
  if (v.starts_with(h_start)) {
    pending_.erase(0, pending_.size() - v.size() + h_start.size());
    head_ = h_start;
    h_state_ = h_state::header;
    return true;
  }
  if (v.starts_with(h_channel) || v.starts_with(h_constrain) || v.starts_with(h_message) || pending_.starts_with(" to=")) {
    if (!pending_.starts_with(" to=")) pending_ = std::string(v);
    head_.clear();
    h_state_ = h_state::header;
    return true;
  }
  if (v.starts_with(h_return) || v.starts_with(h_call)) {
    h_state_ = h_state::done;
    return true;
  }
  if (!final) {
    const auto may_start = [&](std::string_view m) { return m.starts_with(v); };
    if (v.empty() || may_start(h_start) || may_start(h_channel) || may_start(h_constrain) || may_start(h_message) ||
        may_start(h_return) || may_start(h_call) || std::string_view(" to=").starts_with(pending_)) {
      return false;
    }
  }
  if (message_seen_) pending_ = std::string(v);  // whitespace between messages is dropped
  h_state_ = h_state::loose;
  return true;
}

// Text outside any message is content, up to the next message.
bool chat_output_parser::harmony_loose(piece& out, bool final) {
  const auto [at, marker] = find_first(pending_, {h_start, h_return, h_call});
  if (at != std::string::npos) {
    out.content += pending_.substr(0, at);
    pending_.erase(0, at);
    h_state_ = marker == h_start ? h_state::between : h_state::done;
    return true;
  }
  const std::size_t keep = final ? 0 : markers_tail(pending_, {h_start, h_return, h_call});
  out.content += pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return false;
}

// A header is held back until its <|message|>; one cut short or broken is text as written.
bool chat_output_parser::harmony_header(piece& out, bool final) {
  const auto [at, marker] = find_first(pending_, {h_message, h_start, h_end, h_return, h_call});
  const std::string_view header = std::string_view(pending_).substr(0, at);
  const bool broken = header.size() > h_max_header || header.find('\n') != std::string_view::npos;
  if (marker == h_message && !broken) {
    open_body(out, header);
    pending_.erase(0, at + h_message.size());
    h_state_ = h_state::body;
    message_seen_ = true;
    return true;
  }
  if (at == std::string::npos && !broken && !final) return false;
  out.content += head_;
  head_.clear();
  if (broken) {  // not a header: text, up to the next message
    h_state_ = h_state::loose;
    return true;
  }
  out.content += header;
  pending_.erase(0, header.size());
  h_state_ = h_state::between;
  return true;
}

void chat_output_parser::open_body(piece& out, std::string_view header) {
  const header_fields h = read_header(header, !head_.empty());
  head_ += header;
  head_ += h_message;
  fallback_ = h.channel == "analysis" ? goes_to::reasoning : goes_to::content;
  const bool known = h.well_formed && (h.role.empty() || h.role == "assistant") &&
                     (h.channel.empty() || h.channel == "analysis" || h.channel == "commentary" || h.channel == "final");
  if (known && parse_tools_ && h.recipient.starts_with(h_functions) && h.recipient.size() > h_functions.size()) {
    body_ = goes_to::call;
    call_name_ = std::string(h.recipient.substr(h_functions.size()));
    call_body_.clear();
    return;
  }
  body_ = fallback_;
  if (!known || !h.recipient.empty()) (body_ == goes_to::reasoning ? out.reasoning : out.content) += head_;
}

// A body runs to <|end|>, <|return|> or <|call|>, or to where another message begins.
bool chat_output_parser::harmony_body(piece& out, bool final) {
  const auto [at, marker] = find_first(pending_, {h_end, h_return, h_call, h_start, h_channel});
  const std::size_t keep = at != std::string::npos || final ? 0 : markers_tail(pending_, {h_end, h_return, h_call, h_start, h_channel});
  const std::size_t n = at != std::string::npos ? at : pending_.size() - keep;
  (body_ == goes_to::call ? call_body_ : body_ == goes_to::reasoning ? out.reasoning : out.content) += pending_.substr(0, n);
  pending_.erase(0, n);
  if (at == std::string::npos && !final) return false;
  if (body_ == goes_to::call) close_call(out);
  if (marker == h_end) pending_.erase(0, h_end.size());
  h_state_ = marker == h_return || marker == h_call ? h_state::done : h_state::between;
  return true;
}

void chat_output_parser::close_call(piece& out) {
  json::error_code ec;
  const json::value args = json::parse(call_body_, ec);
  std::optional<parsed_tool_call> call;
  if (!ec && (args.is_object() || args.is_string())) call = call_of(call_name_, &args);
  if (call) {
    calls_.push_back(std::move(*call));
  } else {  // not a call after all: the message as the model wrote it
    (fallback_ == goes_to::reasoning ? out.reasoning : out.content) += head_ + call_body_;
  }
  call_body_.clear();
}

}  // namespace anvil::model
