#include "proto/http_server.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <iterator>
#include <mutex>
#include <optional>
#include <string_view>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/logger.h>

#include "engine/engine.h"
#include "actors/log.h"
#include "proto/http_session.h"
#include "proto/metrics_text.h"
#include "proto/openai_json.h"
#include "proto/tcp_listener.h"

namespace anvil::proto {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr std::uint32_t max_header_bytes = 16 * 1024;         // larger headers: 431
constexpr std::size_t max_read_ahead_bytes = 1u << 20;        // pipelined input buffered while a request runs
constexpr std::size_t read_chunk_bytes = 16 * 1024;
// Bytes a request may leave unparsed while its body is read: an unfinished chunk header (size and
// extensions) or trailer section. Beast bounds neither; the body itself passes through.
constexpr std::size_t max_chunk_header_bytes = max_header_bytes;
// The input buffer's hard bound: the read-ahead plus one read. Nothing legitimate reaches it (the
// limits above stop a request first); it backs them up.
constexpr std::size_t max_input_bytes = max_read_ahead_bytes + read_chunk_bytes;
constexpr std::size_t write_piece_bytes = 256 * 1024;         // one write; each piece re-arms the write deadline
constexpr std::chrono::seconds linger_timeout{2};             // reading what a refused client still sends

// What every connection shares with the server: options and the engine, which set_engine may
// replace from any thread.
struct shared_state {
  http_server_options opt;
  mutable std::mutex mu;
  std::shared_ptr<engine> eng;
  std::vector<std::pair<std::string, std::function<std::size_t()>>> gauges;  // open connections by protocol

  connection_counts connections() const {
    std::vector<std::pair<std::string, std::function<std::size_t()>>> g;
    {
      std::lock_guard lock(mu);
      g = gauges;
    }
    connection_counts out;
    for (const auto& [protocol, count] : g) out.emplace_back(protocol, count());
    return out;
  }

  std::shared_ptr<engine> current_engine() const {
    std::lock_guard lock(mu);
    return eng;
  }
};

// The status line and headers of an answer. length: Content-Length; nullopt: a stream.
std::string response_head(unsigned status, std::string_view content_type, std::optional<std::size_t> length, bool chunked,
                          bool close, std::string_view allow, std::string_view cors_origin = {}) {
  std::string h = fmt::format("HTTP/1.1 {} {}\r\nServer: anvil\r\nContent-Type: {}\r\n", status,
                              std::string_view(http::obsolete_reason(http::int_to_status(status))), content_type);
  if (length) {
    h += fmt::format("Content-Length: {}\r\n", *length);
  } else {
    h += "Cache-Control: no-cache\r\n";
    if (chunked) h += "Transfer-Encoding: chunked\r\n";
  }
  if (!allow.empty()) h += fmt::format("Allow: {}\r\n", allow);
  if (!cors_origin.empty()) h += fmt::format("Access-Control-Allow-Origin: {}\r\nVary: Origin\r\n", cors_origin);
  h += close ? "Connection: close\r\n\r\n" : "Connection: keep-alive\r\n\r\n";
  return h;
}

// The path and query of a target: an absolute-form target ("http://host:port/v1/models", which
// HTTP/1.1 servers must accept) loses its scheme and authority.
std::string origin_form(std::string_view target) {
  for (std::string_view scheme : {"http://", "https://"}) {
    if (target.size() >= scheme.size() && beast::iequals(target.substr(0, scheme.size()), scheme)) {
      const std::string_view rest = target.substr(scheme.size());
      const std::size_t slash = rest.find_first_of("/?");
      if (slash == std::string_view::npos) return "/";
      return rest[slash] == '/' ? std::string(rest.substr(slash)) : "/" + std::string(rest.substr(slash));
    }
  }
  return std::string(target);
}

// Why a request head is refused before its body is read: RFC 9112 framing and the expectations
// this server understands. The connection is then closed, so a body never becomes a request.
struct refusal {
  unsigned status;
  std::string message;
  std::string_view code;
};

std::optional<refusal> check_head(const http::request_parser<http::string_body>& p) {
  const auto& h = p.get();
  // Transfer-Encoding (RFC 9112 6.1, 6.3): only a final "chunked" frames a request body. Anything
  // else would leave the body's length unknown; taking it as empty would run its bytes as the next
  // request (smuggling). Beast itself refuses a second field after a chunked one.
  std::size_t codings = 0;
  bool has_te = false;
  for (auto [it, end] = h.equal_range(http::field::transfer_encoding); it != end; ++it) {
    has_te = true;
    const http::token_list tokens(it->value());
    codings += std::size_t(std::distance(tokens.begin(), tokens.end()));
  }
  if (has_te) {
    if (h.version() < 11) return refusal{400, "Transfer-Encoding is not allowed in an HTTP/1.0 request", "bad_request"};
    if (!p.chunked()) return refusal{400, "Transfer-Encoding must end in chunked", "bad_request"};
    if (codings != 1) return refusal{501, "only the chunked transfer coding is supported", "not_implemented"};
  }
  // Host (RFC 9112 3.2): exactly one in HTTP/1.1, at most one before.
  const std::size_t hosts = h.count(http::field::host);
  if (hosts > 1 || (hosts == 0 && h.version() >= 11)) {
    return refusal{400, hosts ? "more than one Host header" : "an HTTP/1.1 request needs a Host header", "bad_request"};
  }
  // Expect (RFC 9110 10.1.1): only 100-continue is understood.
  const std::size_t expects = h.count(http::field::expect);
  if (expects > 1 || (expects == 1 && !beast::iequals(h[http::field::expect], "100-continue"))) {
    return refusal{417, "the only expectation understood is 100-continue", "expectation_failed"};
  }
  return std::nullopt;
}

// What an unparsed remainder too large to keep is: the trailer section (it follows a last chunk,
// "0" and its line) or a chunk header line that never ends (endless extensions or size digits).
bool is_trailer(std::string_view rest) {
  if (rest.starts_with("\r\n")) rest.remove_prefix(2);  // the previous chunk's CRLF
  const std::size_t eol = rest.find("\r\n");
  if (eol == std::string_view::npos) return false;
  const std::string_view size = rest.substr(0, std::min(eol, rest.find(';')));
  return !size.empty() && size.find_first_not_of('0') == std::string_view::npos;
}

class connection : public std::enable_shared_from_this<connection> {
 public:
  connection(tcp::socket sock, std::shared_ptr<const shared_state> st, std::function<void(connection*)> on_gone)
      : stream_(std::move(sock)), st_(std::move(st)), on_gone_(std::move(on_gone)) {}

