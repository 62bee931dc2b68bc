// The small fields clients send, end to end over loopback: stop_token_ids, min_tokens, the
// prefix cache's share of the prompt in usage, CORS for browser clients, and a list of prompts in
// one completions request. The scripted model (a fixed greedy token chain) makes the outputs known.
#include <string>
#include <vector>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/model/fixtures.h"
#include "tests/proto/http_loopback.h"

namespace {

using namespace anvil;
using namespace anvil::http_loopback;

// ChatML fixture template; greedy output "A" "B" "C" then <|im_end|> (token 258).
engine_config abc() {
  engine_config c = tiny_config();
  const std::string chatml =
      "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  c.model_path = model::testing::scripted_chat_fixture("abc", chatml, {"A", "B", "C"});
  return c;
}
constexpr std::int64_t token_a = 300, token_b = 301;

json::object chat(json::object extra = {}) {
  json::object req{{"messages", json::array{json::object{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 8}};
  for (auto& kv : extra) req[kv.key()] = kv.value();
  return req;
}

std::string content_of(const reply& r) { return std::string(r.json().at("choices").at(0).at("message").at("content").as_string()); }

TEST(HttpFields, StopTokenIdsEndTheOutputWithoutTheirText) {
  server s(abc());
  const reply plain = s.post("/v1/chat/completions", chat());
  ASSERT_EQ(plain.status, 200u) << plain.body;
  EXPECT_EQ(content_of(plain), "ABC");
  const reply stopped = s.post("/v1/chat/completions", chat({{"stop_token_ids", json::array{token_b}}}));
  ASSERT_EQ(stopped.status, 200u) << stopped.body;
  EXPECT_EQ(content_of(stopped), "A");
  EXPECT_EQ(stopped.json().at("choices").at(0).at("finish_reason").as_string(), "stop");
  EXPECT_EQ(stopped.json().at("usage").at("completion_tokens").as_int64(), 2);
  // Also past ignore_eos, and refused outside the vocabulary.
  EXPECT_EQ(content_of(s.post("/v1/chat/completions", chat({{"stop_token_ids", json::array{token_b}}, {"ignore_eos", true}}))), "A");
  EXPECT_EQ(s.post("/v1/chat/completions", chat({{"stop_token_ids", json::array{1 << 20}}})).status, 400u);
  EXPECT_EQ(s.post("/v1/chat/completions", chat({{"stop_token_ids", "x"}})).status, 400u);
}

TEST(HttpFields, MinTokensHoldsOffTheEnd) {
  server s(abc());
  const reply r = s.post("/v1/chat/completions", chat({{"min_tokens", 6}, {"max_tokens", 6}}));
  ASSERT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(r.json().at("usage").at("completion_tokens").as_int64(), 6);  // <|im_end|> came 4th, suppressed
  EXPECT_EQ(r.json().at("choices").at(0).at("finish_reason").as_string(), "length");
  EXPECT_EQ(content_of(r).substr(0, 3), "ABC");
  // Stop tokens too: B is held off until 2 tokens are out, so the chain goes elsewhere.
  const reply b = s.post("/v1/chat/completions", chat({{"min_tokens", 2}, {"stop_token_ids", json::array{token_b}}}));
  ASSERT_EQ(b.status, 200u) << b.body;
  EXPECT_NE(content_of(b).substr(0, 2), "AB");
  // Streamed: same tokens.
  const reply once = s.post("/v1/chat/completions", chat({{"min_tokens", 0}}));
  EXPECT_EQ(content_of(once), "ABC");
  EXPECT_EQ(s.post("/v1/chat/completions", chat({{"min_tokens", 9}})).status, 400u);  // more than max_tokens
  EXPECT_EQ(s.post("/v1/chat/completions", chat({{"min_tokens", -1}})).status, 400u);
  (void)token_a;
}

TEST(HttpFields, UsageSaysHowMuchOfThePromptWasCached) {
  server s;
  const std::string prompt(600, 'x');  // several KV blocks
  json::object req{{"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}};
  const reply first = s.post("/v1/completions", req);
  ASSERT_EQ(first.status, 200u) << first.body;
  EXPECT_EQ(first.json().at("usage").at("prompt_tokens_details").at("cached_tokens").as_int64(), 0);
  const reply second = s.post("/v1/completions", req);
  ASSERT_EQ(second.status, 200u) << second.body;
  const std::int64_t cached = second.json().at("usage").at("prompt_tokens_details").at("cached_tokens").as_int64();
  EXPECT_GT(cached, 0);
  EXPECT_LT(cached, second.json().at("usage").at("prompt_tokens").as_int64());
}

TEST(HttpFields, AListOfPromptsGivesChoicesInPromptOrder) {
  server s;
  json::object one{{"prompt", "Once upon"}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}};
  json::object two = one;
  two["prompt"] = "The end";
  const reply a = s.post("/v1/completions", one), b = s.post("/v1/completions", two);
  json::object both = one;
  both["prompt"] = json::array{"Once upon", "The end"};
  both["n"] = 2;
  both["echo"] = true;
  const reply r = s.post("/v1/completions", both);
  ASSERT_EQ(r.status, 200u) << r.body;
  const json::array& choices = r.json().at("choices").as_array();
  ASSERT_EQ(choices.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(choices[i].at("index").as_int64(), std::int64_t(i));
  const std::string text_a(a.json().at("choices").at(0).at("text").as_string());
  const std::string text_b(b.json().at("choices").at(0).at("text").as_string());
  EXPECT_EQ(choices[0].at("text").as_string(), "Once upon" + text_a);  // greedy: both choices of a prompt agree
  EXPECT_EQ(choices[1].at("text").as_string(), "Once upon" + text_a);
  EXPECT_EQ(choices[2].at("text").as_string(), "The end" + text_b);
  EXPECT_EQ(r.json().at("usage").at("prompt_tokens").as_int64(),
            a.json().at("usage").at("prompt_tokens").as_int64() + b.json().at("usage").at("prompt_tokens").as_int64());
  // Token-id prompts too; a bad one names its place; chat takes one conversation only.
  json::object ids = one;
  ids["prompt"] = json::array{json::array{1, 2, 3}, json::array{4, 5}};
  EXPECT_EQ(s.post("/v1/completions", ids).json().at("choices").as_array().size(), 2u);
  json::object bad = one;
  bad["prompt"] = json::array{"fine", std::string(5000, 'a')};
  const reply refused = s.post("/v1/completions", bad);
  EXPECT_EQ(refused.status, 400u);
  EXPECT_NE(refused.body.find("prompt 1"), std::string::npos) << refused.body;
  EXPECT_EQ(s.settled().kv.counts.in_use, 0);
}

TEST(HttpFields, CorsNamesAllowedOriginsAndAnswersPreflights) {
  proto::http_server_options opt;
  opt.allowed_origins = {"https://app.example.com"};
  opt.api_key = "k";
  server s(tiny_config(), opt);
  const auto auth = std::vector<std::pair<std::string, std::string>>{{"Authorization", "Bearer k"}};
  auto with = [&](std::string origin) {
    auto h = auth;
    h.emplace_back("Origin", std::move(origin));
    return h;
  };
  const reply ok = s.get("/v1/models", with("https://app.example.com"));
  EXPECT_EQ(ok.status, 200u);
  EXPECT_EQ(ok.header("Access-Control-Allow-Origin"), "https://app.example.com");
  const reply other = s.get("/v1/models", with("https://evil.example"));
  EXPECT_EQ(other.status, 200u);
  EXPECT_EQ(other.headers.count("Access-Control-Allow-Origin"), 0u);
  // A preflight carries no key and is answered before the key is checked.
  const reply pre = s.call("OPTIONS", "/v1/chat/completions", {},
                           {{"Origin", "https://app.example.com"},
                            {"Access-Control-Request-Method", "POST"},
                            {"Access-Control-Request-Headers", "authorization, content-type"}});
  EXPECT_EQ(pre.status, 204u);
  EXPECT_EQ(pre.header("Access-Control-Allow-Origin"), "https://app.example.com");
  EXPECT_EQ(pre.header("Access-Control-Allow-Headers"), "authorization, content-type");
  EXPECT_NE(std::string(pre.header("Access-Control-Allow-Methods")).find("POST"), std::string::npos);
  const reply denied = s.call("OPTIONS", "/v1/chat/completions", {},
                              {{"Origin", "https://evil.example"}, {"Access-Control-Request-Method", "POST"}});
  EXPECT_EQ(denied.status, 403u);
  // Streams name the origin too.
  json::object req{{"prompt", "Hi"}, {"max_tokens", 2}, {"stream", true}};
  const reply st = s.post("/v1/completions", req, with("https://app.example.com"));
  EXPECT_EQ(st.status, 200u);
  EXPECT_EQ(st.header("Access-Control-Allow-Origin"), "https://app.example.com");
}

}  // namespace
