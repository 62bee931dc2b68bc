// Values at the edges, over both protocols: max_tokens and n at 0, -1, 2^31, 2^63-1, 1e308 and as
// strings; prompts far past the context (text, token ids, chat) answered context_overflow with
// the documented message; invalid UTF-8 in prompt, stop and messages; logit_bias with ids outside
// the vocabulary, negative, non-integer or huge ids and values out of range. Each answer is the
// documented one, and the engine is idle and whole afterwards.
#include <string>
#include <string_view>
#include <vector>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/proto/abuse_harness.h"

namespace {

using namespace anvil;
using namespace anvil::testing;
namespace json = boost::json;

// One request body (without "id") and what it must get: 200 / a final "length" line, or 400 /
// an error line with `code`.
struct limit_case {
  std::string fields;  // JSON members, e.g. R"("prompt":[1],"max_tokens":0)"
  std::string code;    // "" when it must succeed
};

// The line protocol's answer to `fields`: the error code, or "" for a request that ran to its
// final line (which must say "length").
std::string line_outcome(line_client& c, const std::string& id, const std::string& fields) {
  c.send("{\"id\":\"" + id + "\"," + fields + ",\"stream\":false}\n");
  const json::object o = c.read_json(120s);
  EXPECT_EQ(o.at("id"), json::value(id)) << json::serialize(o);
  if (const json::value* e = o.if_contains("error")) return std::string(e->at("code").as_string());
  EXPECT_EQ(o.at("finish_reason"), "length") << json::serialize(o);
  return "";
}

std::string http_outcome(std::uint16_t port, const std::string& target, const std::string& fields, unsigned* status = nullptr) {
  const auto r = http_exchange(port, http_request_bytes("POST", target, "{" + fields + "}"), 120s);
  if (!r) return "no answer";
  if (status) *status = r->status;
  if (r->status == 200) return "";
  EXPECT_EQ(r->status, 400u) << r->body;
  return r->error_code();
}

TEST(Limits, MaxTokensAndNAtTheExtremes) {
  // A short context: five of these answers run until it is full, over both protocols.
  engine_config cfg = abuse_engine_config();
  cfg.max_model_len = 128;
  both_servers s(cfg);
  line_client c(s.line_port());
  const std::string p = R"("prompt":[1,2,3],"ignore_eos":true)";
  const std::vector<limit_case> max_tokens = {
      {p + R"(,"max_tokens":0)", "invalid_request"},
      {p + R"(,"max_tokens":-1)", "invalid_request"},
      {p + R"(,"max_tokens":-9223372036854775808)", "invalid_request"},
      {p + R"(,"max_tokens":-1e308)", "invalid_request"},
      {p + R"(,"max_tokens":2147483648)", ""},            // cut to what the context leaves
      {p + R"(,"max_tokens":9223372036854775807)", ""},
      {p + R"(,"max_tokens":18446744073709551615)", ""},
      {p + R"(,"max_tokens":1e308)", ""},
      {p + R"(,"max_tokens":1.5)", "invalid_request"},
      {p + R"(,"max_tokens":"16")", "invalid_request"},
      {p + R"(,"max_tokens":true)", "invalid_request"},
      {p + R"(,"max_tokens":null)", ""},                   // absent: the default
  };
  int i = 0;
  for (const limit_case& k : max_tokens) {
    EXPECT_EQ(line_outcome(c, "m" + std::to_string(i++), k.fields), k.code) << "line: " << k.fields;
    EXPECT_EQ(http_outcome(s.http_port(), "/v1/completions", k.fields), k.code) << "http: " << k.fields;
  }
  // The longest answers fill the context exactly.
  c.send_line(R"({"id":"full","prompt":[1,2,3],"ignore_eos":true,"stream":false,"max_tokens":9223372036854775807})");
  EXPECT_EQ(c.read_json(120s).at("usage").at("completion_tokens"), s.eng->max_model_len() - 3);

  const std::vector<limit_case> n = {
      {p + R"(,"max_tokens":1,"n":0)", "invalid_request"},
      {p + R"(,"max_tokens":1,"n":-1)", "invalid_request"},
      {p + R"(,"max_tokens":1,"n":17)", "invalid_request"},
      {p + R"(,"max_tokens":1,"n":2147483648)", "invalid_request"},
      {p + R"(,"max_tokens":1,"n":9223372036854775807)", "invalid_request"},
      {p + R"(,"max_tokens":1,"n":18446744073709551615)", "invalid_request"},
      {p + R"(,"max_tokens":1,"n":1e308)", "invalid_request"},
      {p + R"(,"max_tokens":1,"n":"2")", "invalid_request"},
      {p + R"(,"max_tokens":1,"n":2.5)", "invalid_request"},
      {p + R"(,"max_tokens":1,"n":16)", ""},
  };
  for (const limit_case& k : n) {
    EXPECT_EQ(http_outcome(s.http_port(), "/v1/completions", k.fields), k.code) << k.fields;
  }
  const engine_stats st = s.settled();
  EXPECT_EQ(st.kv.counts.in_use, 0);
  EXPECT_EQ(st.live_requests, 0);
}

TEST(Limits, HugePromptsAreContextOverflowWithTheDocumentedMessage) {
  both_servers s;
  const std::int64_t ctx = s.eng->max_model_len();
  line_client c(s.line_port());
  const auto expect_overflow_line = [&](const std::string& fields) {
    c.send("{\"id\":\"big\"," + fields + "}\n");
    const json::object o = c.read_json(120s);
    ASSERT_TRUE(o.contains("error")) << json::serialize(o).substr(0, 300);
    EXPECT_EQ(o.at("error").at("code"), "context_overflow");
    const std::string msg(o.at("error").at("message").as_string());
    EXPECT_NE(msg.find("the context holds " + std::to_string(ctx)), std::string::npos) << msg;
  };
  const auto expect_overflow_http = [&](const std::string& target, const std::string& body) {
    const auto r = http_exchange(s.http_port(), http_request_bytes("POST", target, body), 120s);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400u) << r->body.substr(0, 300);
    EXPECT_EQ(r->error_code(), "context_overflow") << r->body.substr(0, 300);
    EXPECT_NE(r->body.find("the context holds " + std::to_string(ctx)), std::string::npos) << r->body.substr(0, 300);
  };
  std::string ids = "[1";
  for (int i = 0; i < 200000; ++i) ids += ",7";
  ids += "]";
  const std::string text = "\"" + std::string(900 * 1024, 'a') + "\"";  // under the line limit (1 MiB)
  expect_overflow_line(R"("prompt":)" + text);
  expect_overflow_line(R"("prompt":)" + ids);
  expect_overflow_line(R"("messages":[{"role":"user","content":)" + text + "}]");
  expect_overflow_http("/v1/completions", R"({"prompt":)" + text + "}");
  expect_overflow_http("/v1/completions", R"({"prompt":)" + ids + "}");
  expect_overflow_http("/v1/chat/completions", R"({"messages":[{"role":"user","content":)" + text + "}]}");
  // One token short of the context still runs (one token of room), one more does not.
  std::string fits = "[1";
  for (std::int64_t i = 1; i < ctx - 1; ++i) fits += ",7";
  c.send_line(R"({"id":"fits","stream":false,"prompt":)" + fits + "]}");
  const json::object o = c.read_json(120s);
  EXPECT_EQ(o.at("usage").at("completion_tokens"), 1) << json::serialize(o).substr(0, 300);
  expect_overflow_line(R"("prompt":)" + fits + ",7]");
  // Over the body limit: 413 before anything is parsed.
  const auto r = http_exchange(s.http_port(), http_request_bytes("POST", "/v1/completions", std::string(9u << 20, ' ')), 120s);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413u);
  EXPECT_EQ(r->error_code(), "request_too_large");
  EXPECT_EQ(s.settled().live_requests, 0);
}

