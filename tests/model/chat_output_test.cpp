// The chat output parser: reasoning, content and tool calls split as each family writes them,
// the same whether the text comes at once or one byte at a time (a stream).
#include "model/chat/chat_output.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace {

using namespace anvil::model;

struct split {
  std::string reasoning, content;
  std::vector<parsed_tool_call> calls;
};

split parse(chat_syntax syntax, bool tools, bool thinking, const std::string& text, std::size_t chunk) {
  chat_output_parser p(syntax, tools, thinking);
  split s;
  for (std::size_t i = 0; i < text.size(); i += chunk) {
    const auto piece = p.push(std::string_view(text).substr(i, chunk));
    s.reasoning += piece.reasoning;
    s.content += piece.content;
  }
  const auto rest = p.push({}, true);
  s.reasoning += rest.reasoning;
  s.content += rest.content;
  s.calls = p.tool_calls();
  return s;
}

// Every case is parsed whole and byte by byte; both must agree.
split both(chat_syntax syntax, bool tools, bool thinking, const std::string& text) {
  const split whole = parse(syntax, tools, thinking, text, text.size() + 1);
  const split bytes = parse(syntax, tools, thinking, text, 1);
  EXPECT_EQ(whole.reasoning, bytes.reasoning) << text;
  EXPECT_EQ(whole.content, bytes.content) << text;
  EXPECT_EQ(whole.calls.size(), bytes.calls.size()) << text;
  return whole;
}

const chat_syntax qwen3{.tools = tool_call_syntax::hermes, .think_tags = true};
const chat_syntax llama3{.tools = tool_call_syntax::llama3_json, .think_tags = false};
const chat_syntax nemo{.tools = tool_call_syntax::mistral_json, .think_tags = false};
const chat_syntax small32{.tools = tool_call_syntax::mistral_args, .think_tags = false};

TEST(ChatOutput, SyntaxComesFromTheTemplateSource) {
  EXPECT_EQ(detect_chat_syntax("{{ '<tool_call>' }}<think></think>").tools, tool_call_syntax::hermes);
  EXPECT_TRUE(detect_chat_syntax("<think>x</think>").think_tags);
  EXPECT_EQ(detect_chat_syntax("Given the following functions, please respond").tools, tool_call_syntax::llama3_json);
  EXPECT_EQ(detect_chat_syntax("{{ messages }}").tools, tool_call_syntax::none);
  EXPECT_EQ(detect_chat_syntax("{{- \"[TOOL_CALLS][\" }}").tools, tool_call_syntax::mistral_json);
  EXPECT_EQ(detect_chat_syntax("'[TOOL_CALLS]' + name + '[ARGS]'").tools, tool_call_syntax::mistral_args);
  EXPECT_TRUE(prompt_opens_thinking("<|Assistant|><think>\n"));
  EXPECT_FALSE(prompt_opens_thinking("<think>\n\n</think>\n\n"));
}

TEST(ChatOutput, ThinkingIsReasoningAndTheAnswerIsContent) {
  const split s = both(qwen3, false, false, "<think>\nAdd them.\n</think>\n\nIt is 4.");
  EXPECT_EQ(s.reasoning, "\nAdd them.\n");
  EXPECT_EQ(s.content, "It is 4.");
  // DeepSeek-R1's prompt opens the block: the output starts inside it.
  const split r = both(qwen3, false, true, "hmm</think>Answer");
  EXPECT_EQ(r.reasoning, "hmm");
  EXPECT_EQ(r.content, "Answer");
  // Cut off while thinking: all of it is reasoning.
  EXPECT_EQ(both(qwen3, false, false, "<think>never ends").reasoning, "never ends");
  // No block: plain content, leading space kept.
  EXPECT_EQ(both(qwen3, false, false, " plain <thin").content, " plain <thin");
}

