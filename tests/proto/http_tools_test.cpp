// What agent frameworks send, end to end over loopback: tools rendered by the model's real chat
// template (Qwen2.5's, Qwen3's), tool calls in the output returned as OpenAI `tool_calls` (whole
// and streamed as deltas), reasoning returned as `reasoning_content`, tool-call history sent back,
// and every option anvil does not support refused by name. The models are scripted (a tiny model
// whose greedy output is a fixed token chain), so the output the server parses is known.
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/model/fixtures.h"
#include "tests/proto/http_loopback.h"

namespace {

using namespace anvil;
using namespace anvil::http_loopback;

std::string chat_data(const std::string& name) {
  std::ifstream in(std::filesystem::path(ANVIL_TEST_DATA_DIR) / "chat" / name, std::ios::binary);
  EXPECT_TRUE(in) << name;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

engine_config scripted(const std::string& name, const std::string& template_file, const std::vector<std::string>& pieces,
                       const std::set<std::string>& control = {}, unsigned char after = '\n') {
  engine_config c = tiny_config();
  c.model_path = model::testing::scripted_chat_fixture(name, chat_data(template_file), pieces, control, after);
  return c;
}

const std::vector<std::string> weather_call = {
    "I will check.\n", "<tool_call>", "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n", "</tool_call>"};

json::array weather_tools() {
  return json::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])")
      .as_array();
}

json::object ask(json::array tools) {
  json::object req{{"model", "m"},
                   {"messages", json::array{json::object{{"role", "user"}, {"content", "Weather in Paris?"}}}},
                   {"max_tokens", 16},
                   {"temperature", 0}};
  if (!tools.empty()) req["tools"] = std::move(tools);
  return req;
}

TEST(HttpTools, ToolCallsInTheOutputComeBackAsToolCalls) {
  server s(scripted("qwen25-call", "qwen2.5.jinja", weather_call));
  const reply r = s.post("/v1/chat/completions", ask(weather_tools()));
  ASSERT_EQ(r.status, 200u) << r.body;
  const json::object& choice = r.json().at("choices").at(0).as_object();
  EXPECT_EQ(choice.at("finish_reason").as_string(), "tool_calls");
  const json::object& msg = choice.at("message").as_object();
  EXPECT_EQ(msg.at("content").as_string(), "I will check.\n");
  ASSERT_EQ(msg.at("tool_calls").as_array().size(), 1u);
  const json::object& call = msg.at("tool_calls").at(0).as_object();
  EXPECT_EQ(call.at("type").as_string(), "function");
  EXPECT_EQ(call.at("id").as_string().subview().substr(0, 5), "call_");
  EXPECT_EQ(call.at("function").at("name").as_string(), "get_weather");
  EXPECT_EQ(json::parse(call.at("function").at("arguments").as_string()), json::parse(R"({"city": "Paris"})"));

  // The prompt carried the tool definitions, rendered by the real template.
  const reply t = s.post("/tokenize", json::object{{"messages", ask({}).at("messages")}, {"tools", weather_tools()}});
  ASSERT_EQ(t.status, 200u) << t.body;
  EXPECT_EQ(r.json().at("usage").at("prompt_tokens").as_int64(), t.json().at("count").as_int64());
  const reply plain = s.post("/tokenize", json::object{{"messages", ask({}).at("messages")}});
  EXPECT_GT(t.json().at("count").as_int64(), plain.json().at("count").as_int64() + 50);
}

TEST(HttpTools, StreamedToolCallsAreDeltasAndTheMarkersNeverShow) {
  server s(scripted("qwen25-call", "qwen2.5.jinja", weather_call));
  json::object req = ask(weather_tools());
  req["stream"] = true;
  const reply r = s.post("/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200u) << r.body;
  const auto events = sse_data(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const chat_stream st = streamed_chat(events);
  const std::string& content = st.content;
  const std::string& finish = st.finish;
  const std::vector<json::object>& calls = st.tool_calls;
  EXPECT_EQ(content, "I will check.\n");
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].at("index").as_int64(), 0);
  EXPECT_EQ(calls[0].at("function").at("name").as_string(), "get_weather");
  EXPECT_EQ(json::parse(calls[0].at("function").at("arguments").as_string()), json::parse(R"({"city": "Paris"})"));
}

