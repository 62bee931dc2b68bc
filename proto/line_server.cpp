#include "proto/line_server.h"

#include <array>
#include <chrono>
#include <deque>
#include <optional>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <spdlog/logger.h>

#include "engine/engine.h"
#include "actors/log.h"
#include "proto/line_session.h"
#include "proto/tcp_listener.h"

namespace anvil::proto {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

class connection : public std::enable_shared_from_this<connection> {
 public:
  connection(tcp::socket sock, const line_server_options& opt, std::shared_ptr<engine> eng,
             std::function<void(connection*)> on_gone)
      : sock_(std::move(sock)),
        strand_(sock_.get_executor()),
        timer_(strand_),
        opt_(opt),
        eng_(std::move(eng)),
        on_gone_(std::move(on_gone)) {}

  void start() {
    std::weak_ptr<connection> weak = weak_from_this();
    line_session_hooks hooks;
    hooks.write = [this](std::string line) { queue(std::move(line)); };  // called on the strand
    hooks.post = [weak, strand = strand_](std::function<void()> fn) {
      asio::post(strand, [weak, fn = std::move(fn)] {
        if (auto self = weak.lock()) fn();
      });
    };
    hooks.close = [this] { closing_after_write_ = true; };
    session_ = std::make_shared<line_session>(eng_, std::move(hooks), opt_.api_key);
    asio::dispatch(strand_, [self = shared_from_this()] {
      self->last_active_ = clock::now();
      self->arm_timer();
      self->read();
    });
  }

  // From any thread: close the connection on its strand once the answers queued so far are sent.
  void close() {
    asio::post(strand_, [self = shared_from_this()] {
      if (self->out_.empty()) return self->shut("server stopping");
      self->closing_after_write_ = true;
    });
  }

 private:
  void read() {
    sock_.async_read_some(asio::buffer(buf_), asio::bind_executor(strand_, [self = shared_from_this()](
                                                                               boost::system::error_code ec, std::size_t n) {
      if (ec) return self->shut(ec == asio::error::eof ? "closed by the client" : ec.message());
      self->absorb(std::string_view(self->buf_.data(), n));
      if (!self->gone_) self->read();
    }));
  }

  // Idle and slow clients (PROTOCOL.md, Connections): a line must end within idle_timeout of its
  // first byte, and a connection with no request in flight that neither sends a line nor gets an
  // answer for idle_timeout is closed. One timer, re-armed for the nearer of the two deadlines.
  void arm_timer() {
    if (opt_.idle_timeout.count() <= 0 || gone_) return;
    clock::time_point at = last_active_ + opt_.idle_timeout;
    if (line_started_) at = std::min(at, *line_started_ + opt_.idle_timeout);
    timer_.expires_at(at);
    timer_.async_wait(asio::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code ec) {
      if (ec || self->gone_) return;
      const clock::time_point now = clock::now();
      if (self->line_started_ && now >= *self->line_started_ + self->opt_.idle_timeout) {
        return self->shut("a line was not finished within the idle timeout (slow client)");
      }
      if (self->session_->in_flight() == 0 && now >= self->last_active_ + self->opt_.idle_timeout) {
        return self->shut("idle");
      }
      if (self->session_->in_flight() != 0) self->last_active_ = now;  // running requests keep it alive
      self->arm_timer();
    }));
  }

  void absorb(std::string_view data) {
    while (!data.empty() && !gone_) {
      if (!line_started_) line_started_ = clock::now();
      const std::size_t nl = data.find('\n');
      const std::string_view part = data.substr(0, nl);
      if (!skipping_) {
        if (line_.size() + part.size() > opt_.max_line_bytes) {
          session_->on_line_too_long();
          line_.clear();
          skipping_ = true;
        } else {
          line_.append(part);
        }
      }
      if (nl == std::string_view::npos) break;
      line_started_.reset();
      last_active_ = clock::now();
      if (!skipping_) session_->on_line(line_);
      line_.clear();
      skipping_ = false;
      data.remove_prefix(nl + 1);
    }
  }

  // The bound is on the lines piling up behind the one being written, not on one line however
  // large: a non-streamed answer is built whole before it is queued (its size follows from the
  // request, which max_line_bytes and the context bound), so refusing it would only lose it.
  void queue(std::string line) {
    if (gone_) return;
    if (!out_.empty() && queued_bytes_ - out_.front().size() + line.size() > opt_.max_queued_bytes) {
      return shut("answers not read (slow client)");
    }
    queued_bytes_ += line.size();
    last_active_ = clock::now();
    out_.push_back(std::move(line));
    if (out_.size() == 1) write();
  }

  void write() {
    asio::async_write(sock_, asio::buffer(out_.front()),
                      asio::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                        if (self->gone_) return;
                        if (ec) return self->shut(ec.message());
                        self->queued_bytes_ -= self->out_.front().size();
                        self->out_.pop_front();
                        if (!self->out_.empty()) return self->write();
                        if (self->closing_after_write_) self->shut("closed after its last answer");
                      }));
  }

  // The connection is over: cancel its requests, close the socket, forget it.
  void shut(const std::string& why) {
    if (gone_) return;
    gone_ = true;
    log::get("proto")->debug("line connection closed: {} ({} requests in flight cancelled)", why, session_->in_flight());
    session_->on_close();
    boost::system::error_code ignored;
    sock_.shutdown(tcp::socket::shutdown_both, ignored);
    sock_.close(ignored);
    timer_.cancel();
    out_.clear();
    on_gone_(this);
  }

  using clock = std::chrono::steady_clock;

  tcp::socket sock_;
  asio::strand<tcp::socket::executor_type> strand_;
  asio::steady_timer timer_;  // idle and slow-line deadlines
  line_server_options opt_;
  std::shared_ptr<engine> eng_;
  std::function<void(connection*)> on_gone_;
  std::shared_ptr<line_session> session_;
  std::array<char, 16384> buf_{};
  std::string line_;
  bool skipping_ = false;  // inside a line that was too long, until its '\n'
  std::optional<clock::time_point> line_started_;  // the first byte of the line being read
  clock::time_point last_active_;                  // the last complete line or answer (or a request running)
  std::deque<std::string> out_;
  std::size_t queued_bytes_ = 0;  // in out_, the front (being written) included
  bool closing_after_write_ = false;
  bool gone_ = false;
};

}  // namespace

struct line_server::impl {
  std::shared_ptr<tcp_listener<connection>> listener;
};

line_server::line_server(asio::io_context& io, std::shared_ptr<engine> eng, line_server_options opt)
    : impl_(std::make_shared<impl>()) {
  auto make = [eng = std::move(eng), opt](tcp::socket sock, std::function<void(connection*)> on_gone) {
    return std::make_shared<connection>(std::move(sock), opt, eng, std::move(on_gone));
  };
  const std::size_t max = opt.max_connections ? opt.max_connections : default_max_connections();
  tcp_listener<connection>::limits lim{max, R"({"id":null,"error":{"code":"overloaded","message":"the server has the most )"
                                                "connections it takes open (" + std::to_string(max) + R"(); retry later"}})" "\n"};
  impl_->listener = std::make_shared<tcp_listener<connection>>(io, "line protocol server", opt.host, opt.port, std::move(make),
                                                               std::move(lim));
  impl_->listener->start();
}

line_server::~line_server() { stop(); }

std::uint16_t line_server::port() const { return impl_->listener->port(); }
std::size_t line_server::connections() const { return impl_->listener->connections(); }
void line_server::stop() { impl_->listener->stop(); }

}  // namespace anvil::proto
