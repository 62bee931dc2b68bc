// A blocking line-protocol client for tests: POSIX sockets, every read bounded by a deadline so a
// server bug fails the test instead of hanging it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include <boost/json.hpp>

namespace anvil::testing {

class line_client {
 public:
  using clock = std::chrono::steady_clock;

  // rcvbuf > 0: a small receive buffer (set before connecting), for clients that stop reading.
  explicit line_client(std::uint16_t port, int rcvbuf = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ >= 0 && rcvbuf > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("connect failed");
  }
  ~line_client() { close(); }
  line_client(const line_client&) = delete;
  line_client& operator=(const line_client&) = delete;

  void send(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("send failed");
      data.remove_prefix(std::size_t(n));
    }
  }
  // The same, but false instead of an exception when the server has closed the connection.
  bool try_send(std::string_view data) {
    try {
      send(data);
      return true;
    } catch (const std::runtime_error&) {
      return false;
    }
  }
  void send_line(std::string_view line) { send(std::string(line) + "\n"); }
  void shutdown_send() { ::shutdown(fd_, SHUT_WR); }

  // Everything up to and including `delim`, or nullopt at end of stream or after `timeout`.
  std::optional<std::string> read_until(std::string_view delim, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    const auto deadline = clock::now() + timeout;
    for (;;) {
      if (const auto at = buf_.find(delim); at != std::string::npos) {
        std::string out = buf_.substr(0, at + delim.size());
        buf_.erase(0, at + delim.size());
        return out;
      }
      if (!fill(deadline)) return std::nullopt;
    }
  }
  // Exactly `n` bytes, or nullopt.
  std::optional<std::string> read_exact(std::size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    const auto deadline = clock::now() + timeout;
    while (buf_.size() < n) {
      if (!fill(deadline)) return std::nullopt;
    }
    std::string out = buf_.substr(0, n);
    buf_.erase(0, n);
    return out;
  }
  // Everything until the server closes (or `timeout`: then eof() is false).
  std::string read_to_close(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    const auto deadline = clock::now() + timeout;
    while (fill(deadline)) {
    }
    return std::exchange(buf_, {});
  }
  bool eof() const { return eof_; }
  // What was received after the last complete line (an unterminated last line at end of stream).
  std::string rest() { return std::exchange(buf_, {}); }

  // The next line (without '\n'), or nullopt at end of stream or after `timeout`.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    auto line = read_until("\n", timeout);
    if (line) line->pop_back();
    return line;
  }
  boost::json::object read_json(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    const auto line = read_line(timeout);
    if (!line) throw std::runtime_error("no line from the server");
    return boost::json::parse(*line).as_object();
  }
  // True when the server closed the connection (within `timeout`).
  bool closed_by_server(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, int(timeout.count())) <= 0) return false;
    char tmp[4096];
    while (::recv(fd_, tmp, sizeof tmp, MSG_DONTWAIT) > 0) {
    }
    return ::recv(fd_, tmp, sizeof tmp, MSG_DONTWAIT) == 0;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  // One read into buf_ before `deadline`; false at end of stream (eof_ set), on error or timeout.
  bool fill(clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, int(left.count())) <= 0) return false;
    char tmp[65536];
    const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    buf_.append(tmp, std::size_t(n));
    return true;
  }

  int fd_ = -1;
  std::string buf_;
  bool eof_ = false;
};

}  // namespace anvil::testing
