// `anvil serve` as a process with a device fault injected (ANVIL_FAULT_INJECT): requests in
// flight over both protocols, streamed and not, end with an error; later ones are refused with
// one; /health answers 503 "unhealthy", /metrics anvil_healthy 0; SIGTERM still exits 0. And,
// without a fault, a seeded sampled request gives the same text over HTTP and the line protocol,
// streamed or not.
#include <signal.h>

#include <chrono>
#include <future>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/model/fixtures.h"
#include "tests/proto/child_process.h"
#include "tests/proto/line_client.h"

namespace {

namespace json = boost::json;
using anvil::testing::child;
using anvil::testing::line_client;

struct ports {
  std::uint16_t http = 0, line = 0;
};

ports wait_ready(child& srv) {
  const std::smatch m = srv.wait_for(std::regex(R"(http://127\.0\.0\.1:(\d+), line protocol on tcp://127\.0\.0\.1:(\d+))"));
  if (m.empty()) return {};
  return {std::uint16_t(std::stoi(m[1])), std::uint16_t(std::stoi(m[2]))};
}

// One HTTP/1.1 exchange on its own connection, which the server closes after it: the whole
// response as text (empty if the server does not answer and close within the limit).
std::string http(std::uint16_t port, const std::string& method, const std::string& path, const std::string& body = "") {
  line_client c(port);
  c.send(method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  std::string all;
  while (auto l = c.read_line(std::chrono::seconds(90))) all += *l + "\n";
  return all + c.rest();
}

std::string status_line(const std::string& response) { return response.substr(0, response.find('\r')); }

// The error object of an OpenAI-shaped error anywhere in `text` (a body, or an SSE data line).
json::object error_in(const std::string& text) {
  const auto at = text.find("{\"error\"");
  if (at == std::string::npos) return {};
  json::error_code ec;
  const json::value v = json::parse(text.substr(at, text.find('\n', at) - at), ec);
  return ec ? json::object{} : v.at("error").as_object();
}

// Reads a line-protocol connection until every id in `ids` has ended; returns the last line of each.
std::map<std::int64_t, json::object> until_ended(line_client& c, std::vector<std::int64_t> ids, std::string& seen) {
  std::map<std::int64_t, json::object> last;
  while (last.size() < ids.size()) {
    const auto line = c.read_line(std::chrono::seconds(90));
    if (!line) break;
    seen += *line + "\n";
    const json::object o = json::parse(*line).as_object();
    if (o.contains("error") || o.contains("done")) last[o.at("id").as_int64()] = o;
  }
  return last;
}

TEST(ServeFault, AFaultedServerAnswersWithErrorsReportsUnhealthyAndExitsOnSigterm) {
  const std::string model = anvil::model::testing::synth_fixture("tiny", anvil::model::synth_mix::f32);
  // Step 1 is held for three seconds while every request below arrives; step 3 fails, and every
  // later one (the device is gone).
  child srv({ANVIL_EXE, "serve", "-m", model, "--port", "0", "--line-port", "0", "--status-interval", "0.2",
             "--kv-cache-mib", "16", "--ctx", "256"},
            {"ANVIL_FAULT_INJECT=delay_step:1:3000,after_steps:3"});
  const ports p = wait_ready(srv);
  ASSERT_NE(p.http, 0) << srv.output();
  EXPECT_NE(status_line(http(p.http, "GET", "/health")).find("200"), std::string::npos);

  line_client lc(p.line);
  lc.send_line(R"({"id":1,"prompt":"Hello","max_tokens":200,"ignore_eos":true})");
  const json::object first = lc.read_json(std::chrono::seconds(90));  // step 0 ran: a token
  EXPECT_EQ(first.at("id"), 1);
  EXPECT_TRUE(first.contains("text")) << json::serialize(first);
  lc.send_line(R"({"id":2,"prompt":"Hello there","max_tokens":200,"ignore_eos":true,"stream":false})");
  const std::string completion = R"({"prompt":"Hello","max_tokens":200,"ignore_eos":true)";
  auto http_stream = std::async(std::launch::async, [&] {
    return http(p.http, "POST", "/v1/completions", completion + R"(,"stream":true})");
  });
  auto http_whole = std::async(std::launch::async, [&] { return http(p.http, "POST", "/v1/completions", completion + "}"); });

  std::string seen;
  const auto ended = until_ended(lc, {1, 2}, seen);
  for (std::int64_t id : {1, 2}) {
    ASSERT_TRUE(ended.count(id)) << "request " << id << " never ended:\n" << seen << srv.output();
    const json::object& o = ended.at(id);
    ASSERT_TRUE(o.contains("error")) << json::serialize(o);
    EXPECT_EQ(o.at("error").at("code"), "internal");
    EXPECT_NE(json::serialize(o).find("device"), std::string::npos) << json::serialize(o);
  }
  ASSERT_EQ(http_stream.wait_for(std::chrono::seconds(90)), std::future_status::ready);
  const std::string streamed = http_stream.get();
  // Refused at once (500), or failed mid-stream (200, then an error event and the connection closes).
  EXPECT_TRUE(status_line(streamed).find("500") != std::string::npos ||
              status_line(streamed).find("200") != std::string::npos) << streamed;
  EXPECT_EQ(error_in(streamed).at("code"), "internal") << streamed;
  EXPECT_EQ(streamed.find("[DONE]"), std::string::npos) << streamed;
  ASSERT_EQ(http_whole.wait_for(std::chrono::seconds(90)), std::future_status::ready);
  const std::string whole = http_whole.get();
  EXPECT_NE(status_line(whole).find("500"), std::string::npos) << whole;
  EXPECT_EQ(error_in(whole).at("code"), "internal") << whole;

  // Unhealthy now, and says so everywhere.
  const std::string health = http(p.http, "GET", "/health");
  EXPECT_NE(status_line(health).find("503"), std::string::npos) << health;
  EXPECT_NE(health.find("unhealthy"), std::string::npos) << health;
  const std::string metrics = http(p.http, "GET", "/metrics");
  EXPECT_TRUE(std::regex_search(metrics, std::regex("\nanvil_healthy 0\n"))) << metrics;
  EXPECT_FALSE(srv.wait_for(std::regex("UNHEALTHY")).empty()) << srv.output();

  // New work is refused with the same error, on both protocols, and the connections still work.
  lc.send_line(R"({"id":3,"prompt":"Hello","max_tokens":4})");
  const auto refused = until_ended(lc, {3}, seen);
  ASSERT_TRUE(refused.count(3)) << seen;
  EXPECT_EQ(refused.at(3).at("error").at("code"), "internal");
  const std::string later = http(p.http, "POST", "/v1/completions", completion + "}");
  EXPECT_NE(status_line(later).find("500"), std::string::npos) << later;

  srv.signal(SIGTERM);
  EXPECT_EQ(srv.wait_exit(std::chrono::seconds(60)), 0) << srv.output();
}

TEST(ServeFault, ABadFaultSpecIsRefusedAtStartWithTheReason) {
  const std::string model = anvil::model::testing::synth_fixture("tiny", anvil::model::synth_mix::f32);
  child srv({ANVIL_EXE, "serve", "-m", model, "--port", "0", "--line-port", "0", "--kv-cache-mib", "16", "--ctx", "256"},
            {"ANVIL_FAULT_INJECT=explode:1"});
  EXPECT_EQ(srv.wait_exit(std::chrono::seconds(60)), 1);
  srv.wait_for(std::regex("$^"), std::chrono::seconds(1));
  EXPECT_NE(srv.output().find("fault injection: unknown item 'explode:1'"), std::string::npos) << srv.output();
}

// The same seeded, sampled request over HTTP (streamed and not) and the line protocol (streamed
// and not): one text.
TEST(ServeDeterminism, ASeededSampledRequestGivesOneTextOverEveryProtocolAndMode) {
  const std::string model = anvil::model::testing::synth_fixture("tiny", anvil::model::synth_mix::f32);
  child srv({ANVIL_EXE, "serve", "-m", model, "--port", "0", "--line-port", "0", "--status-interval", "0",
             "--kv-cache-mib", "16", "--ctx", "256"});
  const ports p = wait_ready(srv);
  ASSERT_NE(p.http, 0) << srv.output();
  const std::string params =
      R"("prompt":"In the beginning","max_tokens":32,"ignore_eos":true,"temperature":1.0,"top_p":0.9,"top_k":50,"seed":7)";

  const std::string whole = http(p.http, "POST", "/v1/completions", "{" + params + "}");
  ASSERT_NE(status_line(whole).find("200"), std::string::npos) << whole;
  const json::object body = json::parse(whole.substr(whole.find("\r\n\r\n") + 4)).as_object();
  const std::string http_text(body.at("choices").at(0).at("text").as_string());

  std::string http_streamed;
  const std::string sse = http(p.http, "POST", "/v1/completions", "{" + params + R"(,"stream":true})");
  for (std::size_t at = 0; (at = sse.find("data: {", at)) != std::string::npos; ++at) {
    const json::value v = json::parse(sse.substr(at + 6, sse.find('\n', at) - at - 6));
    for (const json::value& ch : v.at("choices").as_array()) http_streamed += ch.at("text").as_string();
  }
  EXPECT_NE(sse.find("[DONE]"), std::string::npos) << sse;

  line_client lc(p.line);
  lc.send_line("{\"id\":1," + params + ",\"stream\":false}");
  lc.send_line("{\"id\":2," + params + "}");
  std::string line_streamed, line_whole, seen;
  for (int ended = 0; ended < 2;) {
    const auto line = lc.read_line(std::chrono::seconds(90));
    ASSERT_TRUE(line) << seen;
    seen += *line + "\n";
    const json::object o = json::parse(*line).as_object();
    ASSERT_FALSE(o.contains("error")) << *line;
    if (o.at("id") == 1) {
      if (o.contains("done")) line_whole = o.at("text").as_string();
    } else if (o.contains("text")) {
      line_streamed += o.at("text").as_string();
    }
    if (o.contains("done")) ++ended;
  }
  EXPECT_FALSE(http_text.empty());
  EXPECT_EQ(http_streamed, http_text);
  EXPECT_EQ(line_whole, http_text);
  EXPECT_EQ(line_streamed, http_text);
  srv.signal(SIGTERM);
  EXPECT_EQ(srv.wait_exit(std::chrono::seconds(60)), 0) << srv.output();
}

}  // namespace