  // From the acceptor: everything else happens on the connection's strand.
  void start() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      self->make_session();
      self->read_request();
    });
  }

  // From any thread, when the server stops: an idle connection closes now; one that is answering
  // a request closes once that answer is written.
  void close() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      self->stopping_ = true;
      if (!self->in_exchange_ && !self->writing_ && self->out_.empty()) self->shut("server stopping");
    });
  }

 private:
  // ---- reading requests ----

  void make_session() {
    std::weak_ptr<connection> weak = weak_from_this();
    http_session_hooks hooks;  // all but post are called on the strand, by the session
    hooks.respond = [weak](http_response r) {
      if (auto self = weak.lock()) self->respond(std::move(r));
    };
    hooks.start_stream = [weak] {
      if (auto self = weak.lock()) self->start_stream();
    };
    hooks.stream = [weak](std::string event) {
      if (auto self = weak.lock()) self->stream_event(std::move(event));
    };
    hooks.end_stream = [weak](bool close) {
      if (auto self = weak.lock()) self->end_stream(close);
    };
    hooks.post = [ex = stream_.get_executor()](std::function<void()> fn) { asio::post(ex, std::move(fn)); };
    hooks.connections = [st = st_] { return st->connections(); };
    session_ = std::make_shared<http_session>(std::move(hooks), st_->opt.api_key);
  }

  void read_request() {
    if (gone_) return;
    parser_.emplace();
    parser_->header_limit(max_header_bytes);
    parser_->body_limit(st_->opt.max_body_bytes);
    stream_.expires_after(st_->opt.idle_timeout);
    http::async_read_header(stream_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      self->on_header(ec);
    });
  }

  void on_header(beast::error_code ec) {
    if (gone_) return;
    if (ec) return on_read_error(ec);
    if (auto r = check_head(*parser_)) return refuse(r->status, r->message, r->code);
    const auto& h = parser_->get();
    if (beast::iequals(h[http::field::expect], "100-continue") && !parser_->is_done()) {
      static const std::string go_on = "HTTP/1.1 100 Continue\r\n\r\n";
      asio::async_write(stream_, asio::buffer(go_on), [self = shared_from_this()](beast::error_code wec, std::size_t) {
        if (self->gone_) return;
        if (wec) return self->shut(wec.message());
        self->read_body();
      });
      return;
    }
    read_body();
  }

  // The body. Parsed here rather than by http::async_read, which keeps reading while the parser
  // needs more: an unfinished chunk header or trailer would then grow buf_ until max_input_bytes.
  // Between reads, what the parser leaves in buf_ is only such an unfinished element (eager
  // parsing takes every complete one, and body bytes go to the body), so the limit applies to it.
  void read_body() {
    parser_->eager(true);
    while (!parser_->is_done() && buf_.size() != 0) {
      beast::error_code ec;
      const std::size_t used = parser_->put(buf_.data(), ec);
      buf_.consume(used);
      if (ec == http::error::need_more) break;
      if (ec) return on_read_error(ec);
      if (used == 0) break;
    }
    if (parser_->is_done()) return on_request();
    if (buf_.size() > max_chunk_header_bytes) {
      const std::string_view rest(static_cast<const char*>(buf_.data().data()), buf_.size());
      if (is_trailer(rest)) {
        return refuse(431, "the request trailers are larger than " + std::to_string(max_chunk_header_bytes) + " bytes",
                      "headers_too_large");
      }
      return refuse(400, "a chunk header (size and extensions) is longer than " + std::to_string(max_chunk_header_bytes) +
                             " bytes", "bad_request");
    }
    stream_.async_read_some(buf_.prepare(read_chunk_bytes), [self = shared_from_this()](beast::error_code ec, std::size_t n) {
      if (self->gone_) return;
      if (ec == asio::error::eof) return self->shut("closed by the client mid-request");
      if (ec) return self->on_read_error(ec);
      self->buf_.commit(n);
      self->read_body();
    });
  }

  void on_read_error(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == http::error::partial_message) return shut("closed by the client");
    if (ec == beast::error::timeout) return shut("idle or slow client timed out");
    if (ec == http::error::header_limit) {
      return refuse(431, "the request headers are larger than " + std::to_string(max_header_bytes) + " bytes", "headers_too_large");
    }
    if (ec == http::error::body_limit) {
      return refuse(413, "the request body is larger than " + std::to_string(st_->opt.max_body_bytes) + " bytes",
                    "request_too_large");
    }
    if (ec == http::error::buffer_overflow) {  // max_input_bytes: unreachable behind the limits above
      return refuse(400, "the request is larger than the server can buffer", "bad_request");
    }
    if (ec.category() == http::make_error_code(http::error::bad_method).category()) {
      return refuse(400, "malformed HTTP request: " + ec.message(), "bad_request");
    }
    shut(ec.message());
  }

  void on_request() {
    auto& req = parser_->get();
    keep_alive_ = req.keep_alive();
    chunked_ = req.version() >= 11;
    head_only_ = req.method() == http::verb::head;
    // CORS (--allowed-origins): an allowed Origin is named in every answer's headers; a browser's
    // preflight is answered here, before the API key, which preflights never carry.
    cors_ = allowed_origin(req[http::field::origin]);
    if (req.method() == http::verb::options && req.count(http::field::access_control_request_method) > 0) {
      const std::string requested(req[http::field::access_control_request_headers]);
      parser_.reset();
      in_exchange_ = true;
      std::string head = response_head(cors_.empty() ? 403 : 204, "text/plain", 0, chunked_, !keep_alive_, {}, cors_);
      if (!cors_.empty()) {
        head.insert(head.size() - 2, fmt::format("Access-Control-Allow-Methods: GET, POST, OPTIONS\r\n"
                                                 "Access-Control-Allow-Headers: {}\r\nAccess-Control-Max-Age: 600\r\n",
                                                 requested.empty() ? "Authorization, Content-Type" : requested));
      }
      close_after_ = !keep_alive_ || stopping_;
      queue(std::move(head));
      return exchange_over();
    }
    // Two Authorization headers are no key at all: which one counts would be a guess.
    const bool one_auth = req.count(http::field::authorization) <= 1;
    http_request r{std::string(req.method_string()), origin_form(req.target()),
                   one_auth ? std::string(req[http::field::authorization]) : std::string(), std::move(req.body())};
    parser_.reset();
    stream_.expires_never();  // a request may run for long; writes set their own deadline
    in_exchange_ = true;
    watch();
    session_->handle(std::move(r), st_->current_engine());
  }

  // While a request runs, keep a read pending so a client that goes away is noticed (its requests
  // are cancelled); pipelined bytes that arrive meanwhile are kept for the next request.
  void watch() {
    if (watching_ || gone_ || buf_.size() >= max_read_ahead_bytes) return;
    watching_ = true;
    stream_.async_read_some(buf_.prepare(read_chunk_bytes), [self = shared_from_this()](beast::error_code ec, std::size_t n) {
      self->watching_ = false;
      if (self->gone_) return;
      if (!ec) self->buf_.commit(n);
      if (self->lingering_) return self->linger();
      if (self->resume_pending_ && (!ec || ec == asio::error::operation_aborted)) {
        self->resume_pending_ = false;
        return self->read_request();
      }
      if (ec) return self->shut(ec == asio::error::eof ? "the client went away" : ec.message());
      self->watch();
    });
  }

  // ---- writing answers ----

  void respond(http_response r) {
    close_after_ = !keep_alive_ || stopping_;
    std::string out = response_head(r.status, r.content_type, r.body.size(), chunked_, close_after_, r.allow, cors_);
    if (!head_only_) out += r.body;
    queue(std::move(out));
    exchange_over();
  }

  void start_stream() {
    // HTTP/1.0 has no chunked encoding: the stream then ends with the connection.
    queue(response_head(200, "text/event-stream", std::nullopt, chunked_, !keep_alive_ || !chunked_, {}, cors_));
  }

  void stream_event(std::string event) {
    if (head_only_ || event.empty()) return;
    if (!chunked_) return queue(std::move(event));
    queue(fmt::format("{:x}\r\n{}\r\n", event.size(), event));
  }

  void end_stream(bool close) {
    close_after_ = close || !keep_alive_ || !chunked_ || stopping_;
    if (chunked_ && !head_only_) queue("0\r\n\r\n");
    exchange_over();
  }

  // The bound is on what piles up behind the piece being written (a stream's events for a client
  // that does not read them), not on one answer however large: that answer is already built, its
  // size follows from the request (which max_body_bytes bounds) and it drains in pieces.
  void queue(std::string bytes) {
    if (gone_) return;
    if (!out_.empty() && queued_bytes_ - out_.front().size() + bytes.size() > st_->opt.max_queued_bytes) {
      return shut("the client does not read its answers");
    }
    queued_bytes_ += bytes.size();
    out_.push_back(std::move(bytes));
    if (!writing_) write();
  }

  // The front piece from written_ on, at most write_piece_bytes at a time: each write that makes
  // progress re-arms the deadline, so a large answer to a slow but live reader is not cut off.
  void write() {
    writing_ = true;
    stream_.expires_after(st_->opt.idle_timeout);
    const std::string& front = out_.front();
    const std::size_t n = std::min(write_piece_bytes, front.size() - written_);
    asio::async_write(stream_, asio::buffer(front.data() + written_, n), [self = shared_from_this()](beast::error_code ec, std::size_t wrote) {
      self->writing_ = false;
      if (self->gone_) return;
      if (ec) return self->shut(ec == beast::error::timeout ? "write timed out" : ec.message());
      self->written_ += wrote;
      if (self->written_ < self->out_.front().size()) return self->write();
      self->written_ = 0;
      self->queued_bytes_ -= self->out_.front().size();
      self->out_.pop_front();
      if (!self->out_.empty()) return self->write();
      self->stream_.expires_never();
      if (self->answered_) self->next();
    });
  }

  // The session has given its whole answer; once it is written, read the next request.
  void exchange_over() {
    answered_ = true;
    if (!writing_ && out_.empty()) next();
  }

  void next() {
    if (gone_) return;
    answered_ = false;
    in_exchange_ = false;
    if (close_after_ || stopping_) return close_gracefully();
    if (watching_) {
      resume_pending_ = true;  // the pending read completes (aborted or with data), then reads on
      boost::system::error_code ignored;
      stream_.socket().cancel(ignored);
      return;
    }
    read_request();
  }

  // ---- closing ----

  // An error the session never sees (malformed HTTP, limits): answer it, then close.
  void refuse(unsigned status, const std::string& message, std::string_view code) {
    keep_alive_ = false;
    cors_.clear();
    chunked_ = true;
    head_only_ = false;
    parser_.reset();
    respond(http_response{status, "application/json", openai_error_body(status, message, code), {}});
  }

  // Send what is queued, then stop sending and read until the client closes (briefly), so a client
  // still sending a refused body gets the answer instead of a reset.
  void close_gracefully() {
    boost::system::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    // A deadline, set on every linger read: the stream's expiry only reaches operations not yet
    // pending, and the watch read that may be pending now was started without one.
    linger_deadline_ = std::chrono::steady_clock::now() + linger_timeout;
    lingering_ = true;
    if (watching_) {  // one read at a time: the pending one is cancelled, then lingers
      stream_.socket().cancel(ignored);
      return;
    }
    linger();
  }

  void linger() {
    if (gone_) return;
    buf_.clear();
    stream_.expires_at(linger_deadline_);
    stream_.async_read_some(buf_.prepare(read_chunk_bytes), [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->shut("closed");
      self->linger();
    });
  }

  // The connection is over: cancel its requests, close the socket, forget it.
  void shut(const std::string& why) {
    if (gone_) return;
    gone_ = true;
    log::get("proto")->debug("http connection closed: {}{}", why, in_exchange_ ? " (its request cancelled)" : "");
    if (session_) session_->on_close();
    boost::system::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();  // the socket and its timer
    out_.clear();
    queued_bytes_ = written_ = 0;
    on_gone_(this);
  }

  beast::tcp_stream stream_;
  std::shared_ptr<const shared_state> st_;
  std::function<void(connection*)> on_gone_;
  std::shared_ptr<http_session> session_;
  beast::flat_buffer buf_{max_input_bytes};
  std::optional<http::request_parser<http::string_body>> parser_;
  bool keep_alive_ = true;
  bool chunked_ = true;          // HTTP/1.1: streams use chunked transfer
  bool head_only_ = false;       // a HEAD request: headers only
  std::string cors_;             // Access-Control-Allow-Origin of this exchange's answer ("" = none)

  // The Access-Control-Allow-Origin value for a request's Origin: "*" when any is allowed, the
  // origin itself when it is listed, "" otherwise (and for requests without an Origin).
  std::string allowed_origin(std::string_view origin) const {
    if (origin.empty()) return {};
    for (const std::string& o : st_->opt.allowed_origins) {
      if (o == "*") return "*";
      if (beast::iequals(o, origin)) return std::string(origin);
    }
    return {};
  }
  bool in_exchange_ = false;     // a request is with the session
  bool watching_ = false;        // a read is pending while a request runs
  bool resume_pending_ = false;  // that read is being cancelled; then read the next request
  bool answered_ = false;        // the session gave its whole answer
  std::chrono::steady_clock::time_point linger_deadline_{};  // close_gracefully: reading what is left until then
  bool close_after_ = false;     // close once the answer is written
  bool stopping_ = false;        // the server is stopping: close after the current answer
  bool lingering_ = false;       // sending is shut; reading what the client still sends
  std::deque<std::string> out_;
  std::size_t queued_bytes_ = 0;  // in out_, the front included
  std::size_t written_ = 0;       // of out_.front()
  bool writing_ = false;
  bool gone_ = false;
};

}  // namespace

