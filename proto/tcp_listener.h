// The accept loop and connection registry both servers share (line_server.cpp, http_server.cpp;
// Asio, so only their .cpp files include it). It binds, accepts on its own strand, gives each
// socket a strand of its own, keeps the live connections so stop() can close them, and refuses
// connections accepted once stop() has begun. Conn: made by `make`, then start(); close() from
// any thread; it calls its `on_gone` (with itself) once it is over.
//
// Two guards keep one flood of clients from breaking the server: a cap on open connections (past
// it a connection gets the protocol's "overloaded" answer and is closed), and a pause when the
// process runs out of file descriptors (accept fails at once while they are gone; retrying at
// once would spin a core), logged once per burst.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <unordered_map>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <spdlog/logger.h>

#include "actors/log.h"

namespace anvil::proto {

// The per-server connection cap when none is configured: RLIMIT_NOFILE's soft limit less a reserve
// for everything else the process opens (model file, engine, logs, refused sockets: an eighth, at
// least 32), split between the two servers; at least 8.
inline std::size_t default_max_connections() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 4096;
  const auto soft = std::size_t(rl.rlim_cur);
  const std::size_t reserve = std::max<std::size_t>(32, soft / 8);
  return std::max<std::size_t>(8, soft > reserve ? (soft - reserve) / 2 : 0);
}

template <class Conn>
class tcp_listener : public std::enable_shared_from_this<tcp_listener<Conn>> {
 public:
  using tcp = boost::asio::ip::tcp;
  using make_fn = std::function<std::shared_ptr<Conn>(tcp::socket, std::function<void(Conn*)> on_gone)>;

  struct limits {
    std::size_t max_connections = 0;  // 0: default_max_connections()
    std::string overloaded;           // the bytes a connection past the cap gets before it is closed
  };

  // Binds and listens on host:port (0: any free port); throws std::system_error naming `what`.
  tcp_listener(boost::asio::io_context& io, const std::string& what, const std::string& host, std::uint16_t port,
               make_fn make, limits lim)
      : acceptor_(boost::asio::make_strand(io)),
        backoff_(acceptor_.get_executor()),
        what_(what),
        make_(std::move(make)),
        max_connections_(lim.max_connections ? lim.max_connections : default_max_connections()),
        overloaded_(std::make_shared<const std::string>(std::move(lim.overloaded))) {
    try {
      const tcp::endpoint ep(boost::asio::ip::make_address(host), port);
      acceptor_.open(ep.protocol());
      acceptor_.set_option(tcp::acceptor::reuse_address(true));
      acceptor_.bind(ep);
      acceptor_.listen();
      port_ = acceptor_.local_endpoint().port();
    } catch (const boost::system::system_error& e) {
      throw std::system_error(std::error_code(e.code()), what + " on " + host + ":" + std::to_string(port));
    }
  }

  void start() { accept(); }
  std::uint16_t port() const { return port_; }
  std::size_t max_connections() const { return max_connections_; }

  std::size_t connections() const {
    std::lock_guard lock(mu_);
    return conns_.size();
  }

  // Stops accepting and closes every connection (each as its Conn::close() defines).
  void stop() {
    boost::asio::post(acceptor_.get_executor(), [self = this->shared_from_this()] {
      boost::system::error_code ignored;
      self->acceptor_.close(ignored);
      self->backoff_.cancel();
    });
    std::lock_guard lock(mu_);
    stopped_ = true;
    for (auto& [raw, c] : conns_) c->close();
  }

 private:
  static constexpr std::chrono::milliseconds backoff_delay{100};
  static constexpr int max_refusing = 64;  // refused sockets answered at once; past that, closed unanswered

  void accept() {
    acceptor_.async_accept(boost::asio::make_strand(acceptor_.get_executor().get_inner_executor()),
                           [self = this->shared_from_this()](boost::system::error_code ec, tcp::socket sock) {
                             if (ec == boost::asio::error::operation_aborted || !self->acceptor_.is_open()) return;
                             if (!ec) {
                               self->out_of_fds_ = false;
                               self->adopt(std::move(sock));
                             } else if (out_of_descriptors(ec)) {
                               return self->back_off(ec);
                             }
                             self->accept();
                           });
  }

  static bool out_of_descriptors(const boost::system::error_code& ec) {
    return ec == boost::asio::error::no_descriptors || ec == boost::system::errc::too_many_files_open_in_system ||
           ec == boost::asio::error::no_buffer_space || ec == boost::asio::error::no_memory;
  }

