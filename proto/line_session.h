// One TCP line-protocol connection, without the socket: lines in, lines out (PROTOCOL.md).
// The network shell (line_server.cpp) feeds it complete lines and carries its output; tests drive
// it directly. Every method runs on the connection's strand; engine events reach it through the
// `post` hook, which must run them there too (never inline).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include <boost/json/value.hpp>

#include "engine/engine.h"

namespace anvil::proto {

struct line_session_hooks {
  std::function<void(std::string line)> write;               // one answer line, '\n' included
  std::function<void(std::function<void()>)> post;           // run later on the connection's strand
  std::function<void()> close;                               // close the connection (a wrong API key)
};

class line_session : public std::enable_shared_from_this<line_session> {
 public:
  line_session(std::shared_ptr<engine> eng, line_session_hooks hooks, std::string api_key = {});

  void on_line(std::string_view line);  // one complete line, without its '\n'
  void on_line_too_long();              // a line passed the limit; its rest is being skipped
  void on_close();                      // the client is gone: cancel everything in flight

  std::size_t in_flight() const { return flights_.size(); }

 private:
  struct flight {
    std::uint64_t engine_id = 0;
    boost::json::value id;            // the client's id, echoed on every line
    bool stream = true;
    bool logprobs = false;
    std::string text{};               // stream == false: the whole output so far
    std::vector<std::int32_t> tokens{};
    std::vector<float> token_logprobs{};
    std::vector<std::vector<sampler::token_logprob>> top{};
    std::optional<model::chat_output_parser> parser{};  // messages with tools or a thinking template
    std::string output{};             // with a parser: the whole output, split on the final line
  };

  void on_event(const std::string& key, const stream_event& e);
  void submit(boost::json::object& o);
  void cancel(const boost::json::value& id);
  void error(const boost::json::value& id, std::string_view code, std::string_view message);
  void send(const boost::json::object& o);

  std::shared_ptr<engine> eng_;
  line_session_hooks hooks_;
  std::string api_key_;
  bool authed_;
  bool closed_ = false;
  std::unordered_map<std::string, flight> flights_;  // by the serialised client id
};

}  // namespace anvil::proto