struct http_server::impl {
  std::shared_ptr<shared_state> state = std::make_shared<shared_state>();
  std::shared_ptr<tcp_listener<connection>> listener;
};

http_server::http_server(asio::io_context& io, http_server_options opt) : impl_(std::make_shared<impl>()) {
  impl_->state->opt = std::move(opt);
  const http_server_options& o = impl_->state->opt;
  auto make = [st = std::shared_ptr<const shared_state>(impl_->state)](tcp::socket sock,
                                                                       std::function<void(connection*)> on_gone) {
    return std::make_shared<connection>(std::move(sock), st, std::move(on_gone));
  };
  const std::size_t max = o.max_connections ? o.max_connections : default_max_connections();
  const std::string refusal =
      openai_error_body(503, fmt::format("the server has the most connections it takes open ({}); retry later", max), "overloaded");
  tcp_listener<connection>::limits lim{max, response_head(503, "application/json", refusal.size(), true, true, {}) + refusal};
  impl_->listener = std::make_shared<tcp_listener<connection>>(io, "http server", o.host, o.port, std::move(make), std::move(lim));
  impl_->listener->start();
  add_connection_gauge("http", [weak = std::weak_ptr(impl_->listener)] {
    const auto l = weak.lock();
    return l ? l->connections() : 0;
  });
}

http_server::~http_server() { stop(); }

void http_server::add_connection_gauge(std::string protocol, std::function<std::size_t()> count) {
  std::lock_guard lock(impl_->state->mu);
  impl_->state->gauges.emplace_back(std::move(protocol), std::move(count));
}

void http_server::set_engine(std::shared_ptr<engine> eng) {
  std::lock_guard lock(impl_->state->mu);
  impl_->state->eng = std::move(eng);
}

std::uint16_t http_server::port() const { return impl_->listener->port(); }
std::size_t http_server::connections() const { return impl_->listener->connections(); }
void http_server::stop() { impl_->listener->stop(); }

}  // namespace anvil::proto