TEST(HttpTools, WithoutToolsOrWithToolChoiceNoneTheOutputIsContent) {
  server s(scripted("qwen25-call", "qwen2.5.jinja", weather_call));
  for (const bool none : {false, true}) {
    json::object req = ask(none ? weather_tools() : json::array{});
    if (none) req["tool_choice"] = "none";
    const reply r = s.post("/v1/chat/completions", req);
    ASSERT_EQ(r.status, 200u) << r.body;
    const json::object& choice = r.json().at("choices").at(0).as_object();
    EXPECT_EQ(choice.at("finish_reason").as_string(), "stop");
    EXPECT_FALSE(choice.at("message").as_object().contains("tool_calls"));
    EXPECT_EQ(choice.at("message").at("content").as_string(),
              "I will check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  }
}

TEST(HttpTools, ToolCallHistoryGoesBackThroughTheTemplate) {
  server s(scripted("qwen25-call", "qwen2.5.jinja", weather_call));
  const json::array messages = json::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": null, "refusal": null,
     "tool_calls": [{"id": "call-1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call-1", "content": "{\"temp\": 21}"}])").as_array();
  json::object req{{"messages", messages}, {"tools", weather_tools()}, {"max_tokens", 4}};
  const reply r = s.post("/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200u) << r.body;
  // The rendering holds the call (arguments as the object the string held) and the tool's answer.
  const reply t = s.post("/tokenize", json::object{{"messages", messages}, {"tools", weather_tools()}});
  ASSERT_EQ(t.status, 200u) << t.body;
  std::vector<std::int32_t> ids;
  for (const json::value& v : t.json().at("tokens").as_array()) ids.push_back(std::int32_t(v.as_int64()));
  const std::string prompt = s.eng->tokenizer().decode(ids);
  EXPECT_NE(prompt.find(R"({"name": "get_weather", "arguments": {"city": "Paris"}})"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<tool_response>\n{\"temp\": 21}\n</tool_response>"), std::string::npos) << prompt;
}

TEST(HttpTools, ReasoningComesBackApartFromTheContent) {
  server s(scripted("qwen3-think", "qwen3.jinja", {"<think>", "\nThe user greets me.\n", "</think>", "\n\nHello!"}));
  json::object req = ask({});
  const reply r = s.post("/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200u) << r.body;
  const json::object& msg = r.json().at("choices").at(0).at("message").as_object();
  EXPECT_EQ(msg.at("reasoning_content").as_string(), "\nThe user greets me.\n");
  EXPECT_EQ(msg.at("content").as_string(), "Hello!");

  req["stream"] = true;
  const reply st = s.post("/v1/chat/completions", req);
  ASSERT_EQ(st.status, 200u) << st.body;
  const chat_stream streamed = streamed_chat(sse_data(st.body));
  const std::string &reasoning = streamed.reasoning, &content = streamed.content;
  EXPECT_EQ(reasoning, "\nThe user greets me.\n");
  EXPECT_EQ(content, "Hello!");

  // enable_thinking reaches the template: Qwen3 then writes an empty think block into the prompt.
  json::object off = ask({});
  off["chat_template_kwargs"] = json::object{{"enable_thinking", false}};
  const reply t_on = s.post("/tokenize", json::object{{"messages", off.at("messages")}});
  const reply t_off = s.post("/tokenize", json::object{{"messages", off.at("messages")}, {"chat_template_kwargs", off.at("chat_template_kwargs")}});
  ASSERT_EQ(t_off.status, 200u) << t_off.body;
  EXPECT_GT(t_off.json().at("count").as_int64(), t_on.json().at("count").as_int64());
}

TEST(HttpTools, WhatAnvilCannotDoIsRefusedByName) {
  server s(scripted("qwen25-call", "qwen2.5.jinja", weather_call));
  const auto refused = [&](json::object req, std::string_view param) {
    const reply r = s.post("/v1/chat/completions", req);
    EXPECT_EQ(r.status, 400u) << r.body;
    if (r.status == 400u) {
      EXPECT_EQ(r.json().at("error").at("param").as_string(), param) << r.body;
    }
  };
  json::object required = ask({});
  required["tool_choice"] = "required";  // without tools
  refused(required, "tool_choice");
  json::object schema = ask({});
  schema["response_format"] = json::object{{"type", "xml"}};
  refused(schema, "response_format");
  json::object bad_tools = ask({});
  bad_tools["tools"] = json::array{json::object{{"type", "retrieval"}}};
  refused(bad_tools, "tools");
  json::object bad_kwargs = ask({});
  bad_kwargs["chat_template_kwargs"] = json::object{{"messages", 1}};
  EXPECT_EQ(s.post("/v1/chat/completions", bad_kwargs).status, 400u);
  // Still serving.
  EXPECT_EQ(s.post("/v1/chat/completions", ask(weather_tools())).status, 200u);
}

// A template without a tool-call syntax anvil parses: tools are refused rather than rendered into
// a prompt whose calls would come back as plain text.
TEST(HttpTools, ToolsOnATemplateWithoutAToolSyntaxAreRefused) {
  server s;  // the ChatML fixture
  const reply r = s.post("/v1/chat/completions", ask(weather_tools()));
  EXPECT_EQ(r.status, 400u) << r.body;
  EXPECT_NE(r.body.find("tool-call syntax"), std::string::npos) << r.body;
}

// Structured output through the API: response_format json_schema / json_object and `regex` give
// outputs that parse and validate whatever the (random) model prefers; bad ones are named.
TEST(HttpTools, ResponseFormatAndRegexConstrainTheOutput) {
  server s;  // the ChatML fixture: random weights
  const json::value schema = json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}}, "required": ["name", "age"]})");
  for (int seed = 0; seed < 4; ++seed) {
    json::object req = ask({});
    req["max_tokens"] = 600;
    req["temperature"] = 1.0;
    req["seed"] = seed;
    req["response_format"] = json::object{{"type", "json_schema"}, {"json_schema", json::object{{"name", "person"}, {"schema", schema}, {"strict", true}}}};
    const reply r = s.post("/v1/chat/completions", req);
    ASSERT_EQ(r.status, 200u) << r.body;
    const std::string content(r.json().at("choices").at(0).at("message").at("content").as_string());
    json::error_code ec;
    const json::value v = json::parse(content, ec);
    ASSERT_FALSE(ec) << content;
    EXPECT_TRUE(v.at("name").is_string() && v.at("age").is_int64()) << content;
    EXPECT_EQ(r.json().at("choices").at(0).at("finish_reason").as_string(), "stop");

    req["response_format"] = json::object{{"type", "json_object"}};
    const reply o = s.post("/v1/chat/completions", req);
    ASSERT_EQ(o.status, 200u) << o.body;
    if (o.json().at("choices").at(0).at("finish_reason").as_string() == "stop") {
      EXPECT_TRUE(json::parse(o.json().at("choices").at(0).at("message").at("content").as_string()).is_object());
    }
  }
  json::object re{{"prompt", "x"}, {"max_tokens", 50}, {"temperature", 1.0}, {"regex", "(red|green|blue)-[0-9]{2}"}};
  const reply r = s.post("/v1/completions", re);
  ASSERT_EQ(r.status, 200u) << r.body;
  const std::string text(r.json().at("choices").at(0).at("text").as_string());
  EXPECT_TRUE(text.size() == 6 || text.size() == 7 || text.size() == 8) << text;
  EXPECT_NE(std::string("rgb").find(text[0]), std::string::npos) << text;

  // A GBNF grammar, as llama.cpp's `grammar` field takes it; with a regex too it is refused.
  json::object gr{{"prompt", "x"}, {"max_tokens", 50}, {"temperature", 1.0},
                  {"grammar", "root ::= color \"-\" [0-9]{2}\ncolor ::= \"red\" | \"green\" | \"blue\""}};
  const reply g = s.post("/v1/completions", gr);
  ASSERT_EQ(g.status, 200u) << g.body;
  const std::string gtext(g.json().at("choices").at(0).at("text").as_string());
  EXPECT_TRUE(gtext.size() >= 6 && gtext.size() <= 8 && gtext[gtext.size() - 3] == '-') << gtext;
  gr["regex"] = "a";
  const reply both = s.post("/v1/completions", gr);
  EXPECT_EQ(both.status, 400u) << both.body;
  EXPECT_EQ(both.json().at("error").at("param").as_string(), "grammar") << both.body;
  const reply bad_g = s.post("/v1/completions", json::object{{"prompt", "x"}, {"grammar", "root ::= nowhere"}});
  EXPECT_EQ(bad_g.status, 400u) << bad_g.body;
  EXPECT_EQ(bad_g.json().at("error").at("param").as_string(), "grammar") << bad_g.body;

  json::object bad = ask({});
  bad["response_format"] = json::object{{"type", "json_schema"}, {"json_schema", json::object{{"name", "x"}, {"schema", json::parse(R"({"not": {}})")}}}};
  const reply b = s.post("/v1/chat/completions", bad);
  EXPECT_EQ(b.status, 400u) << b.body;
  EXPECT_EQ(b.json().at("error").at("param").as_string(), "response_format") << b.body;
  EXPECT_EQ(s.post("/v1/completions", json::object{{"prompt", "x"}, {"regex", "(a"}}).status, 400u);
  EXPECT_EQ(s.settled().kv.counts.in_use, 0);
}