  // The pending connections stay queued in the kernel's backlog meanwhile; once descriptors come
  // back (connections close), they are accepted.
  void back_off(const boost::system::error_code& ec) {
    if (!out_of_fds_) {
      out_of_fds_ = true;
      log::get("proto")->warn("{}: cannot accept connections: {}; retrying every {} ms until it can ({} open)", what_,
                              ec.message(), backoff_delay.count(), connections());
    }
    backoff_.expires_after(backoff_delay);
    backoff_.async_wait([self = this->shared_from_this()](boost::system::error_code wec) {
      if (wec || !self->acceptor_.is_open()) return;
      self->accept();
    });
  }

  void adopt(tcp::socket sock) {
    boost::system::error_code ignored;
    sock.set_option(tcp::no_delay(true), ignored);
    bool full = false;
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      full = conns_.size() >= max_connections_;
    }
    if (full) return refuse(std::move(sock));
    at_cap_ = false;
    std::weak_ptr<tcp_listener> weak = this->weak_from_this();
    std::shared_ptr<Conn> c = make_(std::move(sock), [weak](Conn* gone) {
      if (auto self = weak.lock()) {
        std::lock_guard lock(self->mu_);
        self->conns_.erase(gone);
      }
    });
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      conns_.emplace(c.get(), c);
    }
    c->start();
  }

  // Past the cap: the overloaded answer, then close. Its sending side is shut first and what the
  // client still sends is read (briefly), so the answer arrives instead of a reset.
  struct refused : std::enable_shared_from_this<refused> {
    refused(tcp::socket s, std::shared_ptr<const std::string> m, std::shared_ptr<std::atomic<int>> n)
        : sock(std::move(s)), timer(sock.get_executor()), msg(std::move(m)), count(std::move(n)) {}
    ~refused() { --*count; }
    void start() {
      timer.expires_after(std::chrono::seconds(1));
      timer.async_wait([self = this->shared_from_this()](boost::system::error_code ec) {
        if (!ec) self->sock.close(ec);
      });
      boost::asio::async_write(sock, boost::asio::buffer(*msg), [self = this->shared_from_this()](boost::system::error_code ec, std::size_t) {
        if (ec) {
          self->timer.cancel();
          return;
        }
        self->sock.shutdown(tcp::socket::shutdown_send, ec);
        self->drain();
      });
    }
    void drain() {
      sock.async_read_some(boost::asio::buffer(buf), [self = this->shared_from_this()](boost::system::error_code ec, std::size_t) {
        if (!ec) return self->drain();
        self->timer.cancel();
        self->sock.close(ec);
      });
    }
    tcp::socket sock;
    boost::asio::steady_timer timer;
    std::shared_ptr<const std::string> msg;
    std::shared_ptr<std::atomic<int>> count;
    std::array<char, 4096> buf{};
  };

  void refuse(tcp::socket sock) {
    if (!at_cap_) {
      at_cap_ = true;
      log::get("proto")->warn("{}: {} connections open, the most allowed: refusing new ones until some close", what_,
                              max_connections_);
    }
    if (++*refusing_ > max_refusing) {
      --*refusing_;
      return;  // the socket closes here, unanswered
    }
    std::make_shared<refused>(std::move(sock), overloaded_, refusing_)->start();
  }

  boost::asio::basic_socket_acceptor<tcp, boost::asio::strand<boost::asio::io_context::executor_type>> acceptor_;
  boost::asio::steady_timer backoff_;  // on the acceptor's strand: the pause while descriptors are out
  std::string what_;
  make_fn make_;
  std::size_t max_connections_;
  std::shared_ptr<const std::string> overloaded_;
  std::shared_ptr<std::atomic<int>> refusing_ = std::make_shared<std::atomic<int>>(0);
  std::uint16_t port_ = 0;
  // On the acceptor's strand: inside a burst of descriptor exhaustion / of refusals at the cap, each
  // logged once (at warn: either means clients are being turned away).
  bool out_of_fds_ = false;
  bool at_cap_ = false;
  mutable std::mutex mu_;    // guards conns_ and stopped_: connections end on their own strands
  std::unordered_map<Conn*, std::shared_ptr<Conn>> conns_;
  bool stopped_ = false;
};

}  // namespace anvil::proto
