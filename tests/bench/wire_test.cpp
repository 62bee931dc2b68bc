// The JSON anvil-bench sends and how it reads answers, without sockets.
#include "bench/load/wire.h"

#include <boost/json.hpp>
#include <gtest/gtest.h>

namespace anvil::bench {
namespace {
namespace json = boost::json;

TEST(Wire, LineRequestAsksForExactlyMaxTokensStreamed) {
  bench_prompt p;
  p.token_ids = {5, 6, 7};
  const std::string line = line_request(42, p, 16);
  ASSERT_EQ(line.back(), '\n');
  const auto o = json::parse(line).as_object();
  EXPECT_EQ(o.at("id").as_int64(), 42);
  EXPECT_EQ(o.at("prompt").as_array().size(), 3u);
  EXPECT_EQ(o.at("max_tokens").as_int64(), 16);
  EXPECT_TRUE(o.at("ignore_eos").as_bool());
  EXPECT_TRUE(o.at("stream").as_bool());

  bench_prompt chat;
  chat.messages = {{"system", "be brief"}, {"user", "hi"}};
  const auto c = json::parse(line_request(1, chat, 2)).as_object();
  EXPECT_FALSE(c.contains("prompt"));
  EXPECT_EQ(c.at("messages").as_array().size(), 2u);
  EXPECT_EQ(json::parse(line_auth("k")).as_object().at("auth").as_string(), "k");
}

TEST(Wire, LineAnswersFromTheProtocolDocument) {
  auto a = parse_line_answer(R"({"id":1,"text":" world","tokens":[1917]})");
  EXPECT_EQ(a.type, line_answer::kind::chunk);
  EXPECT_EQ(a.id, 1);
  EXPECT_TRUE(a.has_content);
  EXPECT_EQ(a.n_tokens, 1);

  a = parse_line_answer(R"({"id":1,"done":true,"finish_reason":"length","usage":{"prompt_tokens":12,"completion_tokens":4},"timings":{"ttft_ms":9.1}})");
  EXPECT_EQ(a.type, line_answer::kind::done);
  EXPECT_EQ(a.prompt_tokens, 12);
  EXPECT_EQ(a.completion_tokens, 4);
  EXPECT_EQ(a.finish_reason, "length");

  a = parse_line_answer(R"({"id":3,"error":{"code":"invalid_request","message":"top_p must be in (0, 1], got 1.5"}})");
  EXPECT_EQ(a.type, line_answer::kind::error);
  EXPECT_EQ(a.id, 3);
  EXPECT_EQ(a.error, "invalid_request: top_p must be in (0, 1], got 1.5");

  a = parse_line_answer(R"({"id":null,"error":{"code":"invalid_json","message":"bad"}})");
  EXPECT_EQ(a.type, line_answer::kind::error);
  EXPECT_FALSE(a.id);

  EXPECT_EQ(parse_line_answer(R"({"auth":"ok"})").type, line_answer::kind::auth_ok);
  EXPECT_EQ(parse_line_answer("not json").type, line_answer::kind::unknown);
}

TEST(Wire, HttpBodiesStreamWithUsage) {
  bench_prompt p;
  p.text = "hello there";
  auto o = json::parse(http_request_body(p, 8, "m", false)).as_object();
  EXPECT_EQ(o.at("model").as_string(), "m");
  EXPECT_EQ(o.at("prompt").as_string(), "hello there");
  EXPECT_EQ(o.at("max_tokens").as_int64(), 8);
  EXPECT_TRUE(o.at("stream").as_bool());
  EXPECT_TRUE(o.at("stream_options").as_object().at("include_usage").as_bool());
  EXPECT_TRUE(o.at("ignore_eos").as_bool());

  o = json::parse(http_request_body(p, 8, "m", true)).as_object();
  ASSERT_EQ(o.at("messages").as_array().size(), 1u);
  EXPECT_EQ(o.at("messages").as_array()[0].as_object().at("role").as_string(), "user");
  EXPECT_EQ(o.at("max_completion_tokens").as_int64(), 8);
}

TEST(Wire, HttpEvents) {
  auto c = parse_http_event(R"({"choices":[{"index":0,"text":" a","finish_reason":null}]})", false);
  EXPECT_TRUE(c.has_content);
  c = parse_http_event(R"({"choices":[{"index":0,"text":""}]})", false);
  EXPECT_FALSE(c.has_content);
  c = parse_http_event(R"({"choices":[{"delta":{"content":"x"}}]})", true);
  EXPECT_TRUE(c.has_content);
  c = parse_http_event(R"({"choices":[{"delta":{"role":"assistant"}}]})", true);
  EXPECT_FALSE(c.has_content);
  c = parse_http_event(R"({"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}})", false);
  EXPECT_EQ(c.prompt_tokens, 7);
  EXPECT_EQ(c.completion_tokens, 3);
  EXPECT_TRUE(parse_http_event("[DONE]", false).done);
  EXPECT_EQ(parse_http_event(R"({"error":{"message":"oops","type":"InternalError"}})", false).error, "InternalError: oops");
  EXPECT_FALSE(parse_http_event("{broken", false).error.empty());
}

TEST(Wire, HttpErrorMessagesAndModels) {
  EXPECT_EQ(http_error_message(R"({"error":{"message":"max_tokens is too large","type":"BadRequestError","code":400}})"),
            "max_tokens is too large");
  EXPECT_EQ(http_error_message(R"({"object":"error","message":"model not found"})"), "model not found");
  EXPECT_EQ(http_error_message(R"({"detail":"Not Found"})"), "Not Found");
  EXPECT_EQ(http_error_message("plain text"), "plain text");
  EXPECT_EQ(first_model_id(R"({"object":"list","data":[{"id":"qwen","object":"model"},{"id":"b"}]})"), "qwen");
  EXPECT_FALSE(first_model_id(R"({"data":[]})"));
}

}  // namespace
}  // namespace anvil::bench
