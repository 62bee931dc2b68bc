#include "proto/http_session.h"

#include <cctype>
#include <ctime>
#include <random>

#include <boost/json.hpp>

#include "model/chat/chat_template.h"
#include "model/model_error.h"
#include "proto/errors.h"
#include "proto/metrics_text.h"
#include "proto/openai_json.h"
#include "proto/request_json.h"

namespace anvil::proto {

namespace json = boost::json;

namespace {

std::int64_t unix_now() { return static_cast<std::int64_t>(std::time(nullptr)); }

std::string_view path_of(std::string_view target) { return target.substr(0, target.find('?')); }

// OpenAI clients send no seed for "random": each such request gets its own.
std::uint64_t random_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng() >> 1;
}

bool has_key(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  return v && !v->is_null();
}

const char* sse_done = "data: [DONE]\n\n";

// One OpenAI tool call, with an id of its own (in the form the model's template accepts back);
// streamed deltas carry the call's index.
json::object tool_call_json(const model::parsed_tool_call& call, std::size_t i, bool with_index,
                            const model::chat_syntax& syntax) {
  json::object o{{"id", model::new_tool_call_id(syntax)},
                 {"type", "function"},
                 {"function", json::object{{"name", valid_utf8(call.name)}, {"arguments", valid_utf8(call.arguments)}}}};
  if (with_index) o["index"] = i;
  return o;
}

}  // namespace

http_session::http_session(http_session_hooks hooks, std::string api_key)
    : hooks_(std::move(hooks)), api_key_(std::move(api_key)) {}

void http_session::handle(http_request r, std::shared_ptr<engine> eng) {
  if (closed_) return;
  const std::string_view path = path_of(r.target);
  if (path == "/health") {
    if (r.method != "GET" && r.method != "HEAD") return respond_error(405, "use GET", "method_not_allowed", "GET, HEAD");
    if (!eng) return respond_json(json::object{{"status", "loading"}}, 503);
    if (!eng->healthy()) return respond_json(json::object{{"status", "unhealthy"}}, 503);
    return respond_json(json::object{{"status", "ok"}});
  }
  if (!api_key_.empty()) {
    constexpr std::string_view bearer = "Bearer ";
    const std::string_view auth = r.authorization;
    // The scheme is case-insensitive (RFC 9110); one space, then the key exactly.
    const auto same_scheme = [&] {
      for (std::size_t i = 0; i < bearer.size(); ++i) {
        if (std::tolower(static_cast<unsigned char>(auth[i])) != std::tolower(static_cast<unsigned char>(bearer[i]))) return false;
      }
      return true;
    };
    const bool ok = auth.size() > bearer.size() && same_scheme() &&
                    constant_time_equal(auth.substr(bearer.size()), api_key_);
    if (!ok) return respond_error(401, "a valid API key is required (Authorization: Bearer KEY)", "invalid_api_key");
  }
  route(r, eng);
}

