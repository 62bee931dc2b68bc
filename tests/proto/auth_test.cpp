// The API key, table-driven: every HTTP endpoint (and unknown paths, wrong methods, absolute-form
// targets) against every way of getting the Authorization header wrong — missing, wrong key,
// wrong scheme, no scheme, extra whitespace, a prefix of the key, a longer key, an empty Bearer,
// two headers — refused with 401 before anything else is revealed (no 404 or 405 first), while
// /health never needs the key; and the line protocol refusing every request before
// {"auth": KEY}, closing the connection on every kind of wrong key. Nothing refused reaches
// the engine.
#include <string>
#include <vector>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/proto/abuse_harness.h"

namespace {

using namespace anvil;
using namespace anvil::testing;
namespace json = boost::json;

constexpr const char* key = "s3same-Key_42";

both_servers keyed_servers() {
  proto::line_server_options lopt;
  lopt.api_key = key;
  proto::http_server_options hopt;
  hopt.api_key = key;
  return both_servers(abuse_engine_config(), lopt, hopt);
}

struct endpoint {
  std::string method, target, body;
  unsigned status_with_key;  // what an authorised caller gets
};

const std::vector<endpoint> endpoints = {
    {"POST", "/v1/completions", R"({"prompt":[1,2],"max_tokens":1})", 200},
    {"POST", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":1})", 200},
    {"GET", "/v1/models", "", 200},
    {"GET", "/metrics", "", 200},
    {"POST", "/tokenize", R"({"prompt":"Hello"})", 200},
    {"POST", "/detokenize", R"({"tokens":[1,2]})", 200},
    {"GET", "/v1/models?x=1", "", 200},
    {"GET", "http://localhost/v1/models", "", 200},  // absolute form
    {"GET", "/nowhere", "", 404},                     // unknown paths: 401 first, 404 only with the key
    {"POST", "/v1/embeddings", R"({"input":"x"})", 404},
    {"GET", "/v1/completions", "", 405},               // wrong methods: 401 first too
    {"DELETE", "/v1/models", "", 405},
    {"POST", "/v1/completions", "{not json", 400},     // and bad bodies
};

std::vector<std::vector<std::string>> wrong_headers() {
  const std::string k = key;
  return {
      {},
      {"Authorization: Bearer wrong"},
      {"Authorization: Bearer " + k.substr(0, k.size() - 1)},  // a prefix
      {"Authorization: Bearer " + k.substr(0, 1)},
      {"Authorization: Bearer " + k + "x"},                    // longer
      {"Authorization: Bearer " + k + " " + k},
      {"Authorization: Bearer  " + k},                         // two spaces
      {"Authorization: Bearer\t" + k},
      {"Authorization: Bearer"},                               // empty Bearer
      {"Authorization: Bearer "},
      {"Authorization: "},
      {"Authorization: " + k},                                 // no scheme
      {"Authorization: Basic " + k},                           // wrong schemes
      {"Authorization: Token " + k},
      {"Authorization: Bearerx " + k},
      {"Authorization: Bearer " + std::string("S3SAME-KEY_42")},  // the key is case-sensitive
      {"Authorization: Bearer wrong", "Authorization: Bearer " + k},  // two headers: neither counts
      {"Authorization: Bearer " + k, "Authorization: Bearer " + k},
      {"X-Api-Key: " + k},
      {"Authorization: Bearer " + k + "\x01"},
  };
}

std::vector<std::vector<std::string>> right_headers() {
  const std::string k = key;
  return {{"Authorization: Bearer " + k}, {"Authorization: bearer " + k}, {"authorization: BEARER " + k},
          {"Authorization: Bearer " + k + "  "}};  // trailing whitespace is not part of a header value
}

TEST(Auth, EveryHttpEndpointRefusesEveryWrongKeyBeforeRevealingAnything) {
  both_servers s = keyed_servers();
  const std::uint64_t rejected0 = s.eng->stats().requests.rejected;
  const std::string model = s.eng->model_name();
  std::uint64_t bad_bodies_with_key = 0;
  for (const endpoint& e : endpoints) {
    for (const auto& headers : wrong_headers()) {
      std::string shown;
      for (const auto& h : headers) shown += "[" + h + "] ";
      const auto r = http_exchange(s.http_port(), http_request_bytes(e.method, e.target, e.body, headers));
      ASSERT_TRUE(r) << e.method << " " << e.target << " " << shown;
      if (r->status == 400 && headers.size() == 1 && headers[0].back() == '\x01') continue;  // not even HTTP
      EXPECT_EQ(r->status, 401u) << e.method << " " << e.target << " " << shown << r->body;
      EXPECT_EQ(r->error_code(), "invalid_api_key") << r->body;
      EXPECT_EQ(r->json().at("error").at("type"), "authentication_error") << r->body;
      EXPECT_EQ(r->body.find(model), std::string::npos) << "a 401 names the model: " << r->body;
      EXPECT_EQ(r->body.find("nowhere"), std::string::npos) << r->body;
    }
    for (const auto& headers : right_headers()) {
      const auto r = http_exchange(s.http_port(), http_request_bytes(e.method, e.target, e.body, headers));
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, e.status_with_key) << e.method << " " << e.target << " [" << headers[0] << "] " << r->body;
      bad_bodies_with_key += e.status_with_key == 400;
    }
  }
  // /health never needs the key, whatever the header says.
  for (const auto& headers : wrong_headers()) {
    for (const char* method : {"GET", "HEAD"}) {
      const auto r = http_exchange(s.http_port(), http_request_bytes(method, "/health", "", headers));
      ASSERT_TRUE(r);
      if (headers.size() == 1 && headers[0].back() == '\x01') continue;
      EXPECT_EQ(r->status, 200u) << method;
    }
  }
  // The 401s never reached the engine; of the authorised requests, the bad bodies count as
  // rejected (400) and the rest ran and finished.
  const engine_stats st = s.settled();
  EXPECT_EQ(st.requests.rejected, rejected0 + bad_bodies_with_key);
  EXPECT_EQ(st.live_requests, 0);
  EXPECT_EQ(st.kv.counts.in_use, 0);
}

