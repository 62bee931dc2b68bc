// The request codec: every field read with its type checked, clear messages naming the field,
// OpenAI's shapes for each dialect, and UTF-8 made safe for JSON.
#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "proto/errors.h"
#include "proto/request_json.h"

namespace {

using namespace anvil;
using namespace anvil::proto;
namespace json = boost::json;

std::string read(std::string_view body, parsed_request& out, dialect d = dialect::line) {
  return read_request(json::parse(body).as_object(), d, out);
}

std::string why(std::string_view body, dialect d = dialect::line) {
  parsed_request p;
  return read(body, p, d);
}

TEST(RequestJson, ReadsEveryLineProtocolField) {
  parsed_request p;
  ASSERT_EQ(read(R"({"id":1,"prompt":"Hi","max_tokens":7,"stream":false,"temperature":0.5,"top_k":40,"top_p":0.9,
                  "min_p":0.05,"repetition_penalty":1.1,"presence_penalty":0.5,"frequency_penalty":-0.5,"seed":42,
                  "logprobs":3,"logit_bias":{"17":-100,"3":2.5},"stop":["\n","END"],"ignore_eos":true,"priority":-2,
                  "unused":null})",
                 p),
            "");
  const generate_request& r = p.req;
  EXPECT_EQ(r.prompt, "Hi");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FALSE(p.stream);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.1f);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -0.5f);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_TRUE(p.want_logprobs);
  EXPECT_EQ(r.sampling.logprobs, 3);
  ASSERT_EQ(r.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.priority, -2);
}

TEST(RequestJson, LineDefaultsStreamAndSixteenTokens) {
  parsed_request p;
  ASSERT_EQ(read(R"({"id":"a","prompt":[1,2,3]})", p), "");
  EXPECT_TRUE(p.stream);
  EXPECT_EQ(p.req.max_tokens, 16);
  EXPECT_EQ(p.req.prompt_tokens, (std::vector<std::int32_t>{1, 2, 3}));
  EXPECT_FALSE(p.want_logprobs);
}

TEST(RequestJson, HugeMaxTokensMeanAsManyAsFit) {
  for (const char* v : {"2147483648", "1099511627777", "9223372036854775807", "18446744073709551615", "1e308", "4e18"}) {
    parsed_request p;
    ASSERT_EQ(read(std::string(R"({"id":"a","prompt":[1],"max_tokens":)") + v + "}", p), "") << v;
    EXPECT_GE(p.req.max_tokens, std::int64_t(1) << 31) << v;  // the engine cuts it to the context
  }
}

TEST(RequestJson, MessagesWithStringsOrTextParts) {
  parsed_request p;
  ASSERT_EQ(read(R"({"id":1,"messages":[{"role":"system","content":"Be brief."},
                  {"role":"user","content":[{"type":"text","text":"Hel"},{"type":"text","text":"lo"}]}]})",
                 p),
            "");
  ASSERT_EQ(p.req.messages.size(), 2u);
  EXPECT_EQ(p.req.messages[1].role, "user");
  EXPECT_EQ(p.req.messages[1].content, "Hello");
}

