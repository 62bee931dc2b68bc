// Fake servers for the anvil-bench tests, on loopback with a port chosen by the system, each on
// its own thread and io_context (C++20 coroutines, as in Asio's cpp20 examples).
//
// fake_line_server speaks the TCP line protocol: per request, max_tokens chunks one token each
// (gap apart), then a done line with usage. Text prompts may carry markers: "FAIL" (an error
// line after the first chunk), "REJECT" (an error line at once), "SLOW" (never answered),
// "DROP" (the connection is closed).
//
// fake_http_server speaks OpenAI HTTP: GET /v1/models, and streaming POST /v1/completions and
// /v1/chat/completions with chunked SSE (two tokens per chunk, one event split across two
// writes), a usage chunk and [DONE]. Markers: "REJECT" (400 with an OpenAI error body), "FAIL"
// (an error event after the first chunk).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

namespace anvil::bench::testing {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace json = boost::json;
using tcp = asio::ip::tcp;

// The io_context, acceptor and thread every fake needs.
class fake_server_base {
 public:
  fake_server_base() : acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {}
  virtual ~fake_server_base() { stop(); }

  std::uint16_t port() const { return port_; }

  std::atomic<int> connections{0};    // connections accepted
  std::atomic<int> requests{0};       // generation requests received
  std::atomic<int> in_flight{0};      // requests being answered now
  std::atomic<int> max_in_flight{0};  // the most at once

 protected:
  void start() {
    port_ = acceptor_.local_endpoint().port();
    asio::co_spawn(io_, accept_loop(), asio::detached);
    thread_ = std::thread([this] { io_.run(); });
  }
  void stop() {
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }
  virtual asio::awaitable<void> session(std::shared_ptr<tcp::socket> s) = 0;

  void enter() {
    ++requests;
    const int now = ++in_flight;
    for (int m = max_in_flight.load(); now > m && !max_in_flight.compare_exchange_weak(m, now);) {
    }
  }

  static asio::awaitable<void> sleep_for(std::chrono::milliseconds d) {
    asio::steady_timer t(co_await asio::this_coro::executor, d);
    co_await t.async_wait(asio::use_awaitable);
  }

  asio::io_context io_;      // the fake's own loop (destroyed last: declared first)
  tcp::acceptor acceptor_;   // 127.0.0.1, port from the system

 private:
  asio::awaitable<void> accept_loop() {
    for (;;) {
      auto s = std::make_shared<tcp::socket>(co_await acceptor_.async_accept(asio::use_awaitable));
      ++connections;
      asio::co_spawn(io_, session(std::move(s)), asio::detached);
    }
  }

  std::uint16_t port_ = 0;  // the bound port
  std::thread thread_;      // runs io_
};

// Knobs of the fake line server.
struct fake_line_config {
  std::chrono::milliseconds gap{1};  // between chunks
  std::string api_key;               // non-empty: {"auth": KEY} required first
  bool fail_all = false;             // every request gets an overloaded error line
};

class fake_line_server : public fake_server_base {
 public:
  explicit fake_line_server(fake_line_config cfg = {}) : cfg_(std::move(cfg)) { start(); }
  ~fake_line_server() override { stop(); }

  std::string url() const { return "tcp://127.0.0.1:" + std::to_string(port()); }
  std::atomic<int> cancels{0};  // cancel lines received

 private:
  static void write(tcp::socket& s, const json::value& v) {
    boost::system::error_code ec;
    asio::write(s, asio::buffer(json::serialize(v) + "\n"), ec);
  }

  asio::awaitable<void> session(std::shared_ptr<tcp::socket> s) override {
    std::string buf;
    bool authed = cfg_.api_key.empty();
    try {
      for (;;) {
        const std::size_t n = co_await asio::async_read_until(*s, asio::dynamic_buffer(buf), '\n', asio::use_awaitable);
        const std::string line = buf.substr(0, n - 1);
        buf.erase(0, n);
        const json::object req = json::parse(line).as_object();
        if (const auto* key = req.if_contains("auth")) {
          if (key->as_string() != cfg_.api_key) {
            write(*s, {{"id", nullptr}, {"error", {{"code", "unauthorized"}, {"message", "wrong api key"}}}});
            s->close();
            co_return;
          }
          authed = true;
          write(*s, {{"auth", "ok"}});
          continue;
        }
        if (req.contains("cancel")) {
          ++cancels;
          continue;
        }
        if (!authed) {
          write(*s, {{"id", req.at("id")}, {"error", {{"code", "unauthorized"}, {"message", "an api key is required"}}}});
          continue;
        }
        asio::co_spawn(io_, answer(s, req), asio::detached);
      }
    } catch (const std::exception&) {
    }
  }

