// Raw HTTP/1.1 for tests, over line_client's deadline-bound socket: requests as bytes (so they
// can be malformed at will) and a reader for one response (Content-Length, chunked or until
// close) that gives up instead of hanging.
#pragma once

#include <cctype>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "tests/proto/line_client.h"

namespace anvil::testing {

using namespace std::chrono_literals;

struct http_reply {
  unsigned status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  boost::json::value json() const {
    boost::json::error_code ec;
    boost::json::value v = boost::json::parse(body, ec);
    return ec ? boost::json::value(nullptr) : v;
  }
  std::string error_code() const {
    const boost::json::value v = json();
    const boost::json::value* e = v.is_object() ? v.as_object().if_contains("error") : nullptr;
    const boost::json::value* c = e && e->is_object() ? e->as_object().if_contains("code") : nullptr;
    return c && c->is_string() ? std::string(c->as_string()) : "";
  }
};

// One HTTP response from `c` (Content-Length, chunked or until close), or nullopt if none came
// whole within `timeout`.
// An answer to HEAD (`head_only`) has no body whatever its headers say.
inline std::optional<http_reply> read_http_reply(line_client& c, std::chrono::milliseconds timeout = 60s, bool head_only = false) {
  const auto head = c.read_until("\r\n\r\n", timeout);
  if (!head) return std::nullopt;
  http_reply r;
  std::size_t at = head->find("\r\n");
  const std::string status_line = head->substr(0, at);
  if (status_line.rfind("HTTP/1.", 0) != 0 || status_line.size() < 12) return std::nullopt;
  r.status = unsigned(std::stoi(status_line.substr(9, 3)));
  for (at += 2; at + 2 < head->size();) {
    const std::size_t end = head->find("\r\n", at);
    const std::string line = head->substr(at, end - at);
    const std::size_t colon = line.find(':');
    std::string name = line.substr(0, colon);
    for (char& ch : name) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    r.headers[name] = colon == std::string::npos ? "" : line.substr(line.find_first_not_of(' ', colon + 1));
    at = end + 2;
  }
  if (r.status == 100) return read_http_reply(c, timeout, head_only);
  if (head_only) return r;
  if (auto it = r.headers.find("content-length"); it != r.headers.end()) {
    auto body = c.read_exact(std::stoul(it->second), timeout);
    if (!body) return std::nullopt;
    r.body = std::move(*body);
  } else if (r.headers["transfer-encoding"] == "chunked") {
    for (;;) {
      const auto size_line = c.read_until("\r\n", timeout);
      if (!size_line) return std::nullopt;
      const std::size_t n = std::stoul(*size_line, nullptr, 16);
      auto chunk = c.read_exact(n + 2, timeout);
      if (!chunk) return std::nullopt;
      if (n == 0) break;
      r.body += chunk->substr(0, n);
    }
  } else {
    r.body = c.read_to_close(timeout);
    if (!c.eof()) return std::nullopt;
  }
  return r;
}

// A request as raw bytes.
inline std::string http_request_bytes(const std::string& method, const std::string& target, const std::string& body = {},
                                      const std::vector<std::string>& extra_headers = {}) {
  std::string r = method + " " + target + " HTTP/1.1\r\nHost: localhost\r\n";
  for (const std::string& h : extra_headers) r += h + "\r\n";
  if (!body.empty() || method == "POST") {
    r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  return r + "\r\n" + body;
}

// `bytes` on a fresh connection; the first answer (nullopt if none came within `timeout`).
inline std::optional<http_reply> http_exchange(std::uint16_t port, const std::string& bytes, std::chrono::milliseconds timeout = 60s) {
  line_client c(port);
  c.try_send(bytes);  // the server may refuse before it has read everything: its answer still counts
  return read_http_reply(c, timeout, bytes.rfind("HEAD ", 0) == 0);
}

}  // namespace anvil::testing
