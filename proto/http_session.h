// One HTTP connection's exchanges, without the socket: a parsed request in, a response (or an SSE
// stream) out, through hooks. The network shell (http_server.cpp) parses HTTP with Beast, feeds
// complete requests here one at a time and carries the output; tests can drive it directly.
// Every method runs on the connection's strand; engine events reach it through the `post` hook,
// which must run them there too (never inline).
//
// Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
// GET /metrics, POST /tokenize, POST /detokenize (HTTP.md has the shapes).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/json/fwd.hpp>

#include "engine/engine.h"

namespace anvil::proto {

struct http_request {
  std::string method;         // "GET", "POST", ...
  std::string target;         // the path, with any query
  std::string authorization;  // the Authorization header; "" when absent
  std::string body;
};

struct http_response {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::string allow;  // 405: the methods the path takes (the Allow header)
};

struct http_session_hooks {
  std::function<void(http_response)> respond;             // the whole answer: the exchange is over
  std::function<void()> start_stream;                     // 200 text/event-stream, chunked; events follow
  std::function<void(std::string event)> stream;          // one SSE event, "data: ...\n\n"
  std::function<void(bool close)> end_stream;             // the stream is over; close: then close the connection
  std::function<void(std::function<void()>)> post;        // run later on the connection's strand
  std::function<std::vector<std::pair<std::string, std::size_t>>()> connections;  // GET /metrics: open connections
                                                                                 // by protocol (optional)
};

class http_session : public std::enable_shared_from_this<http_session> {
 public:
  http_session(http_session_hooks hooks, std::string api_key);

  // One request; the next only after this one's respond or end_stream. `eng` is null while the
  // server has no engine yet (503 "loading").
  void handle(http_request r, std::shared_ptr<engine> eng);
  // The client is gone: cancel what is in flight; nothing more is sent.
  void on_close();

  bool busy() const { return ex_.has_value() || awaiting_stats_; }

 private:
  struct choice {
    std::uint64_t engine_id = 0;
    bool done = false;
    std::string text;                                          // not streaming: the output so far
    std::vector<std::int32_t> tokens;                          // with logprobs: the tokens so far
    std::vector<float> logprobs;
    std::vector<std::vector<sampler::token_logprob>> top;
    std::string finish_reason;
    std::size_t text_offset = 0;                               // completions logprobs: bytes so far
    std::string echo;                                          // completions with echo: its prompt's text
    bool first_of_prompt = false;                              // usage counts its prompt's tokens
    std::optional<model::chat_output_parser> parser;           // chat with tools or a thinking template
  };
  // The request in flight: one completion or chat request, n choices.
  struct exchange {
    std::uint64_t serial = 0;        // tells this exchange's engine events from a finished one's
    std::shared_ptr<engine> eng;
    bool chat = false;
    bool stream = false;
    bool include_usage = false;
    bool want_logprobs = false;
    std::string id;                  // cmpl-... / chatcmpl-...
    std::int64_t created = 0;
    std::vector<choice> choices;
    std::size_t remaining = 0;       // choices not done
    std::int64_t prompt_tokens = 0;
    std::int64_t completion_tokens = 0;
    std::int64_t cached_tokens = 0;  // of prompt_tokens, found in the prefix cache (each prompt's first choice)
    bool started = false;            // streaming: the 200 and the first chunks are out
  };

  void route(const http_request& r, const std::shared_ptr<engine>& eng);
  void completions(const http_request& r, const std::shared_ptr<engine>& eng, bool chat);
  void models(const engine& eng);
  void metrics(const std::shared_ptr<engine>& eng);
  void tokenize(const http_request& r, const engine& eng);
  void detokenize(const http_request& r, const engine& eng);

  void on_event(std::uint64_t serial, std::size_t index, const stream_event& e);
  void start_stream();
  void stream_output(std::size_t index, const stream_event& e);
  void stream_finish(std::size_t index, const stream_event& e);
  void stream_delta(std::size_t index, boost::json::object delta);
  void fail(unsigned status, std::string_view message, std::string_view code);  // ends the exchange
  void respond_json(const boost::json::object& o, unsigned status = 200);
  void respond_error(unsigned status, std::string_view message, std::string_view code, std::string allow = {});
  void send_chunk(const boost::json::object& o);
  boost::json::object chunk_base() const;
  void finish_exchange();
  void cancel_open_choices();

  http_session_hooks hooks_;
  std::string api_key_;
  std::optional<exchange> ex_;
  std::uint64_t serial_ = 0;
  bool awaiting_stats_ = false;   // GET /metrics waits for engine stats
  bool closed_ = false;
};

}  // namespace anvil::proto
