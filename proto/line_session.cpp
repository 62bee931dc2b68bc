#include "proto/line_session.h"

#include <cmath>
#include <optional>

#include <boost/json.hpp>

#include "model/model_error.h"
#include "proto/errors.h"
#include "proto/request_json.h"

namespace anvil::proto {

namespace json = boost::json;

namespace {

constexpr std::size_t max_id_bytes = 256;

// The request id as the session keeps and echoes it, or nullopt when it is not one: a string of
// at most max_id_bytes, or an integer — written as one or, as integer fields accept, as a number
// with no fraction (1.0 is the id 1: the same request, echoed as 1).
std::optional<json::value> id_of(const json::value& id) {
  if ((id.is_string() && id.get_string().size() <= max_id_bytes) || id.is_int64() || id.is_uint64()) return id;
  if (id.is_double()) {
    const double d = id.get_double();
    if (std::isfinite(d) && std::trunc(d) == d && d >= -9.2e18 && d <= 9.2e18) return json::value(std::int64_t(d));
  }
  return std::nullopt;
}

json::array top_logprobs_json(const engine& eng, const std::vector<std::vector<sampler::token_logprob>>& top) {
  json::array out;
  for (const auto& alts : top) {
    json::array a;
    for (const sampler::token_logprob& t : alts) {
      const std::int32_t tok[1] = {t.token};
      a.push_back(json::object{{"token", t.token}, {"text", valid_utf8(eng.tokenizer().decode(tok))}, {"logprob", t.logprob}});
    }
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace

line_session::line_session(std::shared_ptr<engine> eng, line_session_hooks hooks, std::string api_key)
    : eng_(std::move(eng)), hooks_(std::move(hooks)), api_key_(std::move(api_key)), authed_(api_key_.empty()) {}

void line_session::send(const json::object& o) {
  if (closed_) return;
  std::string line = json::serialize(o);
  line += '\n';
  hooks_.write(std::move(line));
}

void line_session::error(const json::value& id, std::string_view code, std::string_view message) {
  send(json::object{{"id", id}, {"error", json::object{{"code", code}, {"message", message}}}});
}

void line_session::on_line_too_long() {
  error(nullptr, "line_too_long", "the line is longer than the server's limit; it was skipped");
}

void line_session::on_line(std::string_view line) {
  if (closed_) return;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.find_first_not_of(" \t") == std::string_view::npos) return;  // blank lines are ignored

  json::error_code ec;
  json::value v = json::parse(line, ec);
  if (ec || !v.is_object()) {
    return error(nullptr, "invalid_json", ec ? "the line is not valid JSON: " + ec.message() : "the line is not a JSON object");
  }
  json::object& o = v.get_object();

  if (const json::value* key = o.if_contains("auth")) {
    if (api_key_.empty() || (key->is_string() && constant_time_equal(key->get_string(), api_key_))) {
      authed_ = true;
      return send(json::object{{"auth", "ok"}});
    }
    error(nullptr, "unauthorized", "wrong API key");
    on_close();
    if (hooks_.close) hooks_.close();
    return;
  }
  if (const json::value* named = o.if_contains("cancel")) {
    const std::optional<json::value> id = id_of(*named);
    if (!id) return error(nullptr, "invalid_request", "`cancel` must name a request id");
    if (!authed_) return error(*id, "unauthorized", "send {\"auth\": KEY} first");
    return cancel(*id);
  }
  submit(o);
}

void line_session::submit(json::object& o) {
  const json::value* idp = o.if_contains("id");
  if (!idp) return error(nullptr, "invalid_request", "`id` is required (a string or an integer)");
  const std::optional<json::value> parsed_id = id_of(*idp);
  if (!parsed_id) return error(nullptr, "invalid_request", "`id` must be a string of at most 256 bytes or an integer");
  const json::value id = *parsed_id;
  if (!authed_) return error(id, "unauthorized", "an API key is required: send {\"auth\": KEY} first");
  std::string key = json::serialize(id);
  if (flights_.contains(key)) return error(id, "duplicate_id", "a request with this id is still in flight");

  parsed_request p;
  if (std::string why = read_request(o, dialect::line, p); !why.empty()) {
    eng_->note_rejected();
    return error(id, "invalid_request", why);
  }

  flight f{.engine_id = 0, .id = id, .stream = p.stream, .logprobs = p.want_logprobs};
  try {
    f.parser = eng_->output_parser(p.req);
  } catch (const model::model_error& e) {
    eng_->note_rejected();
    return error(id, "invalid_request", std::string("`messages` cannot be rendered: ") + e.what());
  }
  std::weak_ptr<line_session> weak = weak_from_this();
  const generate_request copy = p.req;  // for the message, should the engine refuse it
  auto submitted = eng_->submit(std::move(p.req), [weak, key](const stream_event& e) {
    auto self = weak.lock();
    if (!self) return;
    self->hooks_.post([self, key, e] { self->on_event(key, e); });
  });
  if (!submitted) {
    const error_code ec = submitted.error();
    const std::string why = eng_->explain(copy);
    return error(id, code_name(ec), why.empty() ? ec.message() : why);
  }
  f.engine_id = *submitted;
  flights_.emplace(std::move(key), std::move(f));
}

void line_session::cancel(const json::value& id) {
  const auto it = flights_.find(json::serialize(id));
  if (it == flights_.end()) return error(id, "unknown_id", "no request with this id is in flight");
  eng_->cancel(it->second.engine_id);
}

void line_session::on_close() {
  if (closed_) return;
  closed_ = true;
  for (const auto& [key, f] : flights_) eng_->cancel(f.engine_id);
}

void line_session::on_event(const std::string& key, const stream_event& e) {
  const auto it = flights_.find(key);
  if (it == flights_.end() || it->second.engine_id != e.request_id) return;
  flight& f = it->second;

  if (e.done && e.finish_reason == "error") {
    error(f.id, code_name(e.error), e.error.message());
    flights_.erase(it);
    return;
  }
  if (f.parser) f.output += e.text;
  if (!f.stream) {
    f.text += e.text;
    f.tokens.insert(f.tokens.end(), e.tokens.begin(), e.tokens.end());
    if (f.logprobs) {
      f.token_logprobs.insert(f.token_logprobs.end(), e.logprobs.begin(), e.logprobs.end());
      f.top.insert(f.top.end(), e.top_logprobs.begin(), e.top_logprobs.end());
    }
  }
  const bool has_output = !e.tokens.empty() || !e.text.empty();
  if (f.stream && has_output) {
    json::object chunk{{"id", f.id}, {"text", valid_utf8(e.text)}, {"tokens", json::value_from(e.tokens)}};
    if (f.logprobs) {
      chunk["logprobs"] = json::value_from(e.logprobs);
      if (!e.top_logprobs.empty() && !e.top_logprobs.front().empty()) {
        chunk["top_logprobs"] = top_logprobs_json(*eng_, e.top_logprobs);
      }
    }
    send(chunk);
  }
  if (!e.done) return;

  json::object done{{"id", f.id}, {"done", true}, {"finish_reason", e.finish_reason}};
  if (f.parser) {  // the output split as the template writes it: reasoning, content, tool calls
    const model::chat_output_parser::piece piece = f.parser->push(f.output, true);
    const std::vector<model::parsed_tool_call>& calls = f.parser->tool_calls();
    done["reasoning_content"] = valid_utf8(piece.reasoning);
    done["content"] = valid_utf8(piece.content);
    if (!calls.empty()) {
      json::array tool_calls;
      for (const model::parsed_tool_call& c : calls) {
        tool_calls.push_back(json::object{{"name", valid_utf8(c.name)}, {"arguments", valid_utf8(c.arguments)}});
      }
      done["tool_calls"] = std::move(tool_calls);
      if (e.finish_reason == "stop") done["finish_reason"] = "tool_calls";
    }
  }
  if (!f.stream) {
    done["text"] = valid_utf8(f.text);
    done["tokens"] = json::value_from(f.tokens);
    if (f.logprobs) {
      done["logprobs"] = json::value_from(f.token_logprobs);
      if (!f.top.empty() && !f.top.front().empty()) done["top_logprobs"] = top_logprobs_json(*eng_, f.top);
    }
  }
  done["usage"] = json::object{{"prompt_tokens", e.usage.prompt_tokens},
                               {"completion_tokens", e.usage.completion_tokens},
                               {"prompt_tokens_details", json::object{{"cached_tokens", e.usage.cached_prompt_tokens}}}};
  done["timings"] = json::object{{"queue_ms", e.timings.queue_ms},
                                 {"ttft_ms", e.timings.ttft_ms},
                                 {"total_ms", e.timings.total_ms},
                                 {"mean_itl_ms", e.timings.mean_itl_ms}};
  send(done);
  flights_.erase(it);
}

}  // namespace anvil::proto
