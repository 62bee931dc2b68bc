// The HTTP test harness: a real http_server with a real engine on io threads, one request per
// fresh loopback connection (Beast client), and the SSE payloads of a streamed body. Shared by the
// HTTP API suites; header-only, so each suite is one translation unit.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "proto/http_server.h"
#include "tests/model/fixtures.h"

namespace anvil::http_loopback {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace json = boost::json;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

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

struct reply {
  unsigned status = 0;
  std::string content_type;
  std::string body;
  http::fields headers;
  mutable std::optional<json::value> parsed;
  const json::value& json() const {  // parsed once, so references into it stay valid
    if (!parsed) parsed = json::parse(body);
    return *parsed;
  }
};

// A running server on its own io threads; the engine is optional (set_engine later).
struct server {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::shared_ptr<engine> eng;
  std::unique_ptr<proto::http_server> srv;
  std::vector<std::thread> threads;

  explicit server(std::optional<engine_config> cfg = tiny_config(), proto::http_server_options opt = {}) {
    srv = std::make_unique<proto::http_server>(io, std::move(opt));
    if (cfg) {
      eng = engine::create(*cfg);
      srv->set_engine(eng);
    }
    for (int i = 0; i < 2; ++i) threads.emplace_back([this] { io.run(); });
  }
  ~server() {
    srv->stop();
    if (eng) eng->async_stop(asio::use_future).get();
    work.reset();
    io.stop();
    for (auto& t : threads) t.join();
    srv.reset();
  }
  std::uint16_t port() const { return srv->port(); }

  // One request on a fresh connection.
  reply call(http::verb method, std::string target, std::string body = {}, std::vector<std::pair<std::string, std::string>> hdrs = {}) {
    asio::io_context cio;
    tcp::socket sock(cio);
    sock.connect({asio::ip::make_address("127.0.0.1"), port()});
    http::request<http::string_body> req{method, target, 11};
    req.set(http::field::host, "localhost");
    for (auto& [k, v] : hdrs) req.set(k, v);
    if (!body.empty() || method == http::verb::post) {
      req.set(http::field::content_type, "application/json");
      req.body() = std::move(body);
      req.prepare_payload();
    }
    http::write(sock, req);
    beast::flat_buffer buf;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64u << 20);
    http::read(sock, buf, parser);
    auto& res = parser.get();
    reply r{res.result_int(), std::string(res[http::field::content_type]), res.body(), res.base(), {}};
    return r;
  }
  reply post(std::string target, const json::value& body, std::vector<std::pair<std::string, std::string>> hdrs = {}) {
    return call(http::verb::post, std::move(target), json::serialize(body), std::move(hdrs));
  }
  reply get(std::string target, std::vector<std::pair<std::string, std::string>> hdrs = {}) {
    return call(http::verb::get, std::move(target), {}, std::move(hdrs));
  }

  // Raw bytes in, everything the server sends until it closes.
  std::string raw(const std::string& bytes) {
    asio::io_context cio;
    tcp::socket sock(cio);
    sock.connect({asio::ip::make_address("127.0.0.1"), port()});
    asio::write(sock, asio::buffer(bytes));
    std::string out;
    boost::system::error_code ec;
    asio::read(sock, asio::dynamic_buffer(out), ec);
    return out;
  }

  // Stats once the engine is quiet and every block is back; gives up after a minute.
  engine_stats settled() {
    engine_stats s = eng->stats();
    for (int i = 0; i < 6000 && (s.kv.counts.in_use != 0 || s.sched.running + s.sched.waiting != 0 || s.live_requests != 0); ++i) {
      std::this_thread::sleep_for(10ms);
      s = eng->stats();
    }
    return s;
  }
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
