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
#include <utility>

#include <boost/json.hpp>

namespace anvil::testing {

class line_client {
 public:
  explicit line_client(std::uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
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
  void send_line(std::string_view line) { send(std::string(line) + "\n"); }

  // The next line (without '\n'), or nullopt at end of stream or after `timeout`.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (const auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, int(left.count())) <= 0) return std::nullopt;
      char tmp[65536];
      const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
      if (n <= 0) return std::nullopt;
      buf_.append(tmp, std::size_t(n));
    }
  }
  // What was received after the last complete line (an unterminated last line at end of stream).
  std::string rest() { return std::exchange(buf_, {}); }
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
  int fd_ = -1;
  std::string buf_;
};

}  // namespace anvil::testing
