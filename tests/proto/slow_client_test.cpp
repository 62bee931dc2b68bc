// Half-open and slow clients on both servers: half a line or half the headers and then nothing,
// bytes trickled so slowly that a line or a request never completes, a body that stops half-way,
// an Expect: 100-continue with no body, idle connections — each closed once its documented
// timeout passes — and clients that never read their streams, cut off past the queued-output
// bound with their requests cancelled. A well-behaved client keeps getting correct answers
// throughout. (Timeouts are 1 s here; the waits only turn hangs into failures.)
#include <chrono>
#include <thread>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/proto/abuse_harness.h"

namespace {

using namespace anvil;
using namespace anvil::testing;
namespace json = boost::json;

both_servers short_limits(std::chrono::seconds idle_timeout, std::size_t max_queued = 4u << 20) {
  proto::line_server_options lopt;
  lopt.idle_timeout = idle_timeout;
  lopt.max_queued_bytes = max_queued;
  proto::http_server_options hopt;
  hopt.idle_timeout = idle_timeout;
  hopt.max_queued_bytes = max_queued;
  return both_servers(abuse_engine_config(), lopt, hopt);
}

// Sends `data` one byte every `gap` until the server closes the connection (true) or `limit`
// passes (false).
bool trickle_until_closed(line_client& c, const std::string& data, std::chrono::milliseconds gap, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  for (std::size_t i = 0; std::chrono::steady_clock::now() < end; ++i) {
    if (!c.try_send(std::string(1, data[i % data.size()]))) return true;
    if (c.closed_by_server(gap)) return true;
  }
  return false;
}

TEST(SlowClients, LineHalfLinesTrickledLinesAndIdleConnectionsTimeOut) {
  both_servers s = short_limits(std::chrono::seconds(1));
  steady_client good(s.line_port(), s.http_port());

  line_client half(s.line_port());
  half.send(R"({"id":1,"prompt":[1,2],"max_tok)");
  line_client idle(s.line_port());
  line_client trickler(s.line_port());
  // A line that keeps growing but never ends: closed although bytes keep coming.
  EXPECT_TRUE(trickle_until_closed(trickler, R"({"id":2,"prompt":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaa)", 100ms, 30s));
  EXPECT_TRUE(half.closed_by_server(30s));
  EXPECT_TRUE(idle.closed_by_server(30s));

  // A client that sends a request and waits quietly for the answer is not idle while it runs;
  // once answered and silent it is.
  line_client patient(s.line_port());
  patient.send_line(R"({"id":"p","prompt":[1,2],"max_tokens":400,"ignore_eos":true,"stream":false})");
  const json::object done = patient.read_json(60s);
  EXPECT_EQ(done.at("finish_reason"), "length") << json::serialize(done);
  EXPECT_TRUE(patient.closed_by_server(30s));

  expect_steady(good);
  EXPECT_TRUE(s.no_connections());
  const engine_stats st = s.settled();
  EXPECT_EQ(st.kv.counts.in_use, 0);
  EXPECT_EQ(st.live_requests, 0);
}

TEST(SlowClients, HttpSlowlorisHeadersAndStalledBodiesTimeOut) {
  both_servers s = short_limits(std::chrono::seconds(1));
  steady_client good(s.line_port(), s.http_port());

  line_client half(s.http_port());
  half.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le");
  line_client body(s.http_port());
  body.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            R"({"prompt": "Hello", "max_to)");
  line_client expect(s.http_port());
  expect.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\nExpect: 100-continue\r\n\r\n");
  const auto cont = expect.read_until("\r\n\r\n", 30s);
  ASSERT_TRUE(cont);
  EXPECT_EQ(cont->rfind("HTTP/1.1 100 Continue", 0), 0u) << *cont;
  // Headers trickled a byte at a time, endlessly: the limit is on the whole request, not per byte.
  line_client trickler(s.http_port());
  EXPECT_TRUE(trickle_until_closed(trickler, "GET /health HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaa", 100ms, 30s));
  for (line_client* c : {&half, &body, &expect}) {
    EXPECT_EQ(c->read_to_close(30s), "");  // closed without an answer
    EXPECT_TRUE(c->eof());
  }
  expect_steady(good);
  EXPECT_TRUE(s.no_connections());
  EXPECT_EQ(s.settled().live_requests, 0);
}

// Bytes the server writes faster than a client with a 4 KiB receive buffer reads nothing: many
// long streams with 20 alternatives per token, well past the 64 KiB bound plus what the kernel
// buffers hold. (The usual timeouts: the bound, not a timeout, cuts them off.) The deaf streams
// (8 + 4) leave 4 of the engine's 16 sequence slots free: the well-behaved client is never queued
// behind them, so its answers do not wait on how fast the deaf ones fill their buffers (under
// TSan on 2 cores that took most of its 60 s).
TEST(SlowClients, ClientsThatNeverReadAreCutOffAndTheirRequestsCancelled) {
  both_servers s = short_limits(std::chrono::seconds(60), 64 * 1024);
  steady_client good(s.line_port(), s.http_port());
  const std::uint64_t cancelled0 = s.eng->stats().requests.finished_cancelled;

  line_client deaf_line(s.line_port(), 4096);
  for (int i = 0; i < 8; ++i) {
    deaf_line.send_line(R"({"id":)" + std::to_string(i) +
                        R"(,"prompt":[1,2,3],"max_tokens":480,"ignore_eos":true,"logprobs":20,"temperature":1,"seed":)" +
                        std::to_string(i) + "}");
  }
  line_client deaf_http(s.http_port(), 4096);
  const std::string chat = R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":480,"ignore_eos":true,"stream":true,)"
                           R"("n":4,"logprobs":true,"top_logprobs":20,"temperature":1})";
  deaf_http.send(http_request_bytes("POST", "/v1/chat/completions", chat));

  // Both cut off: their requests are cancelled (not finished) and the engine is idle again.
  EXPECT_TRUE(s.wait_stats([&](const engine_stats& st) {
    return st.live_requests == 0 && st.requests.finished_cancelled >= cancelled0 + 2;
  }));
  const engine_stats st = s.settled();
  EXPECT_EQ(st.kv.counts.in_use, 0);
  EXPECT_GE(st.requests.finished_cancelled - cancelled0, 2u);
  // What the server had written before it gave up is there; then the connection is closed.
  EXPECT_FALSE(deaf_line.read_to_close(60s).empty());
  EXPECT_TRUE(deaf_line.eof());
  EXPECT_FALSE(deaf_http.read_to_close(60s).empty());
  EXPECT_TRUE(deaf_http.eof());
  expect_steady(good);
  EXPECT_TRUE(s.no_connections());
}

}  // namespace