void http_session::route(const http_request& r, const std::shared_ptr<engine>& eng) {
  struct endpoint {
    std::string_view path, method;
  };
  static constexpr endpoint endpoints[] = {{"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
                                           {"/v1/models", "GET"},       {"/metrics", "GET"},
                                           {"/tokenize", "POST"},       {"/detokenize", "POST"}};
  const std::string_view path = path_of(r.target);
  const endpoint* found = nullptr;
  for (const endpoint& e : endpoints) {
    if (e.path == path) found = &e;
  }
  if (!found) return respond_error(404, "no such endpoint: " + std::string(path.substr(0, 200)), "not_found");
  if (r.method != found->method) {
    return respond_error(405, std::string(path) + " takes " + std::string(found->method), "method_not_allowed",
                         std::string(found->method));
  }
  if (!eng) return respond_error(503, "the model is still loading", "loading");

  if (path == "/v1/completions") return completions(r, eng, false);
  if (path == "/v1/chat/completions") return completions(r, eng, true);
  if (path == "/v1/models") return models(*eng);
  if (path == "/metrics") return metrics(eng);
  if (path == "/tokenize") return tokenize(r, *eng);
  return detokenize(r, *eng);
}

// ---- small answers ---------------------------------------------------------------------------

void http_session::respond_json(const json::object& o, unsigned status) {
  if (closed_) return;
  hooks_.respond(http_response{status, "application/json", json::serialize(o), {}});
}

void http_session::respond_error(unsigned status, std::string_view message, std::string_view code, std::string allow) {
  if (closed_) return;
  hooks_.respond(http_response{status, "application/json", openai_error_body(status, message, code), std::move(allow)});
}

void http_session::models(const engine& eng) {
  json::object m{{"id", eng.model_name()},   {"object", "model"},       {"created", unix_now()},
                 {"owned_by", "anvil"},      {"root", eng.model_name()}, {"max_model_len", eng.max_model_len()}};
  respond_json(json::object{{"object", "list"}, {"data", json::array{std::move(m)}}});
}

void http_session::metrics(const std::shared_ptr<engine>& eng) {
  awaiting_stats_ = true;
  const std::uint64_t serial = ++serial_;
  // Captures no engine and locks no session off the strand: the last reference to either must
  // never be dropped on the engine's own threads.
  eng->async_stats([weak = weak_from_this(), post = hooks_.post, serial](error_code ec, engine_stats s) {
    post([weak, serial, ec, s = std::move(s)] {
      auto self = weak.lock();
      if (!self || !self->awaiting_stats_ || self->serial_ != serial) return;
      self->awaiting_stats_ = false;
      if (ec) return self->respond_error(503, "engine statistics are unavailable: " + ec.message(), "stopped");
      if (self->closed_) return;
      const connection_counts conns = self->hooks_.connections ? self->hooks_.connections() : connection_counts{};
      self->hooks_.respond(http_response{200, metrics_content_type, metrics_text(s, conns), {}});
    });
  });
}

namespace {

// The body as a JSON object, or a message saying why not.
std::string parse_body(std::string_view body, json::value& out) {
  json::error_code ec;
  out = json::parse(body, ec);
  if (ec) return "the body is not valid JSON: " + ec.message();
  if (!out.is_object()) return "the body must be a JSON object";
  return {};
}

}  // namespace

void http_session::tokenize(const http_request& r, const engine& eng) {
  json::value v;
  if (std::string why = parse_body(r.body, v); !why.empty()) return respond_error(400, why, "invalid_request");
  const json::object& o = v.get_object();
  bool add_special = !has_key(o, "messages");  // as the engine feeds each: BOS for prompts, the template's own for chats
  if (const json::value* a = o.if_contains("add_special_tokens"); a && !a->is_null()) {
    if (!a->is_bool()) return respond_error(400, "`add_special_tokens` must be true or false", "invalid_request");
    add_special = a->get_bool();
  }
  std::string text;
  if (has_key(o, "messages")) {
    parsed_request p;
    if (std::string why = read_request(o, dialect::chat, p); !why.empty()) return respond_error(400, why, "invalid_request");
    const model::chat_template* tmpl = eng.chat_template();
    if (!tmpl) return respond_error(400, "the model has no usable chat template", "invalid_request");
    try {
      text = tmpl->render(model::chat_inputs{.messages = p.req.messages,
                                             .tools_json = p.req.tools_json,
                                             .template_kwargs_json = p.req.chat_template_kwargs_json});
    } catch (const model::model_error& e) {
      return respond_error(400, e.what(), "invalid_request");
    }
  } else if (const json::value* p = o.if_contains("prompt"); p && p->is_string()) {
    text = std::string(p->get_string());
  } else {
    return respond_error(400, "`prompt` (a string) or `messages` is required", "invalid_request");
  }
  const std::vector<std::int32_t> tokens = eng.tokenizer().encode(text, add_special, true);
  respond_json(json::object{{"tokens", json::value_from(tokens)},
                            {"count", tokens.size()},
                            {"max_model_len", eng.max_model_len()}});
}

void http_session::detokenize(const http_request& r, const engine& eng) {
  json::value v;
  if (std::string why = parse_body(r.body, v); !why.empty()) return respond_error(400, why, "invalid_request");
  const json::value* t = v.get_object().if_contains("tokens");
  if (!t || !t->is_array()) return respond_error(400, "`tokens` must be an array of token ids", "invalid_request");
  std::vector<std::int32_t> ids;
  const std::int64_t vocab = eng.tokenizer().n_vocab();
  for (const json::value& x : t->get_array()) {
    if (!x.is_int64() && !x.is_uint64()) return respond_error(400, "`tokens` must be an array of token ids", "invalid_request");
    const std::int64_t id = x.is_int64() ? x.get_int64() : -1;
    if (id < 0 || id >= vocab) {
      return respond_error(400, "`tokens` holds an id outside the vocabulary (" + std::to_string(vocab) + " tokens)",
                           "invalid_request");
    }
    ids.push_back(std::int32_t(id));
  }
  respond_json(json::object{{"prompt", valid_utf8(eng.tokenizer().decode(ids))}});
}

// ---- completions -----------------------------------------------------------------------------

void http_session::completions(const http_request& r, const std::shared_ptr<engine>& eng, bool chat) {
  // A refusal before submit counts in the engine's rejected requests, as submit's own do.
  const auto refuse = [&](const std::string& why, std::string_view code) {
    eng->note_rejected();
    respond_error(400, why, code);
  };
  json::value v;
  if (std::string why = parse_body(r.body, v); !why.empty()) return refuse(why, "invalid_request");
  const json::object& o = v.get_object();
  parsed_request p;
  if (std::string why = read_request(o, chat ? dialect::chat : dialect::completions, p); !why.empty()) {
    return refuse(why, "invalid_request");
  }
  if (!has_key(o, "seed")) p.req.sampling.seed = random_seed();
  // One engine request per prompt (a completions request may list several) and choice.
  std::vector<generate_request> per_prompt;
  for (std::size_t j = 0; j < std::max<std::size_t>(p.prompts.size(), 1); ++j) {
    generate_request& g = per_prompt.emplace_back(p.req);
    if (j < p.prompts.size()) {
      g.prompt = p.prompts[j].text;
      g.prompt_tokens = p.prompts[j].tokens;
    }
    // Check each before anything is queued, so a bad request gets its reason and no choice runs.
    if (std::string why = eng->explain(g); !why.empty()) {
      const bool too_long = why.find("context holds") != std::string::npos;
      if (p.prompts.size() > 1) why = "prompt " + std::to_string(j) + ": " + why;
      return refuse(why, too_long ? "context_overflow" : "invalid_request");
    }
  }

  // Chat output is split into reasoning, content and tool calls where the template has the syntax.
  std::optional<model::chat_output_parser> parser;
  try {
    parser = eng->output_parser(p.req);
  } catch (const model::model_error& e) {
    return refuse(std::string("`messages` cannot be rendered: ") + e.what(), "invalid_request");
  }

  exchange& ex = ex_.emplace(exchange{});  // not emplace(): clang 14 rejects it for a nested struct with initialisers
  ex.serial = ++serial_;
  ex.eng = eng;
  ex.chat = chat;
  ex.stream = p.stream;
  ex.include_usage = p.include_usage;
  ex.want_logprobs = p.want_logprobs;
  ex.id = new_response_id(chat ? "chatcmpl" : "cmpl");
  ex.created = unix_now();
  const std::size_t n = std::size_t(p.n);
  ex.choices.resize(per_prompt.size() * n);  // choice k of prompt j is index j * n + k
  ex.remaining = ex.choices.size();
  for (std::size_t i = 0; i < ex.choices.size(); ++i) {
    choice& c = ex.choices[i];
    const generate_request& g = per_prompt[i / n];
    if (!chat && p.echo) c.echo = g.prompt.empty() ? eng->tokenizer().decode(g.prompt_tokens) : g.prompt;
    c.text_offset = c.echo.size();
    c.first_of_prompt = i % n == 0;
    c.parser = parser;
  }

  const std::uint64_t seed = p.req.sampling.seed, serial = ex.serial;
  for (std::size_t i = 0; i < ex.choices.size(); ++i) {
    generate_request req = per_prompt[i / n];
    req.sampling.seed = seed + i % n;
    auto submitted = eng->submit(std::move(req), [weak = weak_from_this(), post = hooks_.post, serial,
                                                  i](const stream_event& e) {
      post([weak, serial, i, e] {
        if (auto self = weak.lock()) self->on_event(serial, i, e);
      });
    });
    if (!submitted) {
      const error_code ec = submitted.error();
      const std::string why = eng->explain(per_prompt[i / n]);
      return fail(http_status(ec), why.empty() ? ec.message() : why, code_name(ec));
    }
    ex.choices[i].engine_id = *submitted;
  }
}

void http_session::cancel_open_choices() {
  if (!ex_) return;
  for (const choice& c : ex_->choices) {
    if (!c.done && c.engine_id != 0) ex_->eng->cancel(c.engine_id);
  }
}

void http_session::finish_exchange() { ex_.reset(); }

void http_session::fail(unsigned status, std::string_view message, std::string_view code) {
  cancel_open_choices();
  const bool started = ex_ && ex_->started;
  finish_exchange();
  if (closed_) return;
  if (!started) return respond_error(status, message, code);
  // Mid-stream: the status line is long gone; say it in the stream and hang up.
  hooks_.stream("data: " + openai_error_body(status, message, code) + "\n\n");
  hooks_.end_stream(true);
}

void http_session::on_close() {
  if (closed_) return;
  closed_ = true;
  cancel_open_choices();
  finish_exchange();
  awaiting_stats_ = false;
}

json::object http_session::chunk_base() const {
  return json::object{{"id", ex_->id},
                      {"object", ex_->chat ? "chat.completion.chunk" : "text_completion"},
                      {"created", ex_->created},
                      {"model", ex_->eng->model_name()}};
}

void http_session::send_chunk(const json::object& o) {
  if (!closed_) hooks_.stream("data: " + json::serialize(o) + "\n\n");
}

void http_session::on_event(std::uint64_t serial, std::size_t index, const stream_event& e) {
  if (closed_ || !ex_ || ex_->serial != serial || index >= ex_->choices.size()) return;
  exchange& ex = *ex_;
  choice& c = ex.choices[index];
  if (c.done) return;

  if (e.done && (e.finish_reason == "error" || e.finish_reason == "cancelled")) {
    c.done = true;
    const error_code ec = e.error ? e.error : make_error_code(errc::cancelled);
    return fail(http_status(ec), ec.message(), code_name(ec));
  }
  if (ex.stream) {
    if (!ex.started) start_stream();
    if (!e.text.empty() || (ex.want_logprobs && !e.tokens.empty()) || (e.done && c.parser)) stream_output(index, e);
  } else {
    c.text += e.text;
    if (ex.want_logprobs) {
      c.tokens.insert(c.tokens.end(), e.tokens.begin(), e.tokens.end());
      c.logprobs.insert(c.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
      c.top.insert(c.top.end(), e.top_logprobs.begin(), e.top_logprobs.end());
    }
  }
  if (!e.done) return;

  c.done = true;
  c.finish_reason = e.finish_reason;
  if (c.first_of_prompt) {  // each prompt counts once, as its first choice was admitted
    ex.prompt_tokens += e.usage.prompt_tokens;
    ex.cached_tokens += e.usage.cached_prompt_tokens;
  }
  ex.completion_tokens += e.usage.completion_tokens;
  --ex.remaining;
  if (ex.stream) stream_finish(index, e);
  if (ex.remaining > 0) return;

  const json::object usage{{"prompt_tokens", ex.prompt_tokens},
                           {"completion_tokens", ex.completion_tokens},
                           {"total_tokens", ex.prompt_tokens + ex.completion_tokens},
                           {"prompt_tokens_details", json::object{{"cached_tokens", ex.cached_tokens}}}};
  if (ex.stream) {
    if (ex.include_usage) {
      json::object last = chunk_base();
      last["choices"] = json::array{};
      last["usage"] = usage;
      send_chunk(last);
    }
    finish_exchange();
    if (!closed_) {
      hooks_.stream(sse_done);
      hooks_.end_stream(false);
    }
    return;
  }

  json::array choices;
  const model::tokenizer& tok = ex.eng->tokenizer();
  for (std::size_t i = 0; i < ex.choices.size(); ++i) {
    choice& ch = ex.choices[i];
    json::value logprobs = nullptr;
    const token_logprobs_view lp{ch.tokens, ch.logprobs, ch.top};
    if (ex.want_logprobs) {
      logprobs = ex.chat ? json::value(json::object{{"content", chat_logprobs_content(tok, lp)}})
                         : json::value(completion_logprobs(tok, lp, ch.text_offset));
    }
    json::object out{{"index", i}};
    std::string finish_reason = ch.finish_reason;
    if (ch.parser) {
      const model::chat_output_parser::piece piece = ch.parser->push(ch.text, true);
      const std::vector<model::parsed_tool_call>& calls = ch.parser->tool_calls();
      json::object message{{"role", "assistant"}};
      message["content"] = calls.empty() || !piece.content.empty() ? json::value(valid_utf8(piece.content)) : json::value(nullptr);
      if (!piece.reasoning.empty()) message["reasoning_content"] = valid_utf8(piece.reasoning);
      if (!calls.empty()) {
        json::array tool_calls;
        for (std::size_t k = 0; k < calls.size(); ++k) tool_calls.push_back(tool_call_json(calls[k], k, false, ex.eng->chat_syntax()));
        message["tool_calls"] = std::move(tool_calls);
        if (finish_reason == "stop") finish_reason = "tool_calls";
      }
      out["message"] = std::move(message);
    } else if (ex.chat) {
      out["message"] = json::object{{"role", "assistant"}, {"content", valid_utf8(ch.text)}};
    } else {
      out["text"] = valid_utf8(ch.echo + ch.text);
    }
    out["logprobs"] = std::move(logprobs);
    out["finish_reason"] = finish_reason;
    choices.push_back(std::move(out));
  }
  json::object body{{"id", ex.id},
                    {"object", ex.chat ? "chat.completion" : "text_completion"},
                    {"created", ex.created},
                    {"model", ex.eng->model_name()},
                    {"choices", std::move(choices)},
                    {"usage", usage}};
  finish_exchange();
  respond_json(body);
}

// The 200 goes out with the first event, so a request the engine refuses after queueing
// (a full queue) still gets its own status. Chat opens each choice with the assistant role;
// completions with echo open with the prompt.
void http_session::start_stream() {
  exchange& ex = *ex_;
  ex.started = true;
  if (closed_) return;
  hooks_.start_stream();
  for (std::size_t i = 0; i < ex.choices.size(); ++i) {
    json::object ch{{"index", i}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (ex.chat) {
      ch["delta"] = json::object{{"role", "assistant"}, {"content", ""}};
    } else if (!ex.choices[i].echo.empty()) {
      ch["text"] = valid_utf8(ex.choices[i].echo);
    } else {
      continue;
    }
    json::object chunk = chunk_base();
    chunk["choices"] = json::array{std::move(ch)};
    send_chunk(chunk);
  }
}

void http_session::stream_output(std::size_t index, const stream_event& e) {
  exchange& ex = *ex_;
  choice& c = ex.choices[index];
  json::object ch{{"index", index}};
  if (c.parser) {
    const model::chat_output_parser::piece piece = c.parser->push(e.text, e.done);
    json::object delta;
    if (!piece.reasoning.empty()) delta["reasoning_content"] = valid_utf8(piece.reasoning);
    if (!piece.content.empty()) delta["content"] = valid_utf8(piece.content);
    if (delta.empty() && !(ex.want_logprobs && !e.tokens.empty())) return;  // held back: it may open a marker
    ch["delta"] = std::move(delta);
  } else if (ex.chat) {
    ch["delta"] = json::object{{"content", valid_utf8(e.text)}};
  } else {
    ch["text"] = valid_utf8(e.text);
  }
  ch["logprobs"] = nullptr;
  if (ex.want_logprobs) {
    const token_logprobs_view lp{e.tokens, e.logprobs, e.top_logprobs};
    const model::tokenizer& tok = ex.eng->tokenizer();
    ch["logprobs"] = ex.chat ? json::value(json::object{{"content", chat_logprobs_content(tok, lp)}})
                             : json::value(completion_logprobs(tok, lp, ex.choices[index].text_offset));
  }
  ch["finish_reason"] = nullptr;
  json::object chunk = chunk_base();
  chunk["choices"] = json::array{std::move(ch)};
  send_chunk(chunk);
}

void http_session::stream_delta(std::size_t index, json::object delta) {
  json::object chunk = chunk_base();
  chunk["choices"] = json::array{json::object{{"index", index}, {"delta", std::move(delta)}, {"logprobs", nullptr},
                                              {"finish_reason", nullptr}}};
  send_chunk(chunk);
}

void http_session::stream_finish(std::size_t index, const stream_event& e) {
  const choice& c = ex_->choices[index];
  const std::vector<model::parsed_tool_call> calls = c.parser ? c.parser->tool_calls() : std::vector<model::parsed_tool_call>{};
  for (std::size_t i = 0; i < calls.size(); ++i) {  // each call whole, in one delta
    stream_delta(index, json::object{{"tool_calls", json::array{tool_call_json(calls[i], i, true, ex_->eng->chat_syntax())}}});
  }
  json::object ch{{"index", index}};
  if (ex_->chat) {
    ch["delta"] = json::object{};
  } else {
    ch["text"] = "";
  }
  ch["logprobs"] = nullptr;
  ch["finish_reason"] = !calls.empty() && e.finish_reason == "stop" ? "tool_calls" : e.finish_reason;
  json::object chunk = chunk_base();
  chunk["choices"] = json::array{std::move(ch)};
  send_chunk(chunk);
}

}  // namespace anvil::proto
