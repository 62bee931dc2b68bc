// The TCP line protocol end to end over loopback, against a real engine on a tiny random-weight
// model: streaming and not, many requests on one connection, concurrent clients, cancel,
// disconnect mid-stream (KV back to baseline), overload, malformed input of many kinds (the
// connection and the server keep working), and the API key.
#include <chrono>
#include <map>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "proto/line_server.h"
#include "tests/model/fixtures.h"
#include "tests/proto/line_client.h"

namespace {

using namespace anvil;
namespace asio = boost::asio;
namespace json = boost::json;
using anvil::testing::line_client;

engine_config tiny_config() {
  engine_config c;
  c.model_path = model::testing::synth_fixture("tiny", model::synth_mix::f32);
  c.kv_budget_bytes = 8u << 20;
  c.max_batch_tokens = 256;
  c.max_seqs = 16;
  c.max_prefill_chunk = 64;
  c.max_model_len = 256;
  return c;
}

class LineServer : public ::testing::Test {
 protected:
  void start(engine_config cfg = tiny_config(), proto::line_server_options opt = {}) {
    eng_ = engine::create(cfg);
    server_ = std::make_unique<proto::line_server>(io_, eng_, opt);
    for (int i = 0; i < 2; ++i) threads_.emplace_back([this] { io_.run(); });
  }
  void TearDown() override {
    if (server_) server_->stop();
    work_.reset();
    for (auto& t : threads_) t.join();
    server_.reset();
    if (eng_) eng_->async_stop(asio::use_future).get();
  }
  std::uint16_t port() const { return server_->port(); }

  // Engine stats once no request is live and no KV block is in use (or what it is after 20 s).
  engine_stats settled() {
    engine_stats s = eng_->stats();
    for (int i = 0; i < 2000 && (s.kv.counts.in_use != 0 || s.live_requests != 0); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      s = eng_->stats();
    }
    return s;
  }

  // Reads lines until the final one of `id` ("done" or "error"); returns them all, in order.
  static std::vector<json::object> until_end(line_client& c, const json::value& id) {
    std::vector<json::object> lines;
    for (;;) {
      json::object o = c.read_json();
      const bool mine = o.at("id") == id;
      const bool last = mine && (o.contains("done") || o.contains("error"));
      lines.push_back(std::move(o));
      if (last) return lines;
    }
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  std::vector<std::thread> threads_;
  std::shared_ptr<engine> eng_;
  std::unique_ptr<proto::line_server> server_;
};

std::string text_of(const std::vector<json::object>& lines) {
  std::string t;
  for (const auto& o : lines) {
    if (o.contains("text")) t += o.at("text").as_string();
  }
  return t;
}

TEST_F(LineServer, StreamsChunksThenAFinalLineAndMatchesTheNonStreamedText) {
  start();
  line_client c(port());
  c.send_line(R"({"id":"s","prompt":[5,6,7,8],"max_tokens":9,"ignore_eos":true})");
  const auto lines = until_end(c, "s");
  ASSERT_EQ(lines.size(), 10u);  // one chunk per token, then done
  std::vector<std::int64_t> tokens;
  for (std::size_t i = 0; i + 1 < lines.size(); ++i) {
    ASSERT_EQ(lines[i].at("tokens").as_array().size(), 1u);
    tokens.push_back(lines[i].at("tokens").as_array()[0].as_int64());
  }
  const json::object& done = lines.back();
  EXPECT_EQ(done.at("done"), true);
  EXPECT_EQ(done.at("finish_reason"), "length");
  EXPECT_EQ(done.at("usage").at("prompt_tokens"), 4);
  EXPECT_EQ(done.at("usage").at("completion_tokens"), 9);
  EXPECT_GT(done.at("timings").at("ttft_ms").as_double(), 0.0);

  c.send_line(R"({"id":"n","prompt":[5,6,7,8],"max_tokens":9,"ignore_eos":true,"stream":false})");
  const auto whole = until_end(c, "n");
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].at("text").as_string(), text_of(lines));
  std::vector<std::int64_t> whole_tokens;
  for (const auto& t : whole[0].at("tokens").as_array()) whole_tokens.push_back(t.as_int64());
  EXPECT_EQ(whole_tokens, tokens);
}

