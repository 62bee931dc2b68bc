// The OpenAI HTTP client (Boost.Beast, HTTP/1.1): one connection per request in flight, kept
// alive and reused from a small pool. A request is a streaming POST (stream_options.include_usage,
// ignore_eos); its body is read as it arrives (buffer_body + async_read_some, so each read is
// timestamped when it lands) and parsed as server-sent events: chunks with text give TTFT and ITL,
// the usage chunk gives the token counts, "[DONE]" ends it. A status other than 200 fails the
// request with the OpenAI error message from the body; so do an error event, a refused or closed
// connection and the per-request timeout.
#include <array>
#include <chrono>
#include <optional>
#include <unordered_set>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "bench/load/client.h"
#include "bench/load/stream_parse.h"
#include "bench/load/wire.h"

namespace anvil::bench {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using steady = std::chrono::steady_clock;
using error_code = boost::system::error_code;

constexpr std::size_t max_error_body = 64 * 1024;  // bytes of a non-200 body kept for its message

double seconds(steady::duration d) { return std::chrono::duration<double>(d).count(); }

steady::duration to_duration(double s) {
  return std::chrono::duration_cast<steady::duration>(std::chrono::duration<double>(s));
}

class http_client;

// One keep-alive connection running one request at a time.
class http_connection : public std::enable_shared_from_this<http_connection> {
 public:
  http_connection(asio::io_context& io, http_client& owner) : io_(io), stream_(io), timer_(io), owner_(owner) {}

  // Sends `body` for a request whose input length is estimated at `estimated_input`.
  void start(std::string body, std::int64_t estimated_input, bench_client::done_fn done);
  // Ends the request in flight (if any) with `why` and closes the connection.
  void abort(const std::string& why);
  bool reusable() const { return open_ && !busy_; }

 private:
  void connect();
  // A kept-alive connection the server had closed before we used it: the request goes once more
  // on a new connection. False when this request already went out on a fresh one.
  bool retry_on_fresh_connection();
  void write();
  void read_header();
  void read_body();
  void on_body_bytes(std::size_t n, steady::time_point now);
  void on_event(const sse_event& e, steady::time_point now);
  void complete();
  void fail(const std::string& why);
  void deliver(request_result r, bool keep);

  asio::io_context& io_;                                    // the run's io_context
  beast::tcp_stream stream_;                                // the connection
  asio::steady_timer timer_;                                // the request's timeout
  http_client& owner_;                                      // target, endpoint, key; takes the connection back
  bool open_ = false;                                       // connected and reusable
  bool busy_ = false;                                       // a request is in flight
  bool reused_ = false;                                     // this request went out on a kept-alive connection
  std::uint64_t generation_ = 0;                            // per request; stale handlers see a change
  http::request<http::string_body> req_;                    // the request being sent
  beast::flat_buffer buffer_;                               // bytes read past what the parser took
  std::optional<http::response_parser<http::buffer_body>> parser_;  // the response being read
  std::array<char, 16384> body_buf_{};                      // one read's body bytes
  bool ok_status_ = false;                                  // the status is 200
  std::string error_body_;                                  // the body of a non-200 answer
  sse_parser sse_;                                          // body bytes -> events
  bench_client::done_fn done_;                              // the request's completion
  steady::time_point sent_;                                 // when it was sent
  std::optional<steady::time_point> last_chunk_;            // the previous chunk with content
  std::optional<steady::time_point> done_at_;               // when "[DONE]" arrived
  request_result result_;                                   // filled as events arrive
  std::int64_t counted_chunks_ = 0;                         // chunks with content (fallback for usage)
  std::int64_t events_ = 0;                                 // SSE events seen (none: not a stream)
};

class http_client final : public bench_client {
 public:
  http_client(asio::io_context& io, const client_config& config) : io_(io), config_(config) {}

  ~http_client() override {
    const std::vector<std::shared_ptr<http_connection>> conns(all_.begin(), all_.end());
    for (auto& c : conns) c->abort("");
  }

  void send(const bench_prompt& prompt, int max_tokens, done_fn done) override {
    if (stopped_) {
      request_result r;
      r.error = stop_reason_;
      r.prompt_tokens = prompt.estimated_input_len;
      asio::post(io_, [done = std::move(done), r = std::move(r)]() mutable { done(std::move(r)); });
      return;
    }
    std::shared_ptr<http_connection> conn;
    while (!idle_.empty() && !conn) {
      conn = std::move(idle_.back());
      idle_.pop_back();
      if (!conn->reusable()) {
        all_.erase(conn);
        conn.reset();
      }
    }
    if (!conn) {
      conn = std::make_shared<http_connection>(io_, *this);
      all_.insert(conn);
    }
    conn->start(http_request_body(prompt, max_tokens, config_.model, is_chat_endpoint(config_.endpoint)),
                prompt.estimated_input_len, std::move(done));
  }

