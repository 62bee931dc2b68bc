// bench_client: how run_bench() sends one request and learns how it went, whatever the server
// speaks. Two implementations, each in its own .cpp: the TCP line protocol (a few connections,
// requests multiplexed by id) and OpenAI HTTP + SSE (one connection per request in flight,
// kept alive and reused). Both run on one io_context on one thread; Asio stays in the .cpp files
// (only a forward declaration here).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "bench/load/bench_options.h"
#include "bench/load/bench_stats.h"
#include "bench/load/prompts.h"

namespace boost::asio {
class io_context;
}

namespace anvil::bench {

// What a client needs besides the target.
struct client_config {
  bench_target target;      // host, port, protocol
  std::string endpoint;     // HTTP path of the completions / chat endpoint
  std::string model;        // HTTP: the model named in bodies
  std::string api_key;      // "" for none
  double timeout_s = 600;   // per request: send -> final answer
  int connections = 1;      // line protocol: connections to spread requests over
};

class bench_client {
 public:
  using done_fn = std::function<void(request_result)>;
  virtual ~bench_client() = default;

  // Sends one request for `max_tokens` tokens. `done` runs exactly once, on the io_context's
  // thread (never inside send()), with the measured result or the failure.
  virtual void send(const bench_prompt& prompt, int max_tokens, done_fn done) = 0;
  // Fails every request in flight with `why`, closes the connections; later sends fail at once.
  virtual void shutdown(const std::string& why) = 0;
};

std::unique_ptr<bench_client> make_line_client(boost::asio::io_context& io, const client_config& config);
std::unique_ptr<bench_client> make_http_client(boost::asio::io_context& io, const client_config& config);

// GET /v1/models on an HTTP target: the first model id, or "default" when there is none or the
// call fails. Runs `io` until it has the answer.
std::string discover_model(boost::asio::io_context& io, const client_config& config);

}  // namespace anvil::bench