  asio::awaitable<void> answer(std::shared_ptr<tcp::socket> s, json::object req) {
    enter();
    const json::value id = req.at("id");
    const int max_tokens = static_cast<int>(req.at("max_tokens").as_int64());
    std::string text;
    std::int64_t prompt_tokens = 0;
    if (const auto* p = req.if_contains("prompt")) {
      if (p->is_array()) {
        prompt_tokens = std::int64_t(p->as_array().size());
      } else {
        text = std::string(p->as_string());
        prompt_tokens = 1 + std::int64_t(std::count(text.begin(), text.end(), ' '));
      }
    } else {
      prompt_tokens = 3 * std::int64_t(req.at("messages").as_array().size());
    }
    auto has = [&](const char* marker) { return text.find(marker) != std::string::npos; };
    if (cfg_.fail_all || has("REJECT")) {
      write(*s, {{"id", id}, {"error", {{"code", cfg_.fail_all ? "overloaded" : "invalid_request"}, {"message", "rejected by the fake"}}}});
    } else if (has("DROP")) {
      s->close();
    } else if (has("SLOW")) {
      co_await sleep_for(std::chrono::seconds(30));
    } else {
      for (int i = 0; i < max_tokens; ++i) {
        co_await sleep_for(cfg_.gap);
        if (i == 1 && has("FAIL")) {
          write(*s, {{"id", id}, {"error", {{"code", "internal"}, {"message", "injected failure"}}}});
          --in_flight;
          co_return;
        }
        write(*s, {{"id", id}, {"text", " w"}, {"tokens", json::array{100 + i}}});
      }
      write(*s, {{"id", id}, {"done", true}, {"finish_reason", "length"},
                 {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", max_tokens}}}});
    }
    --in_flight;
  }

  fake_line_config cfg_;  // knobs
};

// Knobs of the fake HTTP server.
struct fake_http_config {
  std::chrono::milliseconds gap{1};  // between chunks
  bool usage = true;                 // send the usage chunk when include_usage is asked
  int status = 200;                  // != 200: every completion request fails with it
};

class fake_http_server : public fake_server_base {
 public:
  explicit fake_http_server(fake_http_config cfg = {}) : cfg_(cfg) { start(); }
  ~fake_http_server() override { stop(); }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port()); }

  // What the last completion request carried.
  std::string last_model() {
    std::lock_guard lock(mu_);
    return last_model_;
  }
  std::string last_authorization() {
    std::lock_guard lock(mu_);
    return last_auth_;
  }
  std::string last_body() {
    std::lock_guard lock(mu_);
    return last_body_;
  }

 private:
  static std::string chunk(const std::string& payload) {
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", payload.size());
    return size + payload + "\r\n";
  }

  asio::awaitable<void> session(std::shared_ptr<tcp::socket> s) override {
    beast::flat_buffer buf;
    try {
      for (;;) {
        http::request<http::string_body> req;
        co_await http::async_read(*s, buf, req, asio::use_awaitable);
        if (req.method() == http::verb::get && req.target() == "/v1/models") {
          http::response<http::string_body> res{http::status::ok, 11};
          res.set(http::field::content_type, "application/json");
          res.body() = R"({"object":"list","data":[{"id":"fake-model","object":"model"},{"id":"other"}]})";
          res.keep_alive(req.keep_alive());
          res.prepare_payload();
          co_await http::async_write(*s, res, asio::use_awaitable);
        } else {
          co_await complete(*s, req);
        }
        if (!req.keep_alive()) co_return;
      }
    } catch (const std::exception&) {
    }
  }

  // Writes `data` (built outside any co_await expression: GCC 12 miscompiles string literals
  // inside them).
  static asio::awaitable<void> send(tcp::socket& s, std::string data) {
    co_await asio::async_write(s, asio::buffer(data), asio::use_awaitable);
  }

  asio::awaitable<void> complete(tcp::socket& s, const http::request<http::string_body>& req) {
    enter();
    const json::object body = json::parse(req.body()).as_object();
    const bool chat = req.target().ends_with("chat/completions");
    {
      std::lock_guard lock(mu_);
      last_model_ = std::string(body.at("model").as_string());
      last_auth_ = std::string(req[http::field::authorization]);
      last_body_ = req.body();
    }
    std::string text;
    if (const auto* p = body.if_contains("prompt"); p && p->is_string()) text = std::string(p->as_string());
    if (chat) text = std::string(body.at("messages").as_array().back().as_object().at("content").as_string());
    const int max_tokens = static_cast<int>(body.at("max_tokens").as_int64());
    if (cfg_.status != 200 || text.find("REJECT") != std::string::npos) {
      co_await send(s, error_response(cfg_.status != 200 ? cfg_.status : 400));
      --in_flight;
      co_return;
    }
    co_await send(s, stream_header());
    int sent = 0;
    for (int i = 0; sent < max_tokens; ++i) {
      co_await sleep_for(cfg_.gap);
      if (i == 1 && text.find("FAIL") != std::string::npos) {
        co_await send(s, error_event());
        --in_flight;
        co_return;
      }
      const int n = std::min(2, max_tokens - sent);  // two tokens per chunk
      sent += n;
      const std::string event = text_event(chat, n);
      if (i == 0) {  // split one event across two writes (and two HTTP chunks)
        co_await send(s, chunk(event.substr(0, 9)));
        co_await sleep_for(cfg_.gap);
        co_await send(s, chunk(event.substr(9)));
      } else {
        co_await send(s, chunk(event));
      }
    }
    const bool want_usage = body.contains("stream_options") && body.at("stream_options").as_object().at("include_usage").as_bool();
    if (cfg_.usage && want_usage) co_await send(s, usage_event(1 + std::int64_t(std::count(text.begin(), text.end(), ' ')), sent));
    co_await send(s, done_event());
    --in_flight;
  }

  static std::string error_response(int status) {
    http::response<http::string_body> res{static_cast<http::status>(status), 11};
    res.set(http::field::content_type, "application/json");
    res.body() = R"({"error":{"message":"prompt rejected by the fake","type":"BadRequestError","code":400}})";
    res.keep_alive(true);
    res.prepare_payload();
    std::ostringstream out;
    out << res;
    return out.str();
  }
  static std::string stream_header() {
    return "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n";
  }
  static std::string text_event(bool chat, int n_tokens) {
    const std::string piece = n_tokens == 2 ? " w w" : " w";
    json::object choice{{"index", 0}, {"finish_reason", nullptr}};
    if (chat) {
      choice["delta"] = json::object{{"content", piece}};
    } else {
      choice["text"] = piece;
    }
    return "data: " + json::serialize(json::object{{"choices", json::array{choice}}}) + "\n\n";
  }
  static std::string usage_event(std::int64_t prompt_tokens, std::int64_t completion_tokens) {
    const json::object usage{{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                             {"total_tokens", prompt_tokens + completion_tokens}};
    return chunk("data: " + json::serialize(json::object{{"choices", json::array{}}, {"usage", usage}}) + "\n\n");
  }
  static std::string error_event() {
    return chunk("data: {\"error\":{\"message\":\"injected failure\",\"type\":\"InternalError\"}}\n\n") + "0\r\n\r\n";
  }
  static std::string done_event() { return chunk("data: [DONE]\n\n") + "0\r\n\r\n"; }

  fake_http_config cfg_;    // knobs
  std::mutex mu_;           // guards the last_* fields (written on the fake's thread)
  std::string last_model_;  // "model" of the last completion request
  std::string last_auth_;   // its Authorization header
  std::string last_body_;   // its body
};

}  // namespace anvil::bench::testing
