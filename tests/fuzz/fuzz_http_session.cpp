// Fuzz target: HTTP requests as the server hands them to http_session (proto/http_session.h),
// without the socket or Beast, against a real engine on the micro model. Input: a flags byte
// (API key set; client hangs up mid-answer; no engine yet), then "METHOD TARGET\n", the
// Authorization header line, and the body; several requests follow each other on one connection
// when the body contains a line "\x1e" (record separator). Checked: each exchange ends in exactly
// one whole answer (a JSON body where the type says JSON) or one SSE stream of "data: " events,
// and the next request is taken only after it; a hang-up cancels what is in flight.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <boost/json.hpp>

#include "proto/http_session.h"
#include "tests/fuzz/session_driver.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

std::string_view take_line(std::string_view& s) {
  const std::size_t nl = s.find('\n');
  const std::string_view line = s.substr(0, nl);
  s = nl == std::string_view::npos ? std::string_view() : s.substr(nl + 1);
  return line;
}

struct exchange_state {
  int answers = 0;      // whole responses plus ended streams
  bool streaming = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace anvil;
  namespace json = boost::json;
  if (size == 0) return 0;
  const bool with_key = data[0] & 1, hang_up = data[0] & 2, no_engine = (data[0] & 0x0c) == 0x0c;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);

  const std::shared_ptr<engine> eng = no_engine ? nullptr : fuzz::micro_engine();
  fuzz::strand_queue strand;
  exchange_state st;
  proto::http_session_hooks hooks;
  hooks.respond = [&st](proto::http_response r) {
    check(!st.streaming);
    ++st.answers;
    if (r.content_type == "application/json") {
      json::error_code ec;
      json::parse(r.body, ec);
      check(!ec);
    }
  };
  hooks.start_stream = [&st] {
    check(!st.streaming);
    st.streaming = true;
  };
  hooks.stream = [&st](std::string event) {
    check(st.streaming && event.starts_with("data: ") && event.ends_with("\n\n"));
  };
  hooks.end_stream = [&st](bool) {
    check(st.streaming);
    st.streaming = false;
    ++st.answers;
  };
  hooks.post = [&strand](std::function<void()> fn) { strand.post(std::move(fn)); };
  auto session = std::make_shared<proto::http_session>(hooks, with_key ? "k3y" : "");

  int requests = 0;
  while (!rest.empty() && requests < 8) {
    const std::size_t end = rest.find("\n\x1e\n");
    std::string_view one = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 3);
    const std::string_view start = take_line(one);
    const std::size_t sp = start.find(' ');
    proto::http_request r;
    r.method = std::string(start.substr(0, sp));
    r.target = sp == std::string_view::npos ? "/" : std::string(start.substr(sp + 1));
    r.authorization = std::string(take_line(one));
    r.body = std::string(one);
    session->handle(std::move(r), eng);
    ++requests;
    if (hang_up && rest.empty()) break;  // the client leaves with its last request in flight
    strand.run_until([&] { return st.answers == requests; });
  }
  if (hang_up) {
    session->on_close();
  } else {
    strand.run_until([&] { return !session->busy(); });
  }
  if (eng) strand.settle(*eng);
  strand.run_ready();
  check(hang_up || st.answers == requests);
  return 0;
}
