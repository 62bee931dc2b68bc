#include "proto/request_json.h"

#include <algorithm>
#include <charconv>
#include <iterator>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include <boost/json.hpp>

namespace anvil::proto {

namespace json = boost::json;

namespace {

// Reads one field; returns false with `why` set when it has the wrong type or value.
struct reader {
  const json::object& o;
  std::string why;

  const json::value* find(std::string_view key) const {
    const auto it = o.find(key);
    return it == o.end() || it->value().is_null() ? nullptr : &it->value();
  }
  bool fail(std::string_view key, std::string_view what) {
    if (why.empty()) {
      why.append("`").append(key).append("` ").append(what);
    }
    return false;
  }

  // An integer: JSON integers, or numbers with no fraction part. Integral values beyond int64
  // (2^64 - 1, 1e308) saturate to its ends with `beyond` set (+1 above, -1 below), so range
  // checks refuse them (or clamp them) instead of calling them non-integers.
  std::optional<std::int64_t> integer(const json::value& v, int* beyond = nullptr) const {
    constexpr std::int64_t lo = std::numeric_limits<std::int64_t>::min(), hi = std::numeric_limits<std::int64_t>::max();
    int out_of_range = 0;
    std::optional<std::int64_t> i;
    if (v.is_int64()) {
      i = v.get_int64();
    } else if (v.is_uint64()) {
      out_of_range = v.get_uint64() > std::uint64_t(hi) ? 1 : 0;
      i = out_of_range ? hi : std::int64_t(v.get_uint64());
    } else if (v.is_double()) {
      const double d = v.get_double();
      if (!std::isfinite(d) || std::trunc(d) != d) return std::nullopt;
      out_of_range = d >= 9.2e18 ? 1 : d <= -9.2e18 ? -1 : 0;
      i = out_of_range > 0 ? hi : out_of_range < 0 ? lo : std::int64_t(d);
    }
    if (beyond) *beyond = out_of_range;
    if (!beyond && out_of_range) return std::nullopt;
    return i;
  }
  // An integer in [lo, hi]; with `clamp_high`, larger values are cut to hi instead of refused.
  template <class T>
  bool get_int(std::string_view key, T& out, std::int64_t lo, std::int64_t hi, bool clamp_high = false) {
    const json::value* v = find(key);
    if (!v) return true;
    int beyond = 0;
    auto i = integer(*v, &beyond);
    if (!i) return fail(key, "must be an integer");
    if (clamp_high && *i > hi) i = hi;
    if (*i < lo || *i > hi || (beyond && !(clamp_high && beyond > 0))) {
      return fail(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                           json::serialize(*v).substr(0, 40));
    }
    out = T(*i);
    return true;
  }
  bool get_float(std::string_view key, float& out) {
    const json::value* v = find(key);
    if (!v) return true;
    if (!v->is_number()) return fail(key, "must be a number");
    const double d = v->to_number<double>();
    if (!std::isfinite(d) || std::abs(d) > 3.0e38) return fail(key, "must be a finite number");
    out = float(d);
    return true;
  }
  bool get_bool(std::string_view key, bool& out) {
    const json::value* v = find(key);
    if (!v) return true;
    if (!v->is_bool()) return fail(key, "must be true or false");
    out = v->get_bool();
    return true;
  }
};

// One tool call of an assistant message, as clients send it back: {id, type, function: {name,
// arguments}}. `arguments` arrives as a JSON string (OpenAI) and is handed to the template as the
// object it holds (transformers' templates expect one); a string that is not JSON stays a string.
bool read_tool_call(reader& r, const json::value& v, json::array& out) {
  const json::object* o = v.if_object();
  const json::value* fn = o ? o->if_contains("function") : nullptr;
  const json::object* fo = fn ? fn->if_object() : nullptr;
  const json::value* name = fo ? fo->if_contains("name") : nullptr;
  if (!name || !name->is_string()) return r.fail("messages", "tool_calls entries need {\"function\": {\"name\": string, \"arguments\": ...}}");
  json::object call = *o;
  json::object f = *fo;
  if (const json::value* args = fo->if_contains("arguments"); args && args->is_string()) {
    json::error_code ec;
    json::value parsed = json::parse(args->get_string(), ec);
    if (!ec && parsed.is_object()) f["arguments"] = std::move(parsed);
  }
  call["function"] = std::move(f);
  out.push_back(std::move(call));
  return true;
}

bool read_messages(reader& r, const json::value& v, std::vector<model::chat_message>& out) {
  if (!v.is_array() || v.get_array().empty()) return r.fail("messages", "must be a non-empty array of {role, content}");
  for (const json::value& m : v.get_array()) {
    const json::object* mo = m.if_object();
    const json::value* role = mo ? mo->if_contains("role") : nullptr;
    if (!role || !role->is_string()) return r.fail("messages", "entries need a string `role`");
    model::chat_message cm{.role = std::string(role->get_string()), .content = {}};
    for (const auto& kv : *mo) {
      const std::string_view key = kv.key();
      const json::value& f = kv.value();
      if (key == "role") continue;
      if (key == "content") {
        if (f.is_string()) {
          cm.content = std::string(f.get_string());
        } else if (f.is_array()) {  // OpenAI content parts: only text parts
          for (const json::value& part : f.get_array()) {
            const json::object* po = part.if_object();
            const json::value* type = po ? po->if_contains("type") : nullptr;
            const json::value* text = po ? po->if_contains("text") : nullptr;
            if (!type || *type != "text" || !text || !text->is_string()) {
              return r.fail("messages", "content parts must be {\"type\": \"text\", \"text\": string}");
            }
            cm.content += text->get_string();
          }
        } else if (!f.is_null()) {
          return r.fail("messages", "entries need a string `content`");
        }
        continue;
      }
      if (f.is_null() || (f.is_array() && f.get_array().empty())) continue;  // what SDKs send back unset
      if (key == "tool_calls") {
        if (!f.is_array()) return r.fail("messages", "`tool_calls` must be an array");
        json::array calls;
        for (const json::value& c : f.get_array()) {
          if (!read_tool_call(r, c, calls)) return false;
        }
        cm.tool_calls_json = json::serialize(calls);
      } else if (key == "tool_call_id" || key == "name" || key == "reasoning_content") {
        if (!f.is_string()) return r.fail("messages", "`" + std::string(key) + "` must be a string");
        (key == "tool_call_id" ? cm.tool_call_id : key == "name" ? cm.name : cm.reasoning_content) = std::string(f.get_string());
      } else {
        return r.fail("messages", "entries with `" + valid_utf8(key.substr(0, 64)) + "` are not supported by this server");
      }
    }
    const json::value* content = mo->if_contains("content");
    cm.content_is_null = !content || content->is_null();
    if (cm.content_is_null && cm.tool_calls_json.empty()) return r.fail("messages", "entries need a string `content`");
    out.push_back(std::move(cm));
  }
  return true;
}

// `tools`: [{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}],
// handed to the chat template as given.
bool read_tools(reader& r, const json::value& v, std::string& out) {
  const json::array* a = v.if_array();
  if (!a) return r.fail("tools", "must be an array of {\"type\": \"function\", \"function\": {...}}");
  for (const json::value& t : *a) {
    const json::object* o = t.if_object();
    const json::value* type = o ? o->if_contains("type") : nullptr;
    const json::value* fn = o ? o->if_contains("function") : nullptr;
    if (!type || *type != "function" || !fn || !fn->is_object()) {
      return r.fail("tools", "entries must be {\"type\": \"function\", \"function\": {...}}");
    }
    const json::object& f = fn->get_object();
    const json::value* name = f.if_contains("name");
    if (!name || !name->is_string() || name->get_string().empty()) return r.fail("tools", "functions need a `name`");
    if (const json::value* p = f.if_contains("parameters"); p && !p->is_object() && !p->is_null()) {
      return r.fail("tools", "a function's `parameters` must be a JSON schema object");
    }
  }
  if (!a->empty()) out = json::serialize(*a);
  return true;
}

// `tool_choice`: "auto" (the default with tools), "none", "required", or
// {"type": "function", "function": {"name": ...}}; the last two constrain the output (engine.h).
bool read_tool_choice(reader& r, const json::value& v, generate_request& req) {
  if (v == "auto") return true;
  if (v == "none") {
    req.tools_json.clear();  // the model is not shown the tools, and its output is not parsed for calls
    return true;
  }
  if (v == "required") {
    req.tool_call_required = true;
    return true;
  }
  const json::object* o = v.if_object();
  const json::value* fn = o ? o->if_contains("function") : nullptr;
  const json::value* name = fn && fn->is_object() ? fn->get_object().if_contains("name") : nullptr;
  if (name && name->is_string() && !name->get_string().empty()) {
    req.tool_call_required = true;
    req.tool_call_name = std::string(name->get_string());
    return true;
  }
  return r.fail("tool_choice", "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
}

bool read_token_ids(reader& r, const json::array& a, std::vector<std::int32_t>& out) {
  out.reserve(a.size());
  for (const json::value& t : a) {
    const auto id = r.integer(t);
    if (!id || *id < 0 || *id > std::numeric_limits<std::int32_t>::max()) {
      return r.fail("prompt", "token arrays must hold token ids (integers >= 0)");
    }
    out.push_back(std::int32_t(*id));
  }
  return true;
}

// A string, an array of token ids, or (completions) a list of either: one prompt each.
bool read_prompt(reader& r, const json::value& v, dialect d, std::vector<prompt_input>& out) {
  if (v.is_string()) {
    if (v.get_string().empty()) return r.fail("prompt", "must not be empty");
    out.push_back({.text = std::string(v.get_string())});
    return true;
  }
  const json::array* a = v.if_array();
  if (!a || a->empty()) return r.fail("prompt", "must be a string or a non-empty array of token ids");
  const bool list = (*a)[0].is_string() || (*a)[0].is_array();
  if (!list) {
    out.emplace_back();
    return read_token_ids(r, *a, out.back().tokens);
  }
  // Elsewhere only OpenAI's ["text"]: one prompt per request.
  if (d != dialect::completions && (a->size() > 1 || !(*a)[0].is_string())) {
    return r.fail("prompt", "holds one prompt per request here");
  }
  if (a->size() > max_prompts) return r.fail("prompt", "holds at most " + std::to_string(max_prompts) + " prompts");
  for (const json::value& p : *a) {
    if (p.is_string()) {
      if (p.get_string().empty()) return r.fail("prompt", "must not be empty");
      out.push_back({.text = std::string(p.get_string())});
    } else if (p.is_array() && !p.get_array().empty()) {
      out.emplace_back();
      if (!read_token_ids(r, p.get_array(), out.back().tokens)) return false;
    } else {
      return r.fail("prompt", "a list of prompts holds strings or non-empty arrays of token ids");
    }
  }
  return true;
}

bool read_stop(reader& r, const json::value& v, std::vector<std::string>& out) {
  if (v.is_string()) {
    if (!v.get_string().empty()) out.emplace_back(v.get_string());
    return true;
  }
  const json::array* a = v.if_array();
  if (!a) return r.fail("stop", "must be a string or an array of strings");
  if (a->size() > max_stop_strings) return r.fail("stop", "holds at most " + std::to_string(max_stop_strings) + " strings");
  for (const json::value& s : *a) {
    if (!s.is_string()) return r.fail("stop", "must be a string or an array of strings");
    if (!s.get_string().empty()) out.emplace_back(s.get_string());
  }
  return true;
}

bool read_logit_bias(reader& r, const json::value& v, sampler::sampling_params& p) {
  const json::object* o = v.if_object();
  if (!o) return r.fail("logit_bias", "must be an object of {\"token id\": bias}");
  for (const auto& kv : *o) {
    const std::string_view key = kv.key();
    std::int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id > std::numeric_limits<std::int32_t>::max()) {
      return r.fail("logit_bias", "keys must be token ids, got \"" + valid_utf8(key.substr(0, 32)) + "\"");
    }
    if (!kv.value().is_number()) return r.fail("logit_bias", "values must be numbers");
    const double b = kv.value().to_number<double>();
    if (!std::isfinite(b)) return r.fail("logit_bias", "values must be finite");
    p.logit_bias.emplace_back(std::int32_t(id), float(std::clamp(b, -1e6, 1e6)));
  }
  return true;
}

// The fields each dialect reads (or accepts as metadata: `model`, `user`). Anything else is
// refused by name, so a client never believes a feature is on that anvil does not have.
bool known_field(std::string_view key, dialect d) {
  static constexpr std::string_view shared[] = {
      "max_tokens",        "stream",           "temperature",       "top_k",      "top_p",
      "min_p",             "repetition_penalty", "presence_penalty", "frequency_penalty", "seed",
      "ignore_eos",        "priority",         "logprobs",          "stop",       "logit_bias",
      "stop_token_ids",    "min_tokens",       "response_format",   "regex",      "grammar"};
  static constexpr std::string_view line_only[] = {"id", "prompt", "messages", "tools", "tool_choice",
                                                   "parallel_tool_calls", "chat_template_kwargs"};
  static constexpr std::string_view http_shared[] = {"model", "user", "n", "stream_options"};
  static constexpr std::string_view completions_only[] = {"prompt", "echo"};
  static constexpr std::string_view chat_only[] = {"messages",    "max_completion_tokens", "top_logprobs",
                                                   "tools",       "tool_choice",           "parallel_tool_calls",
                                                   "chat_template_kwargs"};
  const auto in = [&](const auto& list) { return std::find(std::begin(list), std::end(list), key) != std::end(list); };
  if (in(shared)) return true;
  switch (d) {
    case dialect::line: return in(line_only);
    case dialect::completions: return in(http_shared) || in(completions_only);
    case dialect::chat: return in(http_shared) || in(chat_only);
  }
  return false;
}

// `response_format` (OpenAI), `regex` and `grammar` (GBNF): what the output must be (engine.h,
// structured_output); one of them at most.
bool read_structured(reader& r, structured_output& out) {
  const json::value* rf = r.find("response_format");
  const json::value* re = r.find("regex");
  const json::value* gr = r.find("grammar");
  if (const json::object* fo = rf ? rf->if_object() : nullptr) {  // {"type": "text"}: no constraint
    if (const json::value* t = fo->if_contains("type"); t && *t == "text") rf = nullptr;
  }
  if (bool(rf) + bool(re) + bool(gr) > 1) {
    return r.fail(gr ? "grammar" : "regex", "cannot be given with another of `response_format`, `regex` and `grammar`");
  }
  for (const auto& [field, value, what] : {std::tuple{"regex", re, structured_output::kind::regex},
                                           std::tuple{"grammar", gr, structured_output::kind::grammar}}) {
    if (!value) continue;
    if (!value->is_string() || value->get_string().empty()) return r.fail(field, "must be a non-empty string");
    out = {.what = what, .spec = std::string(value->get_string()), .field = field};
    return true;
  }
  if (!rf) return true;
  const json::object* o = rf->if_object();
  const json::value* type = o ? o->if_contains("type") : nullptr;
  if (!type || !type->is_string()) return r.fail("response_format", "must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}");
  const std::string_view t = type->get_string();
  if (t == "json_object") {
    out = {.what = structured_output::kind::json_object, .spec = {}, .field = "response_format"};
    return true;
  }
  if (t != "json_schema") return r.fail("response_format", "type must be \"text\", \"json_object\" or \"json_schema\"");
  const json::value* js = o->if_contains("json_schema");
  const json::object* jo = js ? js->if_object() : nullptr;
  const json::value* schema = jo ? jo->if_contains("schema") : nullptr;
  if (!schema || !(schema->is_object() || schema->is_bool())) {
    return r.fail("response_format", "json_schema needs {\"name\": ..., \"schema\": {...}}");
  }
  out = {.what = structured_output::kind::json_schema, .spec = json::serialize(*schema), .field = "response_format"};
  return true;
}

}  // namespace

std::string read_request(const json::object& o, dialect d, parsed_request& out) {
  reader r{o, {}};
  generate_request& req = out.req;
  sampler::sampling_params& s = req.sampling;
  out.stream = d == dialect::line;

  const json::value* prompt = r.find("prompt");
  const json::value* messages = r.find("messages");
  if (d == dialect::chat) {
    if (!messages) return "`messages` is required";
    prompt = nullptr;
  } else if (d == dialect::completions) {
    if (!prompt) return "`prompt` is required";
    messages = nullptr;
  } else if (!prompt == !messages) {
    return "give exactly one of `prompt` or `messages`";
  }
  for (const auto& kv : o) {
    if (!kv.value().is_null() && !known_field(kv.key(), d)) {
      return "`" + valid_utf8(kv.key().substr(0, 64)) + "` is not supported by this server";
    }
  }
  if (prompt) {
    if (!read_prompt(r, *prompt, d, out.prompts)) return r.why;
    req.prompt = out.prompts[0].text;
    req.prompt_tokens = out.prompts[0].tokens;
  }
  if (messages && !read_messages(r, *messages, req.messages)) return r.why;
  if (messages) {
    const json::value* tools = r.find("tools");
    if (tools && !read_tools(r, *tools, req.tools_json)) return r.why;
    const json::value* choice = r.find("tool_choice");
    if (choice && !read_tool_choice(r, *choice, req)) return r.why;
    if (req.tool_call_required && req.tools_json.empty()) return "`tool_choice` needs `tools`";
    if (!r.get_bool("parallel_tool_calls", req.parallel_tool_calls)) return r.why;
    if (const json::value* kw = r.find("chat_template_kwargs")) {
      if (!kw->is_object()) return "`chat_template_kwargs` must be an object";
      for (const std::string_view reserved : {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}) {
        if (kw->get_object().contains(reserved)) return "`chat_template_kwargs` may not set `" + std::string(reserved) + "`";
      }
      if (!kw->get_object().empty()) req.chat_template_kwargs_json = json::serialize(*kw);
    }
  } else {
    for (const std::string_view key : {"tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs"}) {
      if (r.find(key)) return "`" + std::string(key) + "` goes with `messages`";
    }
  }

  constexpr std::int64_t big = std::int64_t(1) << 40;
  const char* max_key = d == dialect::chat && r.find("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (d != dialect::line) req.max_tokens = big;  // OpenAI: until the context is full
  // max_tokens past `big` is cut to it (and then to what the context leaves), not refused.
  bool ok = r.get_int(max_key, req.max_tokens, 1, big, true) && r.get_bool("stream", out.stream) &&
            r.get_float("temperature", s.temperature) && r.get_int("top_k", s.top_k, -1, std::numeric_limits<std::int32_t>::max()) &&
            r.get_float("top_p", s.top_p) && r.get_float("min_p", s.min_p) &&
            r.get_float("repetition_penalty", s.repetition_penalty) &&
            r.get_float("presence_penalty", s.presence_penalty) &&
            r.get_float("frequency_penalty", s.frequency_penalty) &&
            r.get_int("seed", s.seed, 0, std::numeric_limits<std::int64_t>::max()) &&
            r.get_bool("ignore_eos", req.ignore_eos) && r.get_int("min_tokens", req.min_tokens, 0, big) &&
            r.get_int("priority", req.priority, -1000000, 1000000);
  if (!ok) return r.why;
  if (s.top_k < 0) s.top_k = 0;  // -1 means "all" to some clients

  if (d == dialect::chat) {
    ok = r.get_bool("logprobs", out.want_logprobs) && r.get_int("top_logprobs", s.logprobs, 0, 1000);
    if (ok && s.logprobs > 0 && !out.want_logprobs) return "`top_logprobs` needs `logprobs: true`";
  } else {
    std::int32_t n = -1;
    ok = r.get_int("logprobs", n, 0, 1000);
    if (n >= 0) {
      out.want_logprobs = true;
      s.logprobs = n;
    }
    if (d == dialect::completions) ok = ok && r.get_bool("echo", out.echo);
  }
  if (!ok) return r.why;

  if (const json::value* v = r.find("stop"); v && !read_stop(r, *v, req.stop)) return r.why;
  if (const json::value* v = r.find("logit_bias"); v && !read_logit_bias(r, *v, s)) return r.why;
  if (!read_structured(r, req.constraint)) return r.why;
  if (const json::value* v = r.find("stop_token_ids")) {
    const json::array* a = v->if_array();
    if (!a || a->size() > max_stop_strings) {
      return "`stop_token_ids` must be an array of at most " + std::to_string(max_stop_strings) + " token ids";
    }
    for (const json::value& t : *a) {
      const auto id = r.integer(t);
      if (!id || *id < 0 || *id > std::numeric_limits<std::int32_t>::max()) return "`stop_token_ids` must hold token ids (integers >= 0)";
      req.stop_token_ids.push_back(std::int32_t(*id));
    }
  }
  if (d != dialect::line) {
    if (!r.get_int("n", out.n, 1, max_choices)) return r.why;
    if (out.prompts.size() > 1 && std::int64_t(out.prompts.size()) * out.n > max_choices * 4) {
      return "`prompt` holds " + std::to_string(out.prompts.size()) + " prompts: with `n` " + std::to_string(out.n) +
             " that is more than " + std::to_string(max_choices * 4) + " choices";
    }
    if (const json::value* so = r.find("stream_options")) {
      const json::object* soo = so->if_object();
      if (!soo) return "`stream_options` must be an object";
      reader sr{*soo, {}};
      if (!sr.get_bool("include_usage", out.include_usage)) return sr.why;
    }
  }
  return {};
}

std::string valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (std::size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xC0) == 0x80;
    if (ok && len > 1) {  // no overlong forms, surrogates or code points past U+10FFFF
      std::uint32_t cp = c & (0x7F >> len);
      for (std::size_t k = 1; k < len; ++k) cp = (cp << 6) | (p[i + k] & 0x3F);
      ok = cp >= (len == 2 ? 0x80u : len == 3 ? 0x800u : 0x10000u) && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

}  // namespace anvil::proto
