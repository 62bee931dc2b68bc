// A client that goes away at each stage of its request, over both protocols: while it waits in
// the queue (one sequence at a time, a long request ahead), during prefill (a long prompt fed a
// few tokens per step, no token generated yet), during a streamed decode, during a non-streamed
// decode, and by half-closing (shutting down its sending side) mid-stream. Each time the request
// is cancelled, the engine is back to no live request and no KV block in use, the server holds
// no connection, and another client's request runs to its end. (line_server_test and http_test
// have the mid-stream and non-streamed closes for one protocol each; this is the whole table.)
#include <string>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/proto/abuse_harness.h"

namespace {

using namespace anvil;
using namespace anvil::testing;
namespace json = boost::json;

enum class protocol { line, http };
enum class stage { queued, prefill, streaming, non_streamed, half_closed };

const char* name_of(protocol p) { return p == protocol::line ? "Line" : "Http"; }
const char* name_of(stage s) {
  switch (s) {
    case stage::queued: return "WhileQueued";
    case stage::prefill: return "DuringPrefill";
    case stage::streaming: return "DuringStreamedDecode";
    case stage::non_streamed: return "DuringNonStreamedDecode";
    case stage::half_closed: return "ByHalfClosingMidStream";
  }
  return "";
}

engine_config config_for(stage st) {
  engine_config c = abuse_engine_config();
  if (st == stage::queued) c.max_seqs = 1;
  if (st == stage::prefill) {  // a 2000-token prompt fed 2 tokens a step: a thousand steps of prefill
    c.max_model_len = 2048;
    c.max_prefill_chunk = 2;
    c.max_batch_tokens = 4;
    c.kv_budget_bytes = 16u << 20;
  }
  return c;
}

// The request that goes away, as bytes for its protocol.
std::string victim_request(protocol p, stage st) {
  json::object o{{"max_tokens", 400}, {"ignore_eos", true}, {"stream", st != stage::non_streamed}};
  if (st == stage::prefill) {
    json::array ids;
    for (int i = 0; i < 2000; ++i) ids.push_back(1 + i % 50);
    o["prompt"] = ids;
    o["max_tokens"] = 8;
  } else {
    o["prompt"] = json::array{3, 4, 5};
  }
  if (p == protocol::http) return http_request_bytes("POST", "/v1/completions", json::serialize(o));
  o["id"] = "victim";
  return json::serialize(o) + "\n";
}

// A request that must finish normally on its own connection: sent, then read to its end.
struct other_client {
  line_client c;
  protocol p;
  other_client(both_servers& s, protocol proto, int max_tokens)
      : c(proto == protocol::line ? s.line_port() : s.http_port()), p(proto) {
    const std::string body = R"({"prompt":[9,8,7],"max_tokens":)" + std::to_string(max_tokens) + R"(,"ignore_eos":true,"stream":false)";
    if (p == protocol::line) {
      c.send(R"({"id":"other",)" + body.substr(1) + "}\n");
    } else {
      c.send(http_request_bytes("POST", "/v1/completions", body + "}"));
    }
  }
  // The completion tokens of its answer (-1 when it did not come whole).
  std::int64_t finish() {
    if (p == protocol::line) {
      const json::object o = c.read_json(120s);
      return o.at("finish_reason") == "length" ? o.at("usage").at("completion_tokens").as_int64() : -1;
    }
    const auto r = read_http_reply(c, 120s);
    if (!r || r->status != 200) return -1;
    return r->json().at("usage").at("completion_tokens").as_int64();
  }
};

class ClientGone : public ::testing::TestWithParam<std::tuple<protocol, stage>> {};

TEST_P(ClientGone, CancelsTheRequestFreesItsBlocksAndLeavesOthersAlone) {
  const auto [proto, st] = GetParam();
  both_servers s(config_for(st));
  const engine_stats base = s.settled();
  const std::uint64_t cancelled0 = base.requests.finished_cancelled;

  // queued: a long request ahead holds the only sequence slot.
  std::optional<other_client> ahead;
  if (st == stage::queued) {
    ahead.emplace(s, proto, 480);
    ASSERT_TRUE(s.wait_stats([](const engine_stats& x) { return x.sched.running == 1; }));
  }
  const std::int64_t generated0 = s.eng->stats().sched.generated_tokens;
  {
    line_client victim(proto == protocol::line ? s.line_port() : s.http_port());
    victim.send(victim_request(proto, st));
    switch (st) {
      case stage::queued:
        ASSERT_TRUE(s.wait_stats([](const engine_stats& x) { return x.sched.waiting == 1; }));
        break;
      case stage::prefill:
        ASSERT_TRUE(s.wait_stats([](const engine_stats& x) { return x.kv.counts.in_use > 0; }));
        break;
      case stage::non_streamed:
        ASSERT_TRUE(s.wait_stats([&](const engine_stats& x) { return x.sched.generated_tokens > generated0; }));
        break;
      case stage::streaming:
      case stage::half_closed:
        ASSERT_TRUE(victim.read_until(proto == protocol::line ? "\"text\"" : "\"text_completion\"", 60s));
        break;
    }
    if (st == stage::half_closed) {
      victim.shutdown_send();
      victim.read_to_close(60s);  // the server hangs up once it has seen the client go
      EXPECT_TRUE(victim.eof());
    }
  }  // closed

  if (st == stage::queued) {
    // Cancelled in the queue, never run; the request ahead is untouched and runs to its end.
    EXPECT_TRUE(s.wait_stats([&](const engine_stats& x) {
      return x.sched.waiting == 0 && x.requests.finished_cancelled == cancelled0 + 1;
    }));
    EXPECT_EQ(ahead->finish(), 480);
  } else {
    other_client after(s, proto, 24);
    EXPECT_EQ(after.finish(), 24);
  }
  const engine_stats end = s.settled();
  EXPECT_EQ(end.live_requests, 0);
  EXPECT_EQ(end.kv.counts.in_use, base.kv.counts.in_use);
  EXPECT_EQ(end.requests.finished_cancelled, cancelled0 + 1);
  EXPECT_EQ(end.kv.counts.free + end.kv.counts.cached + end.kv.counts.in_use, end.kv.counts.total);
  if (st == stage::prefill) {
    // Cancelled before its first token: only the request after it generated anything.
    EXPECT_EQ(end.sched.generated_tokens - generated0, 24);
  }
  ahead.reset();
  EXPECT_TRUE(s.no_connections());
}

INSTANTIATE_TEST_SUITE_P(
    EveryStage, ClientGone,
    ::testing::Combine(::testing::Values(protocol::line, protocol::http),
                       ::testing::Values(stage::queued, stage::prefill, stage::streaming, stage::non_streamed,
                                         stage::half_closed)),
    [](const auto& param_info) {
      return std::string(name_of(std::get<0>(param_info.param))) + name_of(std::get<1>(param_info.param));
    });

}  // namespace