TEST(ChatOutput, HermesToolCalls) {
  const split s = both(qwen3, true, false,
                       "<think>need weather</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                       "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"t\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(s.reasoning, "need weather");
  EXPECT_EQ(s.content, "Checking.\n");
  ASSERT_EQ(s.calls.size(), 2u);
  EXPECT_EQ(s.calls[0].name, "get_weather");
  EXPECT_EQ(s.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(s.calls[1].arguments, "{}");
  // Without parallel calls only the first is returned.
  chat_output_parser one(qwen3, true, false, false);
  one.push("<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>", true);
  ASSERT_EQ(one.tool_calls().size(), 1u);
  EXPECT_EQ(one.tool_calls()[0].name, "a");
  // A call cut off by the length limit still parses when its JSON is whole.
  EXPECT_EQ(both(qwen3, true, false, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}").calls.size(), 1u);
  // Not JSON: the text stays content, as written.
  const split bad = both(qwen3, true, false, "<tool_call>not json</tool_call>");
  EXPECT_TRUE(bad.calls.empty());
  EXPECT_EQ(bad.content, "<tool_call>not json</tool_call>");
  // Without tools offered the markers are plain text.
  EXPECT_EQ(both(qwen3, false, false, "<tool_call>{\"name\": \"f\"}</tool_call>").content, "<tool_call>{\"name\": \"f\"}</tool_call>");
}

TEST(ChatOutput, Llama3JsonAnswers) {
  const split s = both(llama3, true, false, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(s.content, "");
  EXPECT_EQ(both(llama3, true, false, "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {}}").calls.size(), 2u);
  const split text = both(llama3, true, false, "{not a call} and text");
  EXPECT_TRUE(text.calls.empty());
  EXPECT_EQ(text.content, "{not a call} and text");
  EXPECT_EQ(both(llama3, true, false, "Sure: {\"name\": \"x\"}").content, "Sure: {\"name\": \"x\"}");
}

using calls = std::vector<std::pair<std::string, std::string>>;
calls names_and_arguments(const split& s) {
  calls out;
  for (const parsed_tool_call& c : s.calls) out.emplace_back(c.name, c.arguments);
  return out;
}

TEST(ChatOutput, MistralToolCallsInBothForms) {
  // v0.3 / Nemo: one JSON list after the marker (a call's "id" is ignored).
  const split s = both(nemo, true, false,
                       "Checking. [TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, "
                       "\"id\": \"abcDEF123\"}, {\"name\": \"t\", \"arguments\": {}}]");
  EXPECT_EQ(s.content, "Checking. ");
  EXPECT_EQ(names_and_arguments(s), (calls{{"get_weather", R"({"city":"Paris"})"}, {"t", "{}"}}));
  // Small 3.2 / Magistral: name[ARGS]{...} after each marker, with or without a call id.
  const split a = both(small32, true, false,
                       "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{}");
  EXPECT_EQ(a.content, "");
  EXPECT_EQ(names_and_arguments(a), (calls{{"get_weather", R"({"city":"Paris"})"}, {"get_time", "{}"}}));
  // Either form parses with either template (models of one generation write the other's).
  EXPECT_EQ(both(small32, true, false, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]").calls.size(), 1u);
  // What does not parse stays content as written, the marker included.
  for (const std::string bad : {"[TOOL_CALLS]f[ARGS]{not json", "[TOOL_CALLS]no args", "[TOOL_CALLS]two words[ARGS]{}"}) {
    const split b = both(small32, true, false, "x " + bad);
    EXPECT_TRUE(b.calls.empty()) << bad;
    EXPECT_EQ(b.content, "x " + bad);
  }
  // Without tools the marker is text like any other.
  EXPECT_EQ(both(nemo, false, false, "[TOOL_CALLS][]").content, "[TOOL_CALLS][]");
}

TEST(ChatOutput, MarkersAndCallIdsFollowTheSyntax) {
  EXPECT_EQ(small32.markers(), (std::vector<std::string_view>{"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"}));
  EXPECT_EQ(qwen3.markers(), (std::vector<std::string_view>{"<think>", "</think>", "<tool_call>", "</tool_call>"}));
  const std::string m = new_tool_call_id(nemo);  // what Mistral's templates accept back
  EXPECT_EQ(m.size(), 9u);
  EXPECT_TRUE(std::all_of(m.begin(), m.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)); })) << m;
  EXPECT_TRUE(new_tool_call_id(qwen3).starts_with("call_"));
  EXPECT_NE(new_tool_call_id(qwen3), new_tool_call_id(qwen3));
}

}  // namespace