// tool_choice "required" and a named function constrain the output to the template's tool-call
// syntax, with arguments valid against the tool's parameters, whatever the model prefers (the
// scripted model would write prose first).
TEST(HttpTools, RequiredAndNamedToolChoiceForceValidCalls) {
  server s(scripted("qwen25-call", "qwen2.5.jinja", weather_call));
  const json::array tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"enum": ["Paris", "Rome"]}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}])").as_array();
  for (int seed = 0; seed < 3; ++seed) {
    json::object req = ask(tools);
    req["tool_choice"] = "required";
    req["parallel_tool_calls"] = false;
    req["temperature"] = 1.0;
    req["seed"] = seed;
    req["max_tokens"] = 200;
    const reply r = s.post("/v1/chat/completions", req);
    ASSERT_EQ(r.status, 200u) << r.body;
    const json::object& choice = r.json().at("choices").at(0).as_object();
    EXPECT_EQ(choice.at("finish_reason").as_string(), "tool_calls") << r.body;
    ASSERT_TRUE(choice.at("message").as_object().contains("tool_calls")) << r.body;
    ASSERT_EQ(choice.at("message").at("tool_calls").as_array().size(), 1u) << r.body;
    const json::object& fn = choice.at("message").at("tool_calls").at(0).at("function").as_object();
    const json::value args = json::parse(fn.at("arguments").as_string());
    if (fn.at("name").as_string() == "get_weather") {
      EXPECT_TRUE(args.at("city") == "Paris" || args.at("city") == "Rome") << args;
    } else {
      EXPECT_EQ(fn.at("name").as_string(), "get_time");
      EXPECT_EQ(args, json::object{});
    }
  }
  json::object named = ask(tools);
  named["tool_choice"] = json::object{{"type", "function"}, {"function", json::object{{"name", "get_time"}}}};
  named["max_tokens"] = 200;
  named["parallel_tool_calls"] = false;
  const reply r = s.post("/v1/chat/completions", named);
  ASSERT_EQ(r.status, 200u) << r.body;
  ASSERT_TRUE(r.json().at("choices").at(0).at("message").as_object().contains("tool_calls")) << r.body;
  const json::array& calls = r.json().at("choices").at(0).at("message").at("tool_calls").as_array();
  ASSERT_FALSE(calls.empty()) << r.body;
  for (const json::value& c : calls) EXPECT_EQ(c.at("function").at("name").as_string(), "get_time");

  json::object unknown = ask(tools);
  unknown["tool_choice"] = json::object{{"type", "function"}, {"function", json::object{{"name", "nope"}}}};
  const reply u = s.post("/v1/chat/completions", unknown);
  EXPECT_EQ(u.status, 400u) << u.body;
  EXPECT_EQ(u.json().at("error").at("param").as_string(), "tool_choice") << u.body;
  json::object both = ask(tools);
  both["tool_choice"] = "required";
  both["response_format"] = json::object{{"type", "json_object"}};
  EXPECT_EQ(s.post("/v1/chat/completions", both).status, 400u);
}