TEST(RequestJson, WrongTypesAreNamed) {
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","temperature":"hot"})"), "`temperature` must be a number");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","max_tokens":1.5})"), "`max_tokens` must be an integer");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","max_tokens":0})"), "`max_tokens` must be in [1, 1099511627776], got 0");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","stream":"yes"})"), "`stream` must be true or false");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","seed":-1})").substr(0, 18), "`seed` must be in ");
  // Integral values past 64 bits are out of range, not "not integers".
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","seed":1e300})"), "`seed` must be in [0, 9223372036854775807], got 1E300");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","seed":18446744073709551615})"),
            "`seed` must be in [0, 9223372036854775807], got 18446744073709551615");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","top_k":-1e300})"), "`top_k` must be in [-1, 2147483647], got -1E300");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","max_tokens":-1e300})"), "`max_tokens` must be in [1, 1099511627776], got -1E300");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","max_tokens":"5"})"), "`max_tokens` must be an integer");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","stop":[1]})"), "`stop` must be a string or an array of strings");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","logit_bias":{"abc":1}})"), "`logit_bias` keys must be token ids, got \"abc\"");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","logit_bias":{"-3":1}})"), "`logit_bias` keys must be token ids, got \"-3\"");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","logit_bias":{"3":"a"}})"), "`logit_bias` values must be numbers");
  EXPECT_EQ(why(R"({"id":1,"prompt":[1,-2]})").substr(0, 8), "`prompt`");
  EXPECT_EQ(why(R"({"id":1,"prompt":""})"), "`prompt` must not be empty");
  EXPECT_EQ(why(R"({"id":1,"prompt":{}})").substr(0, 8), "`prompt`");
  EXPECT_EQ(why(R"({"id":1,"messages":[{"content":"x"}]})"), "`messages` entries need a string `role`");
  EXPECT_EQ(why(R"({"id":1,"messages":[]})").substr(0, 10), "`messages`");
  EXPECT_EQ(why(R"({"id":1})"), "give exactly one of `prompt` or `messages`");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","messages":[{"role":"user","content":"y"}]})"),
            "give exactly one of `prompt` or `messages`");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})"),
            "`stop` holds at most 16 strings");
}

// A field the dialect does not read is refused by name, never silently ignored: a client sending
// `tools` or `response_format` must not believe they took effect.
TEST(RequestJson, UnknownFieldsAreRefusedByName) {
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","unknown_field":[1,2]})"), "`unknown_field` is not supported by this server");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","model":"m"})"), "`model` is not supported by this server");
  EXPECT_EQ(why(R"({"prompt":"x","suffix":"y"})", dialect::completions), "`suffix` is not supported by this server");
  EXPECT_EQ(why(R"({"prompt":"x","top_logprobs":2})", dialect::completions),
            "`top_logprobs` is not supported by this server");
  EXPECT_EQ(why(R"({"messages":[{"role":"user","content":"x"}],"echo":true})", dialect::chat),
            "`echo` is not supported by this server");
  EXPECT_EQ(why(R"({"messages":[{"role":"user","content":"x"}],"prompt":"y"})", dialect::chat),
            "`prompt` is not supported by this server");
  // Metadata every OpenAI client may send is accepted; a null field counts as absent.
  EXPECT_EQ(why(R"({"model":"m","user":"u","prompt":"x","suffix":null})", dialect::completions), "");
  parsed_request p;
  EXPECT_EQ(read(R"({"model":"m","prompt":"x","best_of":2})", p, dialect::completions),
            "`best_of` is not supported by this server");
}

TEST(RequestJson, StopTokenIdsMinTokensAndPromptLists) {
  parsed_request p;
  ASSERT_EQ(read(R"({"id":1,"prompt":"x","stop_token_ids":[7,9],"min_tokens":3})", p), "");
  EXPECT_EQ(p.req.stop_token_ids, (std::vector<std::int32_t>{7, 9}));
  EXPECT_EQ(p.req.min_tokens, 3);
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","stop_token_ids":[-1]})"), "`stop_token_ids` must hold token ids (integers >= 0)");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","min_tokens":-2})"), "`min_tokens` must be in [0, 1099511627776], got -2");

  parsed_request c;
  ASSERT_EQ(read(R"({"prompt":["a",[1,2],"b"],"n":2})", c, dialect::completions), "");
  ASSERT_EQ(c.prompts.size(), 3u);
  EXPECT_EQ(c.prompts[0].text, "a");
  EXPECT_EQ(c.prompts[1].tokens, (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(c.req.prompt, "a");
  EXPECT_EQ(why(R"({"id":1,"prompt":["a","b"]})"), "`prompt` holds one prompt per request here");
  EXPECT_EQ(why(R"({"prompt":["a",""]})", dialect::completions), "`prompt` must not be empty");
  EXPECT_EQ(why(R"({"prompt":["a",5]})", dialect::completions),
            "`prompt` a list of prompts holds strings or non-empty arrays of token ids");
  EXPECT_EQ(why(R"({"prompt":["a","b","c","d","e"],"n":16})", dialect::completions),
            "`prompt` holds 5 prompts: with `n` 16 that is more than 64 choices");
}

// Structured output fields on every dialect: one of response_format, regex and grammar.
TEST(RequestJson, StructuredOutputFields) {
  for (const dialect d : {dialect::line, dialect::completions}) {
    parsed_request p;
    ASSERT_EQ(read(d == dialect::line ? R"({"id":1,"prompt":"x","grammar":"root ::= \"a\""})"
                                      : R"({"prompt":"x","grammar":"root ::= \"a\""})",
                   p, d),
              "");
    EXPECT_EQ(p.req.constraint.what, structured_output::kind::grammar);
    EXPECT_EQ(p.req.constraint.spec, "root ::= \"a\"");
    EXPECT_EQ(p.req.constraint.field, "grammar");
  }
  parsed_request r;
  ASSERT_EQ(read(R"({"id":1,"prompt":"x","regex":"[ab]+","response_format":{"type":"text"}})", r), "");
  EXPECT_EQ(r.req.constraint.what, structured_output::kind::regex);
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","regex":"a","grammar":"root ::= \"a\""})"),
            "`grammar` cannot be given with another of `response_format`, `regex` and `grammar`");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","grammar":""})"), "`grammar` must be a non-empty string");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","regex":"a","response_format":{"type":"json_object"}})"),
            "`regex` cannot be given with another of `response_format`, `regex` and `grammar`");
}

