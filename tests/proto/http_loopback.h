// The HTTP test harness: a real http_server with a real engine on io threads, one request per
// fresh loopback connection (a Beast client, in http_loopback.cpp), and the SSE payloads of a
// streamed body. Shared by the HTTP API suites.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "proto/http_server.h"
#include "tests/model/fixtures.h"

namespace anvil::http_loopback {

namespace json = boost::json;

inline engine_config tiny_config() {
  engine_config c;
  c.model_path = model::testing::chatml_fixture();
  c.kv_budget_bytes = 8u << 20;
  c.max_batch_tokens = 256;
  c.max_seqs = 32;
  c.max_prefill_chunk = 64;
  c.max_model_len = 1024;
  return c;
}

// Header names compare case-insensitively, as HTTP's do.
struct header_less {
  bool operator()(const std::string& a, const std::string& b) const;
};

struct reply {
  unsigned status = 0;
  std::string content_type;
  std::string body;
  std::map<std::string, std::string, header_less> headers;
  mutable std::optional<json::value> parsed;
  std::string header(const std::string& name) const {  // "" when absent
    const auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
  const json::value& json() const {  // parsed once, so references into it stay valid
    if (!parsed) parsed = json::parse(body);
    return *parsed;
  }
};

// A running server on its own io threads; the engine is optional (set_engine later). Beast and
// Asio live in http_loopback.cpp, so the suites that include this compile quickly.
struct server {
  std::shared_ptr<engine> eng;
  std::unique_ptr<proto::http_server> srv;

  explicit server(std::optional<engine_config> cfg = tiny_config(), proto::http_server_options opt = {});
  ~server();
  std::uint16_t port() const;

  // One request on a fresh connection; `method` as sent ("GET", "POST", "OPTIONS", ...).
  reply call(std::string method, std::string target, std::string body = {},
             std::vector<std::pair<std::string, std::string>> hdrs = {});
  reply post(std::string target, const json::value& body, std::vector<std::pair<std::string, std::string>> hdrs = {}) {
    return call("POST", std::move(target), json::serialize(body), std::move(hdrs));
  }
  reply get(std::string target, std::vector<std::pair<std::string, std::string>> hdrs = {}) {
    return call("GET", std::move(target), {}, std::move(hdrs));
  }
  // Raw bytes in, everything the server sends until it closes.
  std::string raw(const std::string& bytes);
  // Stats once the engine is quiet and every block is back; gives up after a minute.
  engine_stats settled();

 private:
  struct io;
  std::unique_ptr<io> io_;
};

// The `data:` payloads of an SSE body, in order.
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < body.size()) {
    const std::size_t end = body.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "an event without its blank line";
    if (end == std::string::npos) break;
    const std::string ev = body.substr(at, end - at);
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    out.push_back(ev.substr(6));
    at = end + 2;
  }
  return out;
}

// What a streamed chat answer's deltas add up to (its first choice): content, reasoning, the
// tool calls as sent, and the finish reason; every event but the final [DONE] is a chunk.
struct chat_stream {
  std::string content, reasoning, finish;
  std::vector<json::object> tool_calls;
};
inline chat_stream streamed_chat(const std::vector<std::string>& events) {
  chat_stream s;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    const json::value chunk = json::parse(events[i]);
    const json::object& ch = chunk.at("choices").at(0).as_object();
    const json::object& delta = ch.at("delta").as_object();
    if (const json::value* c = delta.if_contains("content")) s.content += c->as_string();
    if (const json::value* c = delta.if_contains("reasoning_content")) s.reasoning += c->as_string();
    if (const json::value* tc = delta.if_contains("tool_calls")) {
      for (const json::value& c : tc->as_array()) s.tool_calls.push_back(c.as_object());
    }
    if (!ch.at("finish_reason").is_null()) s.finish = ch.at("finish_reason").as_string();
  }
  return s;
}

}  // namespace anvil::http_loopback