// Mistral's tool calls: [TOOL_CALLS] and [ARGS] are control tokens, which a plain output skips;
// with tools they are read. Both forms (Nemo's JSON list, Small 3.2's name[ARGS]{...}) come back
// as tool_calls whose ids the template accepts when the conversation is sent back.
TEST(HttpTools, MistralToolCallsComeBackAndTheirIdsGoBack) {
  const std::set<std::string> control = {"[TOOL_CALLS]", "[ARGS]"};
  struct form {
    const char* name;
    const char* template_file;
    std::vector<std::string> pieces;
  };
  const form forms[] = {
      {"mistral-args", "mistral-small-3.2.jinja", {"Checking.", "[TOOL_CALLS]", "get_weather", "[ARGS]", "{\"city\": \"Paris\"}"}},
      {"mistral-json", "mistral-nemo.jinja", {"[TOOL_CALLS]", "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]"}},
  };
  for (const form& f : forms) {
    engine_config c = scripted(f.name, f.template_file, f.pieces, control, ']');  // the prompt ends "[/INST]"
    c.max_model_len = 4096;  // Small 3.2's default system prompt is long
    server s(c);
    const reply r = s.post("/v1/chat/completions", ask(weather_tools()));
    ASSERT_EQ(r.status, 200u) << f.name << r.body;
    const json::object& choice = r.json().at("choices").at(0).as_object();
    EXPECT_EQ(choice.at("finish_reason").as_string(), "tool_calls") << f.name << r.body;
    ASSERT_TRUE(choice.at("message").as_object().contains("tool_calls")) << f.name << r.body;
    const json::object& call = choice.at("message").at("tool_calls").at(0).as_object();
    EXPECT_EQ(call.at("function").at("name").as_string(), "get_weather");
    EXPECT_EQ(json::parse(call.at("function").at("arguments").as_string()), json::parse(R"({"city": "Paris"})"));
    EXPECT_EQ(call.at("id").as_string().size(), 9u) << call;
    const json::value content = choice.at("message").at("content");
    EXPECT_EQ(content.is_null() ? std::string() : std::string(content.as_string()), f.pieces.size() == 5 ? "Checking." : "");

    // Streamed: the call is one delta, and the markers never show as content.
    json::object req = ask(weather_tools());
    req["stream"] = true;
    const chat_stream st = streamed_chat(sse_data(s.post("/v1/chat/completions", req).body));
    EXPECT_EQ(st.finish, "tool_calls");
    ASSERT_EQ(st.tool_calls.size(), 1u);
    EXPECT_EQ(st.content.find("[TOOL_CALLS]"), std::string::npos) << st.content;

    // The conversation goes back with the returned id: the template (which raises on any other
    // id form) renders it.
    json::array history = ask({}).at("messages").as_array();
    history.push_back(json::object{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array{call}}});
    history.push_back(json::object{{"role", "tool"}, {"tool_call_id", call.at("id")}, {"content", "{\"temp\": 21}"}});
    const reply back = s.post("/v1/chat/completions", json::object{{"messages", history}, {"tools", weather_tools()}, {"max_tokens", 4}});
    EXPECT_EQ(back.status, 200u) << f.name << back.body;

    // tool_choice "required": the output is forced into this form, its calls valid.
    json::object required = ask(weather_tools());
    required["tool_choice"] = "required";
    required["temperature"] = 1.0;
    required["seed"] = 7;
    required["max_tokens"] = 100;
    const reply q = s.post("/v1/chat/completions", required);
    ASSERT_EQ(q.status, 200u) << f.name << q.body;
    ASSERT_TRUE(q.json().at("choices").at(0).at("message").as_object().contains("tool_calls")) << f.name << q.body;
    const json::object& fn = q.json().at("choices").at(0).at("message").at("tool_calls").at(0).at("function").as_object();
    EXPECT_EQ(fn.at("name").as_string(), "get_weather");
    EXPECT_TRUE(json::parse(fn.at("arguments").as_string()).at("city").is_string()) << fn;
  }
}

