// The per-server connection cap (max_connections): past it a connection is answered — 503 with
// the OpenAI error code `overloaded` over HTTP, an `overloaded` error line over the line protocol —
// and closed, while the connections already open keep working; once one closes, a new one is
// served again. (Running out of descriptors altogether is serve_test's, on a real process.)
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/proto/abuse_harness.h"

namespace {

using namespace anvil;
using namespace anvil::testing;
namespace json = boost::json;

constexpr std::size_t cap = 3;

template <class Count>
bool wait_for_count(Count count, std::size_t want) {
  for (int i = 0; i < 2000; ++i) {
    if (count() == want) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

struct capped_servers : both_servers {
  static proto::line_server_options lopt() {
    proto::line_server_options o;
    o.max_connections = cap;
    return o;
  }
  static proto::http_server_options hopt() {
    proto::http_server_options o;
    o.max_connections = cap;
    return o;
  }
  capped_servers() : both_servers(abuse_engine_config(), lopt(), hopt()) {}
};

TEST(ConnectionLimit, HttpPastTheCapIs503OverloadedAndClosed) {
  capped_servers s;
  std::vector<std::unique_ptr<line_client>> open;
  for (std::size_t i = 0; i < cap; ++i) open.push_back(std::make_unique<line_client>(s.http_port()));
  ASSERT_TRUE(wait_for_count([&] { return s.http->connections(); }, cap));

  for (int round = 0; round < 3; ++round) {
    line_client extra(s.http_port());
    extra.try_send(http_request_bytes("GET", "/health"));
    const auto r = read_http_reply(extra, 30s);
    ASSERT_TRUE(r) << "no answer past the cap";
    EXPECT_EQ(r->status, 503u);
    EXPECT_EQ(r->error_code(), "overloaded") << r->body;
    EXPECT_EQ(extra.read_to_close(30s), "");
    EXPECT_TRUE(extra.eof());
  }
  EXPECT_EQ(s.http->connections(), cap);  // refused ones never count

  // The open ones are unaffected; one closing makes room.
  open[0]->send(http_request_bytes("GET", "/health"));
  const auto ok = read_http_reply(*open[0], 30s);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200u);
  open[1].reset();
  ASSERT_TRUE(wait_for_count([&] { return s.http->connections(); }, cap - 1));
  const auto again = http_exchange(s.http_port(), http_request_bytes("GET", "/health"), 30s);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200u);
}

TEST(ConnectionLimit, LinePastTheCapGetsAnOverloadedLineAndIsClosed) {
  capped_servers s;
  std::vector<std::unique_ptr<line_client>> open;
  for (std::size_t i = 0; i < cap; ++i) open.push_back(std::make_unique<line_client>(s.line_port()));
  ASSERT_TRUE(wait_for_count([&] { return s.line->connections(); }, cap));

  line_client extra(s.line_port());
  const json::object o = extra.read_json(30s);
  EXPECT_TRUE(o.at("id").is_null()) << json::serialize(o);
  EXPECT_EQ(o.at("error").at("code"), "overloaded") << json::serialize(o);
  EXPECT_TRUE(extra.closed_by_server(30s));
  EXPECT_EQ(s.line->connections(), cap);

  open[0].reset();
  ASSERT_TRUE(wait_for_count([&] { return s.line->connections(); }, cap - 1));
  line_client next(s.line_port());
  next.send_line(R"({"id":1,"prompt":[1,2],"max_tokens":2,"ignore_eos":true,"stream":false})");
  const json::object done = next.read_json(60s);
  EXPECT_EQ(done.at("finish_reason"), "length") << json::serialize(done);
}

}  // namespace
