// Fuzz target: one TCP line-protocol connection without the socket (proto/line_session.h) against
// a real engine on the micro model. The first byte sets an API key and whether the client hangs
// up before its requests end; the rest is the client's lines. Checked: every line the server
// writes is one JSON object ending in '\n'; every request ends (cancelled on hang-up) and no
// event reaches the session afterwards.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <boost/json.hpp>

#include "proto/line_session.h"
#include "tests/fuzz/session_driver.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace anvil;
  namespace json = boost::json;
  if (size == 0) return 0;
  const bool with_key = data[0] & 1, hang_up = data[0] & 2;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);

  engine& eng = *fuzz::micro_engine();
  fuzz::strand_queue strand;
  proto::line_session_hooks hooks;
  hooks.write = [](std::string line) {
    json::error_code ec;
    if (line.empty() || line.back() != '\n' || !json::parse(line, ec).is_object() || ec) std::abort();
  };
  hooks.post = [&strand](std::function<void()> fn) { strand.post(std::move(fn)); };
  hooks.close = [] {};
  auto session = std::make_shared<proto::line_session>(fuzz::micro_engine(), hooks, with_key ? "k3y" : "");

  while (!rest.empty()) {
    const std::size_t nl = rest.find('\n');
    const std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    if (line.size() > 4096) {
      session->on_line_too_long();
    } else {
      session->on_line(line);
    }
    strand.run_ready();
  }
  if (hang_up) session->on_close();
  strand.run_until([&] { return session->in_flight() == 0; });
  strand.settle(eng);
  if (session->in_flight() != 0) std::abort();
  return 0;
}
