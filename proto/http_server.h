// The OpenAI-compatible HTTP API's network shell: accepts connections and runs an http_session on
// each (one strand per connection). HTTP/1.1 with keep-alive; requests on a connection are
// answered in order, one at a time. Bounded headers (431), bodies (413) and queued output (a
// client that does not read its stream is cut off); slow or idle clients time out; a client that
// goes away has its requests cancelled. Beast and Asio stay in the .cpp (HTTP.md documents the API).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace anvil {
class engine;
}

namespace anvil::proto {

struct http_server_options {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;                 // 0: any free port
  std::string api_key;                    // non-empty: every endpoint but /health needs "Authorization: Bearer KEY"
  std::size_t max_body_bytes = 8u << 20;  // larger bodies: 413
  std::size_t max_queued_bytes = 4u << 20;  // answers waiting for a slow reader before it is cut off
  std::chrono::seconds idle_timeout{60};  // keep-alive connections idle this long are closed; also bounds slow headers/bodies
  std::vector<std::string> allowed_origins;  // CORS: browser origins allowed to call the API ("*": any); empty: none
  std::size_t max_connections = 0;        // open connections; past it: 503 "overloaded", closed. 0: from the
                                          // descriptor limit (tcp_listener.h, default_max_connections)
};

class http_server {
 public:
  // Binds and listens (throws std::system_error), then serves on `io` at once.
  http_server(boost::asio::io_context& io, http_server_options opt);
  ~http_server();

  // Until called: /health answers 503 {"status":"loading"}, other endpoints a 503 OpenAI error.
  void set_engine(std::shared_ptr<engine> eng);
  std::uint16_t port() const;
  std::size_t connections() const;  // open connections
  // Another server's open connections, reported by GET /metrics as anvil_connections{protocol=...}
  // beside this server's own ("http"). `count` is called from the network threads.
  void add_connection_gauge(std::string protocol, std::function<std::size_t()> count);
  void stop();  // stop accepting, close connections (in-flight requests get cancelled)

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

}  // namespace anvil::proto