  void shutdown(const std::string& why) override {
    stopped_ = true;
    stop_reason_ = why;
    const std::vector<std::shared_ptr<http_connection>> conns(all_.begin(), all_.end());
    for (auto& c : conns) c->abort(why);
    all_.clear();
    idle_.clear();
  }

  const client_config& config() const { return config_; }

  // A connection finished its request: back to the pool, or dropped.
  void release(const std::shared_ptr<http_connection>& c, bool keep) {
    if (keep && !stopped_) {
      idle_.push_back(c);
    } else {
      all_.erase(c);
    }
  }

 private:
  asio::io_context& io_;                                         // the run's io_context
  client_config config_;                                         // target, endpoint, model, key, timeout
  std::unordered_set<std::shared_ptr<http_connection>> all_;     // every connection alive
  std::vector<std::shared_ptr<http_connection>> idle_;           // kept alive, free for the next request
  bool stopped_ = false;                                         // shutdown() was called
  std::string stop_reason_;                                      // what later sends fail with
};

void http_connection::start(std::string body, std::int64_t estimated_input, bench_client::done_fn done) {
  const auto& cfg = owner_.config();
  busy_ = true;
  ++generation_;
  done_ = std::move(done);
  result_ = request_result{};
  result_.prompt_tokens = estimated_input;
  last_chunk_.reset();
  done_at_.reset();
  counted_chunks_ = 0;
  events_ = 0;
  sse_ = sse_parser{};
  error_body_.clear();
  req_ = http::request<http::string_body>(http::verb::post, cfg.endpoint, 11);
  req_.set(http::field::host, cfg.target.host + ":" + std::to_string(cfg.target.port));
  req_.set(http::field::user_agent, "anvil-bench");
  req_.set(http::field::content_type, "application/json");
  req_.set(http::field::accept, "text/event-stream");
  if (!cfg.api_key.empty()) req_.set(http::field::authorization, "Bearer " + cfg.api_key);
  req_.keep_alive(true);
  req_.body() = std::move(body);
  req_.prepare_payload();
  sent_ = steady::now();
  timer_.expires_after(to_duration(cfg.timeout_s));
  timer_.async_wait([this, self = shared_from_this(), gen = generation_](error_code ec) {
    if (ec || gen != generation_ || !busy_) return;
    fail("timeout: no answer within " + format_seconds(owner_.config().timeout_s));
  });
  reused_ = open_;
  if (open_) return write();
  connect();
}

void http_connection::connect() {
  auto resolver = std::make_shared<tcp::resolver>(io_);
  const auto& t = owner_.config().target;
  resolver->async_resolve(t.host, std::to_string(t.port), [this, self = shared_from_this(), resolver, gen = generation_](
                                                               error_code ec, tcp::resolver::results_type eps) {
    if (gen != generation_) return;
    if (ec) return fail("cannot resolve " + owner_.config().target.host + ": " + ec.message());
    stream_.async_connect(eps, [this, self, gen](error_code ec2, const tcp::endpoint&) {
      if (gen != generation_) return;
      if (ec2) return fail("connect: " + ec2.message());
      stream_.socket().set_option(tcp::no_delay(true));
      open_ = true;
      write();
    });
  });
}

bool http_connection::retry_on_fresh_connection() {
  if (!reused_) return false;
  reused_ = false;
  open_ = false;
  error_code ignored;
  stream_.socket().close(ignored);
  connect();
  return true;
}

void http_connection::write() {
  buffer_.clear();
  http::async_write(stream_, req_, [this, self = shared_from_this(), gen = generation_](error_code ec, std::size_t) {
    if (gen != generation_) return;
    if (ec && retry_on_fresh_connection()) return;
    if (ec) return fail("write: " + ec.message());
    read_header();
  });
}

void http_connection::read_header() {
  parser_.emplace();
  parser_->body_limit(boost::none);
  http::async_read_header(stream_, buffer_, *parser_, [this, self = shared_from_this(), gen = generation_](error_code ec, std::size_t) {
    if (gen != generation_) return;
    if (ec && retry_on_fresh_connection()) return;
    if (ec) return fail(ec == http::error::end_of_stream ? "connection closed by the server" : "read: " + ec.message());
    ok_status_ = parser_->get().result() == http::status::ok;
    if (parser_->is_done()) return complete();
    read_body();
  });
}

void http_connection::read_body() {
  parser_->get().body().data = body_buf_.data();
  parser_->get().body().size = body_buf_.size();
  http::async_read_some(stream_, buffer_, *parser_, [this, self = shared_from_this(), gen = generation_](error_code ec, std::size_t) {
    if (gen != generation_) return;
    const auto now = steady::now();
    if (ec == http::error::need_buffer) ec = {};
    if (ec) return fail(ec == http::error::end_of_stream ? "connection closed by the server" : "read: " + ec.message());
    on_body_bytes(body_buf_.size() - parser_->get().body().size, now);
    if (gen != generation_ || !busy_) return;  // an error event ended it
    if (parser_->is_done()) return complete();
    read_body();
  });
}

void http_connection::on_body_bytes(std::size_t n, steady::time_point now) {
  const std::string_view bytes(body_buf_.data(), n);
  if (!ok_status_) {
    error_body_.append(bytes.substr(0, max_error_body - std::min(max_error_body, error_body_.size())));
    return;
  }
  for (const auto& e : sse_.feed(bytes)) {
    on_event(e, now);
    if (!busy_) return;
  }
}

void http_connection::on_event(const sse_event& e, steady::time_point now) {
  ++events_;
  const http_chunk c = parse_http_event(e.data, is_chat_endpoint(owner_.config().endpoint));
  if (!c.error.empty()) return fail(c.error);
  if (c.done) {
    done_at_ = now;
    return;
  }
  if (c.prompt_tokens) result_.prompt_tokens = *c.prompt_tokens;
  if (c.completion_tokens) result_.output_tokens = *c.completion_tokens;
  if (!c.has_content) return;
  if (!last_chunk_) {
    result_.ttft_s = seconds(now - sent_);
  } else {
    result_.itls_s.push_back(seconds(now - *last_chunk_));
  }
  last_chunk_ = now;
  ++counted_chunks_;
}

void http_connection::complete() {
  const bool keep = parser_->keep_alive();
  if (!ok_status_) {
    const int status = static_cast<int>(parser_->get().result_int());
    std::string msg = "HTTP " + std::to_string(status);
    if (!error_body_.empty()) msg += ": " + http_error_message(error_body_);
    request_result r = std::move(result_);
    r.ok = false;
    r.error = msg;
    return deliver(std::move(r), keep);
  }
  const auto now = steady::now();
  for (const auto& e : sse_.finish()) {
    on_event(e, now);
    if (!busy_) return;
  }
  if (events_ == 0) return fail("the answer was not an event stream (is streaming supported?)");
  request_result r = std::move(result_);
  r.ok = true;
  r.e2el_s = seconds(done_at_.value_or(now) - sent_);
  if (!last_chunk_) r.ttft_s = r.e2el_s;
  if (r.output_tokens == 0) r.output_tokens = counted_chunks_;
  deliver(std::move(r), keep);
}

void http_connection::fail(const std::string& why) {
  if (!busy_) return;
  request_result r = std::move(result_);
  r.ok = false;
  r.error = why.empty() ? "failed" : why;
  deliver(std::move(r), false);
}

void http_connection::deliver(request_result r, bool keep) {
  busy_ = false;
  ++generation_;
  timer_.cancel();
  if (!keep) {
    open_ = false;
    error_code ignored;
    stream_.socket().close(ignored);
  }
  asio::post(io_, [done = std::move(done_), r = std::move(r)]() mutable { done(std::move(r)); });
  done_ = nullptr;
  owner_.release(shared_from_this(), keep);
}

void http_connection::abort(const std::string& why) {
  if (busy_) {
    fail(why);
  } else {
    ++generation_;
  }
  open_ = false;
  timer_.cancel();
  error_code ignored;
  stream_.socket().close(ignored);
}

}  // namespace