TEST(Limits, InvalidUtf8InPromptStopAndMessages) {
  both_servers s;
  line_client c(s.line_port());
  const std::vector<std::string> bad = {"\xff", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\\ud800", "\\udc00x"};
  const std::vector<std::pair<std::string, std::string>> where = {
      {"/v1/completions", R"("prompt":"a%b")"},
      {"/v1/completions", R"("prompt":"a","stop":["%"])"},
      {"/v1/chat/completions", R"("messages":[{"role":"user","content":"%"}])"},
      {"/v1/chat/completions", R"("messages":[{"role":"u%","content":"x"}])"},
      {"/tokenize", R"("prompt":"%")"},
  };
  for (const std::string& b : bad) {
    for (auto [target, fields] : where) {
      fields.replace(fields.find('%'), 1, b);
      EXPECT_EQ(http_outcome(s.http_port(), target, fields), "invalid_request") << target << " " << fields;
      if (target == "/tokenize") continue;
      c.send("{\"id\":1," + fields + "}\n");
      const json::object o = c.read_json(60s);
      EXPECT_EQ(o.at("error").at("code"), "invalid_json") << fields;
    }
  }
  // Valid but unusual text is fine: NUL, a BOM, a noncharacter, an astral character.
  for (const std::string_view odd : {"\\u0000", "\\ufeff", "\\uffff", "\\ud83d\\ude00"}) {
    const std::string fields = R"("prompt":"x)" + std::string(odd) + R"(y","max_tokens":2,"ignore_eos":true)";
    EXPECT_EQ(http_outcome(s.http_port(), "/v1/completions", fields), "") << fields;
    EXPECT_EQ(line_outcome(c, "odd", fields), "") << fields;
  }
  EXPECT_EQ(s.settled().live_requests, 0);
}

TEST(Limits, LogitBiasIdsAndValuesOutOfRange) {
  both_servers s;
  line_client c(s.line_port());
  const std::int64_t vocab = s.eng->tokenizer().n_vocab();
  const std::string p = R"("prompt":[1,2],"max_tokens":2,"ignore_eos":true,"logit_bias":)";
  const std::vector<limit_case> cases = {
      {p + "{\"" + std::to_string(vocab) + "\":1}", "invalid_request"},
      {p + "{\"" + std::to_string(vocab - 1) + "\":1}", ""},
      {p + R"({"-1":1})", "invalid_request"},
      {p + R"({"2147483648":1})", "invalid_request"},
      {p + R"({"99999999999999999999999":1})", "invalid_request"},
      {p + R"({"1.5":1})", "invalid_request"},
      {p + R"({"1e2":1})", "invalid_request"},
      {p + R"({"+1":1})", "invalid_request"},
      {p + R"({" 1":1})", "invalid_request"},
      {p + R"({"":1})", "invalid_request"},
      {p + R"({"abc":1})", "invalid_request"},
      {p + R"({"1":100.5})", "invalid_request"},
      {p + R"({"1":-101})", "invalid_request"},
      {p + R"({"1":1e308})", "invalid_request"},
      {p + R"({"1":-1e999})", "invalid_request"},
      {p + R"({"1":"5"})", "invalid_request"},
      {p + R"({"1":true})", "invalid_request"},
      {p + R"({"1":null})", "invalid_request"},
      {p + R"([[1,5]])", "invalid_request"},
      {p + R"({"1":100,"2":-100,"3":0.5,"0003":-0.25})", ""},  // bounds, fractions, leading zeros
      {p + R"({"1":5,"1":-5})", ""},                            // a repeated key: the last counts
      {p + "{}", ""},
  };
  int i = 0;
  for (const limit_case& k : cases) {
    EXPECT_EQ(line_outcome(c, "b" + std::to_string(i++), k.fields), k.code) << "line: " << k.fields;
    EXPECT_EQ(http_outcome(s.http_port(), "/v1/completions", k.fields), k.code) << "http: " << k.fields;
  }
  // Every token of the vocabulary biased at once is still an ordinary request.
  std::string all = "{";
  for (std::int64_t t = 0; t < vocab; ++t) all += (t ? ",\"" : "\"") + std::to_string(t) + "\":" + (t % 2 ? "-1" : "1");
  all += "}";
  EXPECT_EQ(line_outcome(c, "all", p + all), "");
  EXPECT_EQ(http_outcome(s.http_port(), "/v1/completions", p + all), "");
  // -100 on everything but one token makes it the greedy choice.
  std::string forced = "{";
  for (std::int64_t t = 0; t < vocab; ++t) forced += (t ? ",\"" : "\"") + std::to_string(t) + "\":" + (t == 42 ? "100" : "-100");
  forced += "}";
  c.send_line(R"({"id":"forced","stream":false,)" + p + forced + "}");
  const json::object o = c.read_json(60s);
  EXPECT_EQ(o.at("tokens"), (json::array{42, 42})) << json::serialize(o).substr(0, 300);
  const engine_stats st = s.settled();
  EXPECT_EQ(st.kv.counts.in_use, 0);
  EXPECT_EQ(st.live_requests, 0);
}

// Answers larger than max_queued_bytes (the bound on output a slow reader leaves behind) are still
// sent whole: the bound is on what piles up behind the answer being written, not on one answer.
// A 64 KiB bound here stands for the default 4 MiB, which a 2.4 MB prompt's /tokenize, 800k ids'
// /detokenize or n=16 × logprobs=20 × 600 tokens pass just the same.
TEST(Limits, AnswersLargerThanTheQueuedOutputBoundAreSentWhole) {
  constexpr std::size_t bound = 64 * 1024;
  proto::line_server_options lopt;
  lopt.max_queued_bytes = bound;
  proto::http_server_options hopt;
  hopt.max_queued_bytes = bound;
  both_servers s(abuse_engine_config(), lopt, hopt);

  const std::string text(300 * 1024, 'a');
  const auto tok = http_exchange(s.http_port(), http_request_bytes("POST", "/tokenize", R"({"prompt":")" + text + R"("})"), 120s);
  ASSERT_TRUE(tok) << "no answer to /tokenize";
  ASSERT_EQ(tok->status, 200u) << tok->body.substr(0, 300);
  EXPECT_GT(tok->body.size(), bound);
  const json::value tv = tok->json();
  EXPECT_EQ(tv.at("count").to_number<std::size_t>(), tv.at("tokens").as_array().size());

  std::string ids = "[1";
  for (int i = 0; i < 60000; ++i) ids += ",7";
  ids += "]";
  const auto detok = http_exchange(s.http_port(), http_request_bytes("POST", "/detokenize", R"({"tokens":)" + ids + "}"), 120s);
  ASSERT_TRUE(detok) << "no answer to /detokenize";
  EXPECT_EQ(detok->status, 200u) << detok->body.substr(0, 300);
  EXPECT_GT(detok->body.size(), bound);

  const std::string many = R"({"prompt":[1,2,3],"max_tokens":200,"ignore_eos":true,"n":8,"logprobs":5})";
  const auto comp = http_exchange(s.http_port(), http_request_bytes("POST", "/v1/completions", many), 300s);
  ASSERT_TRUE(comp) << "no answer to the completion";
  ASSERT_EQ(comp->status, 200u) << comp->body.substr(0, 300);
  EXPECT_GT(comp->body.size(), bound);
  EXPECT_EQ(comp->json().at("choices").as_array().size(), 8u);

  // The line protocol: one done line larger than the bound, on a connection that keeps working.
  line_client c(s.line_port());
  c.send_line(R"({"id":"big","prompt":[1,2,3],"max_tokens":400,"ignore_eos":true,"stream":false,"logprobs":5})");
  const auto line = c.read_line(300s);
  ASSERT_TRUE(line) << "no done line";
  EXPECT_GT(line->size(), bound);
  const json::object o = json::parse(*line).as_object();
  EXPECT_EQ(o.at("usage").at("completion_tokens"), 400);
  EXPECT_EQ(line_outcome(c, "after", R"("prompt":[1],"max_tokens":2,"ignore_eos":true)"), "");
  EXPECT_EQ(s.settled().live_requests, 0);
}

}  // namespace