// Tools and the chat template's keywords: read for messages only, checked for shape.
TEST(RequestJson, ToolsToolChoiceAndTemplateKeywords) {
  parsed_request p;
  ASSERT_EQ(read(R"({"messages":[{"role":"user","content":"x"},
                     {"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function",
                       "function":{"name":"f","arguments":"{\"a\": 1}"}}]},
                     {"role":"tool","tool_call_id":"c","name":"f","content":"ok"}],
                    "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
                    "chat_template_kwargs":{"enable_thinking":false},"parallel_tool_calls":false})",
                 p, dialect::chat),
            "");
  EXPECT_FALSE(p.req.tools_json.empty());  // the output is parsed for calls
  EXPECT_FALSE(p.req.parallel_tool_calls);
  EXPECT_NE(p.req.tools_json.find("\"name\":\"f\""), std::string::npos);
  EXPECT_EQ(p.req.chat_template_kwargs_json, R"({"enable_thinking":false})");
  ASSERT_EQ(p.req.messages.size(), 3u);
  EXPECT_TRUE(p.req.messages[1].content_is_null);
  EXPECT_EQ(p.req.messages[1].tool_calls_json,  // arguments: the object the JSON string held
            R"([{"id":"c","type":"function","function":{"name":"f","arguments":{"a":1}}}])");
  EXPECT_EQ(p.req.messages[2].tool_call_id, "c");
  EXPECT_EQ(p.req.messages[2].name, "f");

  parsed_request none;
  ASSERT_EQ(read(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],
                    "tool_choice":"none"})",
                 none, dialect::chat),
            "");
  EXPECT_TRUE(none.req.tools_json.empty());  // the model is not shown them
  const std::string m = R"("messages":[{"role":"user","content":"x"}])";
  parsed_request req;
  ASSERT_EQ(read("{" + m + R"(,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}}})",
                 req, dialect::chat),
            "");
  EXPECT_TRUE(req.req.tool_call_required);
  EXPECT_EQ(req.req.tool_call_name, "f");
  EXPECT_EQ(why("{" + m + R"(,"tool_choice":"required"})", dialect::chat), "`tool_choice` needs `tools`");
  EXPECT_EQ(why("{" + m + R"(,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function"}})", dialect::chat),
            "`tool_choice` must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
  EXPECT_EQ(why("{" + m + R"(,"tools":[{"type":"function","function":{}}]})", dialect::chat), "`tools` functions need a `name`");
  EXPECT_EQ(why("{" + m + R"(,"chat_template_kwargs":{"tools":[]}})", dialect::chat),
            "`chat_template_kwargs` may not set `tools`");
  EXPECT_EQ(why(R"({"prompt":"x","tools":[]})", dialect::completions), "`tools` is not supported by this server");
  EXPECT_EQ(why(R"({"id":1,"prompt":"x","tools":[]})"), "`tools` goes with `messages`");
  EXPECT_EQ(why(R"({"messages":[{"role":"user","content":"x","audio":{}}]})", dialect::chat),
            "`messages` entries with `audio` are not supported by this server");
  EXPECT_EQ(why(R"({"messages":[{"role":"assistant","content":null}]})", dialect::chat), "`messages` entries need a string `content`");
}