std::unique_ptr<bench_client> make_http_client(asio::io_context& io, const client_config& config) {
  return std::make_unique<http_client>(io, config);
}

std::string discover_model(asio::io_context& io, const client_config& config) {
  std::string model = "default";
  auto stream = std::make_shared<beast::tcp_stream>(io);
  auto resolver = std::make_shared<tcp::resolver>(io);
  auto req = std::make_shared<http::request<http::empty_body>>(http::verb::get, "/v1/models", 11);
  req->set(http::field::host, config.target.host + ":" + std::to_string(config.target.port));
  req->set(http::field::user_agent, "anvil-bench");
  if (!config.api_key.empty()) req->set(http::field::authorization, "Bearer " + config.api_key);
  auto buf = std::make_shared<beast::flat_buffer>();
  auto res = std::make_shared<http::response<http::string_body>>();
  const auto limit = to_duration(std::min(config.timeout_s, 30.0));
  resolver->async_resolve(config.target.host, std::to_string(config.target.port), [&, stream, resolver, req, buf, res](
                                                                                       error_code ec, tcp::resolver::results_type eps) {
    if (ec) return;
    stream->expires_after(limit);
    stream->async_connect(eps, [&, stream, req, buf, res](error_code ec2, const tcp::endpoint&) {
      if (ec2) return;
      http::async_write(*stream, *req, [&, stream, req, buf, res](error_code ec3, std::size_t) {
        if (ec3) return;
        http::async_read(*stream, *buf, *res, [&, stream, buf, res](error_code ec4, std::size_t) {
          if (ec4 || res->result() != http::status::ok) return;
          if (auto id = first_model_id(res->body())) model = *id;
          error_code ignored;
          stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
        });
      });
    });
  });
  io.restart();
  io.run();
  io.restart();
  return model;
}

}  // namespace anvil::bench
