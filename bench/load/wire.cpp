#include "bench/load/wire.h"

#include <boost/json.hpp>

namespace anvil::bench {
namespace json = boost::json;
namespace {

json::value prompt_value(const bench_prompt& p) {
  if (p.token_ids.empty()) return json::value(p.text);
  json::array ids;
  ids.reserve(p.token_ids.size());
  for (auto t : p.token_ids) ids.emplace_back(t);
  return ids;
}

json::array messages_value(const bench_prompt& p) {
  json::array msgs;
  if (p.messages.empty()) {
    msgs.push_back(json::object{{"role", "user"}, {"content", p.text}});
    return msgs;
  }
  for (const auto& m : p.messages) msgs.push_back(json::object{{"role", m.role}, {"content", m.content}});
  return msgs;
}

std::optional<std::int64_t> int_field(const json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  if (!v) return std::nullopt;
  if (v->is_int64()) return v->as_int64();
  if (v->is_uint64()) return static_cast<std::int64_t>(v->as_uint64());
  return std::nullopt;
}

std::string string_field(const json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  return v && v->is_string() ? std::string(v->as_string()) : std::string();
}

void read_usage(const json::object& o, std::optional<std::int64_t>& prompt, std::optional<std::int64_t>& completion) {
  const auto* u = o.if_contains("usage");
  if (!u || !u->is_object()) return;
  prompt = int_field(u->as_object(), "prompt_tokens");
  completion = int_field(u->as_object(), "completion_tokens");
}

// "code: message" from an error value that is an object, a string or anything else.
std::string describe_error(const json::value& e) {
  if (e.is_string()) return std::string(e.as_string());
  if (!e.is_object()) return json::serialize(e);
  const auto& o = e.as_object();
  std::string code = string_field(o, "code");
  if (code.empty()) code = string_field(o, "type");
  if (code.empty()) {
    if (auto n = int_field(o, "code")) code = std::to_string(*n);
  }
  std::string msg = string_field(o, "message");
  if (msg.empty()) msg = json::serialize(e);
  return code.empty() ? msg : code + ": " + msg;
}

std::string shorten(std::string_view s, std::size_t n = 300) {
  std::string out(s.substr(0, n));
  if (s.size() > n) out += "...";
  return out;
}

}  // namespace

std::string line_request(std::int64_t id, const bench_prompt& p, int max_tokens) {
  json::object o;
  o["id"] = id;
  if (!p.messages.empty()) {
    o["messages"] = messages_value(p);
  } else {
    o["prompt"] = prompt_value(p);
  }
  o["max_tokens"] = max_tokens;
  o["ignore_eos"] = true;
  o["stream"] = true;
  return json::serialize(o) + "\n";
}

std::string line_auth(const std::string& key) { return json::serialize(json::object{{"auth", key}}) + "\n"; }

line_answer parse_line_answer(std::string_view line) {
  line_answer a;
  json::error_code ec;
  const json::value v = json::parse(line, ec);
  if (ec || !v.is_object()) {
    a.error = "unreadable line from the server: " + shorten(line);
    return a;
  }
  const auto& o = v.as_object();
  if (const auto* auth = o.if_contains("auth"); auth && auth->is_string() && auth->as_string() == "ok") {
    a.type = line_answer::kind::auth_ok;
    return a;
  }
  a.id = int_field(o, "id");
  if (const auto* err = o.if_contains("error")) {
    a.type = line_answer::kind::error;
    a.error = describe_error(*err);
    return a;
  }
  if (const auto* toks = o.if_contains("tokens"); toks && toks->is_array()) a.n_tokens = std::int64_t(toks->as_array().size());
  if (const auto* done = o.if_contains("done"); done && done->is_bool() && done->as_bool()) {
    a.type = line_answer::kind::done;
    a.finish_reason = string_field(o, "finish_reason");
    read_usage(o, a.prompt_tokens, a.completion_tokens);
    return a;
  }
  if (o.contains("text") || o.contains("tokens")) {
    a.type = line_answer::kind::chunk;
    a.has_content = !string_field(o, "text").empty() || a.n_tokens > 0;
    return a;
  }
  a.error = "unexpected line from the server: " + shorten(line);
  return a;
}

std::string http_request_body(const bench_prompt& p, int max_tokens, const std::string& model, bool chat) {
  json::object o;
  o["model"] = model;
  if (chat) {
    o["messages"] = messages_value(p);
    o["max_completion_tokens"] = max_tokens;
  } else {
    o["prompt"] = prompt_value(p);
  }
  o["max_tokens"] = max_tokens;
  o["temperature"] = 0.0;
  o["stream"] = true;
  o["stream_options"] = json::object{{"include_usage", true}};
  o["ignore_eos"] = true;
  return json::serialize(o);
}

http_chunk parse_http_event(std::string_view data, bool chat) {
  http_chunk c;
  if (data == "[DONE]") {
    c.done = true;
    return c;
  }
  json::error_code ec;
  const json::value v = json::parse(data, ec);
  if (ec || !v.is_object()) {
    c.error = "unreadable event from the server: " + shorten(data);
    return c;
  }
  const auto& o = v.as_object();
  if (const auto* err = o.if_contains("error"); err && !err->is_null()) {
    c.error = describe_error(*err);
    return c;
  }
  read_usage(o, c.prompt_tokens, c.completion_tokens);
  const auto* choices = o.if_contains("choices");
  if (!choices || !choices->is_array() || choices->as_array().empty()) return c;
  const auto* choice = choices->as_array()[0].if_object();
  if (!choice) return c;
  if (chat) {
    const auto* delta = choice->if_contains("delta");
    if (delta && delta->is_object())
      c.has_content = !string_field(delta->as_object(), "content").empty() ||
                      !string_field(delta->as_object(), "reasoning_content").empty();
  } else {
    c.has_content = !string_field(*choice, "text").empty();
  }
  return c;
}

std::string http_error_message(std::string_view body) {
  json::error_code ec;
  const json::value v = json::parse(body, ec);
  if (!ec && v.is_object()) {
    const auto& o = v.as_object();
    if (const auto* e = o.if_contains("error"); e && !e->is_null()) {
      if (e->is_object() && !string_field(e->as_object(), "message").empty()) return string_field(e->as_object(), "message");
      return describe_error(*e);
    }
    if (auto m = string_field(o, "message"); !m.empty()) return m;
    if (const auto* d = o.if_contains("detail")) return d->is_string() ? std::string(d->as_string()) : json::serialize(*d);
  }
  return shorten(body);
}

std::optional<std::string> first_model_id(std::string_view body) {
  json::error_code ec;
  const json::value v = json::parse(body, ec);
  if (ec || !v.is_object()) return std::nullopt;
  const auto* data = v.as_object().if_contains("data");
  if (!data || !data->is_array() || data->as_array().empty()) return std::nullopt;
  const auto* first = data->as_array()[0].if_object();
  if (!first) return std::nullopt;
  auto id = string_field(*first, "id");
  if (id.empty()) return std::nullopt;
  return id;
}

}  // namespace anvil::bench