TEST(RequestJson, NullMeansAbsent) {
  parsed_request p;
  ASSERT_EQ(read(R"({"id":1,"prompt":"x","temperature":null,"stop":null})", p), "");
  EXPECT_EQ(p.req.sampling.temperature, 0.f);
}

TEST(RequestJson, OpenAiCompletionsShapes) {
  parsed_request p;
  ASSERT_EQ(read(R"({"model":"m","prompt":["Hello"],"n":3,"stream":true,"stream_options":{"include_usage":true},
                  "logprobs":2,"echo":true})",
                 p, dialect::completions),
            "");
  EXPECT_EQ(p.req.prompt, "Hello");
  EXPECT_EQ(p.n, 3);
  EXPECT_TRUE(p.stream && p.include_usage && p.echo && p.want_logprobs);
  EXPECT_EQ(p.req.sampling.logprobs, 2);
  EXPECT_GT(p.req.max_tokens, 1 << 20);  // no max_tokens: until the context is full
  EXPECT_EQ(why(R"({"prompt":"x","n":0})", dialect::completions), "`n` must be in [1, 16], got 0");
  EXPECT_EQ(why(R"({"prompt":"x","n":17})", dialect::completions), "`n` must be in [1, 16], got 17");
  EXPECT_EQ(why(R"({"messages":[{"role":"user","content":"x"}]})", dialect::completions), "`prompt` is required");
  EXPECT_EQ(why(R"({"prompt":"x","stream_options":3})", dialect::completions), "`stream_options` must be an object");
}

TEST(RequestJson, OpenAiChatShapes) {
  parsed_request p;
  ASSERT_EQ(read(R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":5,"logprobs":true,"top_logprobs":4})",
                 p, dialect::chat),
            "");
  EXPECT_EQ(p.req.max_tokens, 5);
  EXPECT_TRUE(p.want_logprobs);
  EXPECT_EQ(p.req.sampling.logprobs, 4);
  EXPECT_FALSE(p.stream);
  EXPECT_EQ(why(R"({"prompt":"x"})", dialect::chat), "`messages` is required");
  EXPECT_EQ(why(R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", dialect::chat),
            "`top_logprobs` needs `logprobs: true`");
}

TEST(RequestJson, ValidUtf8ReplacesBadSequences) {
  EXPECT_EQ(valid_utf8("plain"), "plain");
  EXPECT_EQ(valid_utf8("h\xC3\xA9"), "h\xC3\xA9");
  EXPECT_EQ(valid_utf8("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(valid_utf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(valid_utf8("\xC3"), "\xEF\xBF\xBD");                  // cut short
  EXPECT_EQ(valid_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong '/'
  EXPECT_EQ(valid_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
}

TEST(ProtoErrors, CodesAndStatuses) {
  EXPECT_EQ(code_name(make_error_code(errc::invalid_argument)), "invalid_request");
  EXPECT_EQ(code_name(make_error_code(errc::overloaded)), "overloaded");
  EXPECT_EQ(code_name(make_error_code(errc::device_fault)), "internal");
  EXPECT_EQ(http_status(make_error_code(errc::invalid_argument)), 400u);
  EXPECT_EQ(http_status(make_error_code(errc::context_overflow)), 400u);
  EXPECT_EQ(http_status(make_error_code(errc::overloaded)), 429u);
  EXPECT_EQ(http_status(make_error_code(errc::stopped)), 503u);
  EXPECT_EQ(http_status(make_error_code(errc::device_fault)), 500u);
  EXPECT_TRUE(constant_time_equal("secret", "secret"));
  EXPECT_FALSE(constant_time_equal("secreT", "secret"));
  EXPECT_FALSE(constant_time_equal("secret-longer", "secret"));
  EXPECT_FALSE(constant_time_equal("", "secret"));
  EXPECT_FALSE(constant_time_equal("", ""));
}

}  // namespace