// gpt-oss's harmony output: its markers are control tokens, shown to the parser only. The
// analysis channel comes back as reasoning_content, the final channel as content and a message to
// functions.NAME as a tool call (whole and streamed); a call sent back reaches the template with
// its reasoning, which gpt-oss's template reads as `thinking`. In a script a token appears once,
// so after the first message the markers come as text in tokens of their own.
TEST(HttpTools, HarmonyChannelsComeBackAsReasoningContentAndToolCalls) {
  const std::set<std::string> control = {"<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|constrain|>"};
  const auto gpt_oss = [&](const char* name, std::vector<std::string> pieces) {
    engine_config c = scripted(name, "gpt-oss.jinja", pieces, control, 't');  // the prompt ends "<|start|>assistant"
    c.max_model_len = 4096;  // the system and developer messages are long in bytes
    return c;
  };
  server s(gpt_oss("gpt-oss-call", {"<|channel|>", "analysis", "<|message|>", "Need the weather.", "<|end|>", "<|start|>",
                                    "assistant to=functions.get_weather", "<|channel|>commentary ", "<|constrain|>",
                                    "json<|message|>", "{\"city\": \"Paris\"}"}));
  const reply r = s.post("/v1/chat/completions", ask(weather_tools()));
  ASSERT_EQ(r.status, 200u) << r.body;
  const json::object& choice = r.json().at("choices").at(0).as_object();
  EXPECT_EQ(choice.at("finish_reason").as_string(), "tool_calls") << r.body;
  const json::object& msg = choice.at("message").as_object();
  EXPECT_EQ(msg.at("reasoning_content"), "Need the weather.") << r.body;
  EXPECT_TRUE(msg.at("content").is_null()) << r.body;
  ASSERT_TRUE(msg.contains("tool_calls")) << r.body;
  ASSERT_EQ(msg.at("tool_calls").as_array().size(), 1u) << r.body;
  const json::object& call = msg.at("tool_calls").at(0).as_object();
  EXPECT_EQ(call.at("function").at("name").as_string(), "get_weather");
  EXPECT_EQ(json::parse(call.at("function").at("arguments").as_string()), json::parse(R"({"city": "Paris"})"));

  json::object req = ask(weather_tools());
  req["stream"] = true;
  const chat_stream st = streamed_chat(sse_data(s.post("/v1/chat/completions", req).body));
  EXPECT_EQ(st.reasoning, "Need the weather.");
  EXPECT_EQ(st.content, "");
  EXPECT_EQ(st.finish, "tool_calls");
  ASSERT_EQ(st.tool_calls.size(), 1u);
  EXPECT_EQ(st.tool_calls[0].at("function").at("name").as_string(), "get_weather");

  // The call goes back with its reasoning: the template writes it as the analysis message before it.
  json::array history = ask({}).at("messages").as_array();
  history.push_back(json::object{{"role", "assistant"}, {"content", ""}, {"reasoning_content", "Need the weather."},
                                 {"tool_calls", json::array{call}}});
  history.push_back(json::object{{"role", "tool"}, {"tool_call_id", call.at("id")}, {"content", "{\"temp\": 21}"}});
  const reply t = s.post("/tokenize", json::object{{"messages", history}, {"tools", weather_tools()}});
  ASSERT_EQ(t.status, 200u) << t.body;
  std::vector<std::int32_t> ids;
  for (const json::value& v : t.json().at("tokens").as_array()) ids.push_back(std::int32_t(v.as_int64()));
  const std::string prompt = s.eng->tokenizer().decode(ids);
  EXPECT_NE(prompt.find("<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>"
                        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"),
            std::string::npos)
      << prompt;

  // An answer: reasoning apart from the content, whole and streamed.
  server a(gpt_oss("gpt-oss-answer", {"<|channel|>", "analysis", "<|message|>", "The user greets me.", "<|end|>", "<|start|>",
                                      "assistant<|channel|>final<|message|>", "Hello!"}));
  const reply ar = a.post("/v1/chat/completions", ask(weather_tools()));
  ASSERT_EQ(ar.status, 200u) << ar.body;
  const json::object& answer = ar.json().at("choices").at(0).as_object();
  EXPECT_EQ(answer.at("finish_reason").as_string(), "stop");
  EXPECT_EQ(answer.at("message").at("reasoning_content"), "The user greets me.") << ar.body;
  EXPECT_EQ(answer.at("message").at("content"), "Hello!") << ar.body;
  const chat_stream ast = streamed_chat(sse_data(a.post("/v1/chat/completions", req).body));
  EXPECT_EQ(ast.reasoning, "The user greets me.");
  EXPECT_EQ(ast.content, "Hello!");
  EXPECT_EQ(ast.finish, "stop");
}

}  // namespace