TEST_F(LineServer, ManyRequestsInFlightOnOneConnectionAndAcrossClients) {
  start();
  constexpr int clients = 4, per_client = 8;
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int k = 0; k < clients; ++k) {
    ts.emplace_back([&, k] {
      line_client c(port());
      for (int i = 0; i < per_client; ++i) {
        json::object req{{"id", i % 2 ? json::value(i) : json::value("r" + std::to_string(i))},
                         {"prompt", json::array{k + 1, i + 2, 3}}, {"max_tokens", 3 + i}, {"ignore_eos", true}};
        c.send_line(json::serialize(req));
      }
      std::map<std::string, int> chunks;
      int done = 0;
      while (done < per_client) {
        const json::object o = c.read_json();
        const std::string id = json::serialize(o.at("id"));
        if (o.contains("error")) break;
        if (o.contains("done")) {
          ++done;
          const int i = o.at("id").is_string() ? std::stoi(std::string(o.at("id").as_string().subview(1))) : int(o.at("id").as_int64());
          if (chunks[id] == 3 + i && o.at("usage").at("completion_tokens") == 3 + i) ++ok;
        } else {
          ++chunks[id];
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok, clients * per_client);
  EXPECT_EQ(settled().kv.counts.in_use, 0);
}

TEST_F(LineServer, CancelEndsTheRequestAndUnknownIdsAreErrors) {
  start();
  line_client c(port());
  c.send_line(R"({"id":7,"prompt":[1,2,3],"max_tokens":200,"ignore_eos":true})");
  const json::object first = c.read_json();
  EXPECT_EQ(first.at("id"), 7);
  c.send_line(R"({"cancel":7})");
  const auto rest = until_end(c, 7);
  EXPECT_EQ(rest.back().at("finish_reason"), "cancelled");
  EXPECT_LT(rest.back().at("usage").at("completion_tokens").as_int64(), 200);
  c.send_line(R"({"cancel":7})");
  const json::object unknown = c.read_json();
  EXPECT_EQ(unknown.at("id"), 7);
  EXPECT_EQ(unknown.at("error").at("code"), "unknown_id");
  EXPECT_EQ(settled().kv.counts.in_use, 0);
}

TEST_F(LineServer, AnIdWrittenWithAZeroFractionIsThatInteger) {
  // Integer fields accept 1.0; so does `id`, as the integer it is (echoed as 8, cancelled as 8).
  start();
  line_client c(port());
  c.send_line(R"({"id":8.0,"prompt":[1,2,3],"max_tokens":200,"ignore_eos":true})");
  const json::object first = c.read_json();
  ASSERT_FALSE(first.contains("error")) << json::serialize(first);
  EXPECT_TRUE(first.at("id").is_int64());
  EXPECT_EQ(first.at("id"), 8);
  c.send_line(R"({"cancel":8})");
  EXPECT_EQ(until_end(c, 8).back().at("finish_reason"), "cancelled");
  c.send_line(R"({"id":9,"prompt":[1],"max_tokens":1})");
  EXPECT_EQ(until_end(c, 9).back().at("finish_reason"), "length");
}

TEST_F(LineServer, DisconnectMidStreamCancelsAndFreesTheKvCache) {
  start();
  const engine_stats before = settled();
  {
    line_client c(port());
    for (int i = 0; i < 6; ++i) {
      c.send_line(R"({"id":)" + std::to_string(i) + R"(,"prompt":[1,2,3,4,5,6,7,8,9],"max_tokens":240,"ignore_eos":true})");
    }
    c.send_line(R"({"id":"quiet","prompt":[1,2],"max_tokens":240,"ignore_eos":true,"stream":false})");
    ASSERT_TRUE(c.read_line());  // generation is under way
  }  // the client goes away
  const engine_stats after = settled();
  EXPECT_EQ(after.kv.counts.in_use, before.kv.counts.in_use);
  EXPECT_EQ(after.live_requests, 0);
  EXPECT_GE(after.requests.finished_cancelled, 7u);
  for (int i = 0; i < 200 && server_->connections() != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(server_->connections(), 0u);
}

TEST_F(LineServer, MalformedLinesGetErrorsAndTheConnectionKeepsWorking) {
  proto::line_server_options opt;
  opt.max_line_bytes = 4096;
  start(tiny_config(), opt);
  line_client c(port());
  struct bad_line {
    std::string line;
    json::value id;
    std::string code;
  };
  const std::vector<bad_line> cases = {
      {"not json", nullptr, "invalid_json"},
      {"[1,2,3]", nullptr, "invalid_json"},
      {"{\"id\":1,\"prompt\":\"x\"", nullptr, "invalid_json"},
      {"{\"id\":\"\xff\",\"prompt\":\"x\"}", nullptr, "invalid_json"},  // invalid UTF-8
      {R"({"prompt":"x"})", nullptr, "invalid_request"},
      {R"({"id":[1],"prompt":"x"})", nullptr, "invalid_request"},
      {R"({"id":1.5,"prompt":"x"})", nullptr, "invalid_request"},
      {R"({"id":"a","prompt":"x","temperature":"hot"})", "a", "invalid_request"},
      {R"({"id":"b","prompt":"x","top_p":1.5})", "b", "invalid_request"},
      {R"({"id":"c","prompt":"x","max_tokens":0})", "c", "invalid_request"},
      {R"({"id":"d","prompt":"x","max_tokens":-5})", "d", "invalid_request"},
      {R"({"id":"e","prompt":[1,2,999999]})", "e", "invalid_request"},
      {R"({"id":2.5e0,"prompt":"x"})", nullptr, "invalid_request"},
      {R"({"id":"f","prompt":"x","logit_bias":{"999999":1}})", "f", "invalid_request"},
      {R"({"id":"g","prompt":"x","logprobs":50})", "g", "invalid_request"},
      {R"({"id":"h","prompt":"x","temperature":-1})", "h", "invalid_request"},
      {R"({"id":"i"})", "i", "invalid_request"},
      {R"({"id":"j","messages":"hi"})", "j", "invalid_request"},
      {R"({"id":"k","messages":[{"role":"user","content":"hi"}]})", "k", "invalid_request"},  // no chat template
      {R"({"cancel":[1]})", nullptr, "invalid_request"},
      {R"({"cancel":"nobody"})", "nobody", "unknown_id"},
      {std::string(5000, 'x'), nullptr, "line_too_long"},
      {"{\"id\":\"l\",\"prompt\":[" + [] {
         std::string s = "1";
         for (int i = 0; i < 300; ++i) s += ",1";
         return s;
       }() + "]}",
       "l", "context_overflow"},
  };
  for (const bad_line& b : cases) {
    c.send_line(b.line);
    const json::object o = c.read_json();
    ASSERT_TRUE(o.contains("error")) << b.line << " -> " << json::serialize(o);
    EXPECT_EQ(o.at("id"), b.id) << b.line;
    EXPECT_EQ(o.at("error").at("code").as_string(), b.code) << b.line << " -> " << json::serialize(o);
    EXPECT_FALSE(o.at("error").at("message").as_string().empty());
  }
  c.send_line("   ");  // blank lines are ignored
  c.send_line(R"({"id":"dup","prompt":[1],"max_tokens":100,"ignore_eos":true,"stream":false})");
  c.send_line(R"({"id":"dup","prompt":[1],"max_tokens":1})");
  const json::object dup = c.read_json();
  EXPECT_EQ(dup.at("error").at("code"), "duplicate_id");
  const auto end = until_end(c, "dup");
  EXPECT_EQ(end.back().at("finish_reason"), "length");
  // The connection, and the server, still answer correctly.
  c.send_line(R"({"id":"ok","prompt":[1,2],"max_tokens":2,"ignore_eos":true})");
  EXPECT_EQ(until_end(c, "ok").back().at("usage").at("completion_tokens"), 2);
  line_client other(port());
  other.send_line(R"({"id":1,"prompt":"hello","max_tokens":2,"ignore_eos":true})");
  EXPECT_EQ(until_end(other, 1).back().at("finish_reason"), "length");
}

TEST_F(LineServer, AFullQueueIsRefusedWithOverloaded) {
  engine_config cfg = tiny_config();
  cfg.max_queue = 1;
  cfg.max_seqs = 1;
  start(cfg);
  line_client c(port());
  constexpr int n = 40;
  for (int i = 0; i < n; ++i) {
    c.send_line(R"({"id":)" + std::to_string(i) + R"(,"prompt":[1,2,3],"max_tokens":20,"ignore_eos":true,"stream":false})");
  }
  int done = 0, overloaded = 0;
  while (done + overloaded < n) {
    const json::object o = c.read_json();
    if (o.contains("error")) {
      ASSERT_EQ(o.at("error").at("code"), "overloaded") << json::serialize(o);
      ++overloaded;
    } else {
      ASSERT_EQ(o.at("finish_reason"), "length");
      ++done;
    }
  }
  EXPECT_GT(overloaded, 0);
  EXPECT_GT(done, 0);
  EXPECT_EQ(settled().kv.counts.in_use, 0);
}

TEST_F(LineServer, AnApiKeyIsRequiredWhenConfigured) {
  proto::line_server_options opt;
  opt.api_key = "sesame";
  start(tiny_config(), opt);
  {
    line_client c(port());
    c.send_line(R"({"id":1,"prompt":[1],"max_tokens":1})");
    EXPECT_EQ(c.read_json().at("error").at("code"), "unauthorized");
    c.send_line(R"({"auth":"sesame"})");
    EXPECT_EQ(c.read_json().at("auth"), "ok");
    c.send_line(R"({"id":1,"prompt":[1],"max_tokens":1})");
    EXPECT_EQ(until_end(c, 1).back().at("finish_reason"), "length");
  }
  line_client wrong(port());
  wrong.send_line(R"({"auth":"open"})");
  EXPECT_EQ(wrong.read_json().at("error").at("code"), "unauthorized");
  EXPECT_TRUE(wrong.closed_by_server());
}

TEST_F(LineServer, LogprobsTravelWithEachChunk) {
  start();
  line_client c(port());
  c.send_line(R"({"id":1,"prompt":[4,5],"max_tokens":3,"ignore_eos":true,"logprobs":2})");
  const auto lines = until_end(c, 1);
  ASSERT_EQ(lines.size(), 4u);
  for (std::size_t i = 0; i < 3; ++i) {
    const json::array& lp = lines[i].at("logprobs").as_array();
    ASSERT_EQ(lp.size(), 1u);
    EXPECT_LE(lp[0].to_number<double>(), 0.0);
    const json::array& top = lines[i].at("top_logprobs").as_array()[0].as_array();
    ASSERT_EQ(top.size(), 2u);
    EXPECT_EQ(top[0].at("token"), lines[i].at("tokens").as_array()[0]);  // greedy: the chosen one is the most likely
    EXPECT_TRUE(top[0].as_object().contains("text"));
  }
}

}  // namespace