TEST(Auth, TheLineProtocolRefusesEveryRequestBeforeTheKeyAndHangsUpOnAWrongOne) {
  both_servers s = keyed_servers();
  const std::uint64_t submitted0 = s.eng->stats().requests.submitted;
  {
    line_client c(s.line_port());
    c.send_line(R"({"id":1,"prompt":[1],"max_tokens":1})");
    c.send_line(R"({"id":"m","messages":[{"role":"user","content":"x"}]})");
    c.send_line(R"({"id":2,"prompt":"x","temperature":"hot"})");  // bad, but the key comes first
    c.send_line(R"({"cancel":1})");
    for (const json::value& id : {json::value(1), json::value("m"), json::value(2), json::value(1)}) {
      const json::object o = c.read_json(30s);
      EXPECT_EQ(o.at("id"), id) << json::serialize(o);
      EXPECT_EQ(o.at("error").at("code"), "unauthorized") << json::serialize(o);
    }
    c.send_line("not json");  // says nothing about the server either way
    EXPECT_EQ(c.read_json(30s).at("error").at("code"), "invalid_json");
    c.send_line(R"({"auth":")" + std::string(key) + "\"}");
    EXPECT_EQ(c.read_json(30s).at("auth"), "ok");
    c.send_line(R"({"id":1,"prompt":[1],"max_tokens":1,"stream":false})");
    EXPECT_EQ(c.read_json(60s).at("finish_reason"), "length");
    // A wrong key later still hangs up.
    c.send_line(R"({"auth":"wrong"})");
    EXPECT_EQ(c.read_json(30s).at("error").at("code"), "unauthorized");
    EXPECT_TRUE(c.closed_by_server(30s));
  }
  const std::string k = key;
  const std::vector<std::string> wrong = {
      R"("wrong")", "\"" + k.substr(0, k.size() - 1) + "\"", "\" " + k + "\"", "\"" + k + " \"", "\"" + k + "\\n\"",
      "\"S3SAME-KEY_42\"", R"("")", "null", "42", "[\"" + k + "\"]", R"({"key":")" + k + "\"}", "\"Bearer " + k + "\"", "true"};
  for (const std::string& w : wrong) {
    line_client c(s.line_port());
    c.send_line(R"({"auth":)" + w + "}");
    const json::object o = c.read_json(30s);
    EXPECT_EQ(o.at("id"), nullptr) << w;
    EXPECT_EQ(o.at("error").at("code"), "unauthorized") << w << " " << json::serialize(o);
    // Whatever follows is never read: the connection is closed.
    c.try_send(R"({"id":1,"prompt":[1],"max_tokens":1})" "\n");
    EXPECT_EQ(c.read_to_close(30s), "") << w;
    EXPECT_TRUE(c.eof()) << w;
  }
  const engine_stats st = s.settled();
  EXPECT_EQ(st.requests.submitted, submitted0 + 1);  // only the one sent after the key
  EXPECT_EQ(st.live_requests, 0);
  EXPECT_TRUE(s.no_connections());
}

TEST(Auth, WithoutAKeyTheAuthLineIsAcceptedAndNothingIsRequired) {
  both_servers s;
  line_client c(s.line_port());
  c.send_line(R"({"auth":"anything"})");
  EXPECT_EQ(c.read_json(30s).at("auth"), "ok");
  c.send_line(R"({"id":1,"prompt":[1],"max_tokens":1,"stream":false})");
  EXPECT_EQ(c.read_json(60s).at("finish_reason"), "length");
  const auto r = http_exchange(s.http_port(), http_request_bytes("GET", "/v1/models", "", {"Authorization: Bearer whatever"}));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u);
}

}  // namespace
