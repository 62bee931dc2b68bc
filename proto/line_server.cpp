#include "proto/line_server.h"

#include <array>
#include <deque>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <spdlog/logger.h>

#include "actors/engine.h"
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
      : sock_(std::move(sock)), strand_(sock_.get_executor()), opt_(opt), eng_(std::move(eng)), on_gone_(std::move(on_gone)) {}

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
    asio::dispatch(strand_, [self = shared_from_this()] { self->read(); });
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

  void absorb(std::string_view data) {
    while (!data.empty() && !gone_) {
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
      if (!skipping_) session_->on_line(line_);
      line_.clear();
      skipping_ = false;
      data.remove_prefix(nl + 1);
    }
  }

  void queue(std::string line) {
    if (gone_) return;
    queued_bytes_ += line.size();
    if (queued_bytes_ > opt_.max_queued_bytes) return shut("answers not read (slow client)");
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
    out_.clear();
    on_gone_(this);
  }

  tcp::socket sock_;
  asio::strand<tcp::socket::executor_type> strand_;
  line_server_options opt_;
  std::shared_ptr<engine> eng_;
  std::function<void(connection*)> on_gone_;
  std::shared_ptr<line_session> session_;
  std::array<char, 16384> buf_{};
  std::string line_;
  bool skipping_ = false;  // inside a line that was too long, until its '\n'
  std::deque<std::string> out_;
  std::size_t queued_bytes_ = 0;
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
  impl_->listener = std::make_shared<tcp_listener<connection>>(io, "line protocol server", opt.host, opt.port, std::move(make));
  impl_->listener->start();
}

line_server::~line_server() { stop(); }

std::uint16_t line_server::port() const { return impl_->listener->port(); }
std::size_t line_server::connections() const { return impl_->listener->connections(); }
void line_server::stop() { impl_->listener->stop(); }

}  // namespace anvil::proto
