// The accept loop and connection registry both servers share (line_server.cpp, http_server.cpp;
// Asio, so only their .cpp files include it). It binds, accepts on its own strand, gives each
// socket a strand of its own, keeps the live connections so stop() can close them, and refuses
// connections accepted once stop() has begun. Conn: made by `make`, then start(); close() from
// any thread; it calls its `on_gone` (with itself) once it is over.
#pragma once

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
#include <boost/asio/strand.hpp>

namespace anvil::proto {

template <class Conn>
class tcp_listener : public std::enable_shared_from_this<tcp_listener<Conn>> {
 public:
  using tcp = boost::asio::ip::tcp;
  using make_fn = std::function<std::shared_ptr<Conn>(tcp::socket, std::function<void(Conn*)> on_gone)>;

  // Binds and listens on host:port (0: any free port); throws std::system_error naming `what`.
  tcp_listener(boost::asio::io_context& io, const std::string& what, const std::string& host, std::uint16_t port,
               make_fn make)
      : acceptor_(boost::asio::make_strand(io)), make_(std::move(make)) {
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

  std::size_t connections() const {
    std::lock_guard lock(mu_);
    return conns_.size();
  }

  // Stops accepting and closes every connection (each as its Conn::close() defines).
  void stop() {
    boost::asio::post(acceptor_.get_executor(), [self = this->shared_from_this()] {
      boost::system::error_code ignored;
      self->acceptor_.close(ignored);
    });
    std::lock_guard lock(mu_);
    stopped_ = true;
    for (auto& [raw, c] : conns_) c->close();
  }

 private:
  void accept() {
    acceptor_.async_accept(boost::asio::make_strand(acceptor_.get_executor().get_inner_executor()),
                           [self = this->shared_from_this()](boost::system::error_code ec, tcp::socket sock) {
                             if (ec == boost::asio::error::operation_aborted || !self->acceptor_.is_open()) return;
                             if (!ec) self->adopt(std::move(sock));
                             self->accept();
                           });
  }

  void adopt(tcp::socket sock) {
    boost::system::error_code ignored;
    sock.set_option(tcp::no_delay(true), ignored);
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

  boost::asio::basic_socket_acceptor<tcp, boost::asio::strand<boost::asio::io_context::executor_type>> acceptor_;
  make_fn make_;
  std::uint16_t port_ = 0;
  mutable std::mutex mu_;  // guards conns_ and stopped_: connections end on their own strands
  std::unordered_map<Conn*, std::shared_ptr<Conn>> conns_;
  bool stopped_ = false;
};

}  // namespace anvil::proto
