// The TCP line protocol's network shell: accepts connections and runs a line_session on each
// (one strand per connection). Lines are bounded; a client that does not read its answers has
// its connection closed once they pass a bound; idle connections and lines sent too slowly time
// out; a client that goes away has its requests cancelled. Asio stays in the .cpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace boost::asio {
class io_context;
}

namespace anvil {
class engine;
}

namespace anvil::proto {

struct line_server_options {
  std::string host = "127.0.0.1";          // address to listen on
  std::uint16_t port = 0;                  // 0: any free port (see line_server::port)
  std::size_t max_line_bytes = 1u << 20;   // longer request lines get a line_too_long error
  std::size_t max_queued_bytes = 4u << 20; // answers waiting for a slow reader before it is cut off
  std::string api_key;                     // non-empty: connections must send {"auth": KEY} first
  std::chrono::seconds idle_timeout{60};   // a line must end this soon after its first byte; a connection with
                                           // nothing in flight and no line or answer for this long is closed; 0: never
  std::size_t max_connections = 0;         // open connections; past it: an `overloaded` error line, closed. 0: from
                                           // the descriptor limit (tcp_listener.h, default_max_connections)
};

class line_server {
 public:
  // Binds and listens (throws std::system_error when the address cannot be bound), then accepts
  // on `io` until stop().
  line_server(boost::asio::io_context& io, std::shared_ptr<engine> eng, line_server_options opt);
  ~line_server();

  std::uint16_t port() const;        // the bound port
  std::size_t connections() const;   // open connections
  void stop();                       // stops accepting and closes every connection

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

}  // namespace anvil::proto
