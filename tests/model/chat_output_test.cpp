// The chat output parser: reasoning, content and tool calls split as each family writes them,
// the same whether the text comes at once or one byte at a time (a stream).
#include "model/chat/chat_output.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "model/chat/chat_template.h"

namespace {

using namespace anvil::model;

struct split {
  std::string reasoning, content;
  std::vector<parsed_tool_call> calls;
};

split parse_pieces(chat_syntax syntax, bool tools, bool thinking, const std::vector<std::string>& pieces) {
  chat_output_parser p(syntax, tools, thinking);
  split s;
  for (const std::string& text : pieces) {
    const auto piece = p.push(text);
    s.reasoning += piece.reasoning;
    s.content += piece.content;
  }
  const auto rest = p.push({}, true);
  s.reasoning += rest.reasoning;
  s.content += rest.content;
  s.calls = p.tool_calls();
  return s;
}

split parse(chat_syntax syntax, bool tools, bool thinking, const std::string& text, std::size_t chunk) {
  std::vector<std::string> pieces;
  for (std::size_t i = 0; i < text.size(); i += chunk) pieces.push_back(text.substr(i, chunk));
  return parse_pieces(syntax, tools, thinking, pieces);
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

// gpt-oss's harmony format. Each case is the model's tokens (the markers are control tokens,
// which the engine shows as text to the parser); whole, byte by byte and token by token agree.
const chat_syntax gpt_oss{.tools = tool_call_syntax::harmony, .think_tags = false};

split harmony(bool tools, const std::vector<std::string>& tokens) {
  std::string text;
  for (const std::string& t : tokens) text += t;
  const split whole = both(gpt_oss, tools, false, text);
  const split by_token = parse_pieces(gpt_oss, tools, false, tokens);
  EXPECT_EQ(whole.reasoning, by_token.reasoning) << text;
  EXPECT_EQ(whole.content, by_token.content) << text;
  EXPECT_EQ(names_and_arguments(whole), names_and_arguments(by_token)) << text;
  EXPECT_EQ(names_and_arguments(whole), names_and_arguments(parse(gpt_oss, tools, false, text, 1))) << text;
  return whole;
}

std::string read_chat(const std::string& name) {
  std::ifstream in(std::filesystem::path(ANVIL_TEST_DATA_DIR) / "chat" / name, std::ios::binary);
  EXPECT_TRUE(in) << name;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ChatOutput, HarmonyComesFromTheGptOssTemplateOnly) {
  const chat_syntax s = detect_chat_syntax(read_chat("gpt-oss.jinja"));
  EXPECT_EQ(s.tools, tool_call_syntax::harmony);
  EXPECT_FALSE(s.think_tags);
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(ANVIL_TEST_DATA_DIR) / "chat")) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".jinja" || name == "gpt-oss.jinja") continue;
    EXPECT_NE(detect_chat_syntax(read_chat(name)).tools, tool_call_syntax::harmony) << name;
  }
  // Its markers are control tokens the engine shows to the parser; <|return|> and <|call|> end
  // the generation and are not among them.
  EXPECT_EQ(gpt_oss.markers(), (std::vector<std::string_view>{"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"}));
  EXPECT_TRUE(gpt_oss.reasoning());
  EXPECT_TRUE(qwen3.reasoning());
  EXPECT_FALSE(llama3.reasoning());
  EXPECT_TRUE(new_tool_call_id(gpt_oss).starts_with("call_"));
}

TEST(ChatOutput, HarmonyAnalysisIsReasoningAndFinalIsContent) {
  const split s = harmony(false, {"<|channel|>", "analysis", "<|message|>", "We", " need to answer", ".", "<|end|>", "<|start|>",
                                  "assistant", "<|channel|>", "final", "<|message|>", "The answer", " is 4."});
  EXPECT_EQ(s.reasoning, "We need to answer.");
  EXPECT_EQ(s.content, "The answer is 4.");
  EXPECT_TRUE(s.calls.empty());
  // A final message alone.
  const split f = harmony(false, {"<|channel|>", "final", "<|message|>", "4"});
  EXPECT_EQ(f.reasoning, "");
  EXPECT_EQ(f.content, "4");
  // A commentary message without a recipient is a preamble for the user: content.
  const split p = harmony(false, {"<|channel|>", "analysis", "<|message|>", "Plan.", "<|end|>", "<|start|>", "assistant", "<|channel|>",
                                  "commentary", "<|message|>", "Working on it.", "<|end|>"});
  EXPECT_EQ(p.reasoning, "Plan.");
  EXPECT_EQ(p.content, "Working on it.");
  // <|return|> ends the generation (where the text shows it): nothing after it is the answer.
  const split r = harmony(false, {"<|channel|>", "final", "<|message|>", "Hi", "<|return|>", "<|start|>", "assistant", "<|channel|>",
                                  "final", "<|message|>", "again"});
  EXPECT_EQ(r.content, "Hi");
  EXPECT_EQ(r.reasoning, "");
}

TEST(ChatOutput, HarmonyToolCallsInBothHeaderOrders) {
  // The recipient after the channel, with <|constrain|>json (as the harmony guide writes it).
  const split a = harmony(true, {"<|channel|>", "analysis", "<|message|>", "Need weather.", "<|end|>", "<|start|>", "assistant",
                                 "<|channel|>", "commentary", " to", "=", "functions", ".get", "_weather", " ", "<|constrain|>", "json",
                                 "<|message|>", "{\"", "location", "\":\"", "Paris", "\"}"});
  EXPECT_EQ(a.reasoning, "Need weather.");
  EXPECT_EQ(a.content, "");
  EXPECT_EQ(names_and_arguments(a), (calls{{"get_weather", R"({"location":"Paris"})"}}));
  // The recipient in the role part and a bare content type (as the template writes the history);
  // <|call|> ends it.
  const split b = harmony(true, {"<|start|>", "assistant", " to", "=functions.get_weather", "<|channel|>", "commentary", " json",
                                 "<|message|>", "{\"location\": \"Paris\", \"days\": 2}", "<|call|>"});
  EXPECT_EQ(b.content, "");
  EXPECT_EQ(names_and_arguments(b), (calls{{"get_weather", R"({"location":"Paris","days":2})"}}));
  // The first message's recipient straight after the prompt's "<|start|>assistant".
  const split c = harmony(true, {" to", "=functions.get_time", "<|channel|>", "commentary", "<|message|>", "{}"});
  EXPECT_EQ(c.content, "");
  EXPECT_EQ(names_and_arguments(c), (calls{{"get_time", "{}"}}));
  // A preamble, then the call; a call on the analysis channel is a call too.
  const split d = harmony(true, {"<|channel|>", "commentary", "<|message|>", "Checking.", "<|end|>", "<|start|>", "assistant",
                                 "<|channel|>", "analysis to=functions.lookup", "<|message|>", "{\"q\": [1, 2]}"});
  EXPECT_EQ(d.content, "Checking.");
  EXPECT_EQ(names_and_arguments(d), (calls{{"lookup", R"({"q":[1,2]})"}}));
  // Several calls when the text goes on past one; without parallel calls only the first.
  const std::string two =
      "<|channel|>commentary to=functions.a<|message|>{}<|end|><|start|>assistant<|channel|>commentary to=functions.b<|message|>{}";
  EXPECT_EQ(names_and_arguments(both(gpt_oss, true, false, two)), (calls{{"a", "{}"}, {"b", "{}"}}));
  chat_output_parser one(gpt_oss, true, false, false);
  one.push(two, true);
  ASSERT_EQ(one.tool_calls().size(), 1u);
  EXPECT_EQ(one.tool_calls()[0].name, "a");
}

TEST(ChatOutput, HarmonyMessagesNotTakenApartStayAsWritten) {
  // Tools not offered: a call is text, as the model wrote it; the reasoning is still split off.
  const split s = harmony(false, {"<|channel|>", "analysis", "<|message|>", "Need weather.", "<|end|>", "<|start|>", "assistant",
                                  "<|channel|>", "commentary to=functions.get_weather ", "<|constrain|>", "json", "<|message|>",
                                  "{\"location\":\"Paris\"}"});
  EXPECT_EQ(s.reasoning, "Need weather.");
  EXPECT_TRUE(s.calls.empty());
  EXPECT_EQ(s.content,
            "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"Paris\"}");
  // Another recipient (a built-in tool) is never a call: as written, reasoning on analysis.
  const split py = harmony(true, {"<|channel|>", "analysis", " to=python", " code", "<|message|>", "print(1)", "<|call|>"});
  EXPECT_TRUE(py.calls.empty());
  EXPECT_EQ(py.reasoning, "<|channel|>analysis to=python code<|message|>print(1)");
  EXPECT_EQ(py.content, "");
  // A call whose body is not a JSON object, an unknown channel, another role: as written.
  const split bad = harmony(true, {"<|channel|>", "commentary to=functions.f", "<|message|>", "not json", "<|call|>"});
  EXPECT_TRUE(bad.calls.empty());
  EXPECT_EQ(bad.content, "<|channel|>commentary to=functions.f<|message|>not json");
  EXPECT_EQ(harmony(true, {"<|channel|>", "commentary to=functions.f", "<|message|>", "[1]"}).content,
            "<|channel|>commentary to=functions.f<|message|>[1]");
  EXPECT_EQ(harmony(false, {"<|channel|>", "secret", "<|message|>", "x", "<|end|>"}).content, "<|channel|>secret<|message|>x");
  EXPECT_EQ(harmony(false, {"<|channel|>", "final", "<|message|>", "A", "<|end|>", "<|start|>", "user", "<|message|>", "B"}).content,
            "A<|start|>user<|message|>B");
}

TEST(ChatOutput, HarmonyCutShortOrMalformedLosesNoText) {
  // Cut inside a header: the first message's, or a later one's.
  EXPECT_EQ(harmony(false, {"<|channel|>", "anal"}).content, "<|channel|>anal");
  const split mid = harmony(false, {"<|channel|>", "analysis", "<|message|>", "Think", "<|end|>", "<|start|>", "assistant", "<|channel|>", "fin"});
  EXPECT_EQ(mid.reasoning, "Think");
  EXPECT_EQ(mid.content, "<|start|>assistant<|channel|>fin");
  EXPECT_EQ(harmony(false, {"<|channel|>", "final", "<|message|>", "A", "<|end|>", "<|sta"}).content, "A<|sta");
  // Cut inside a body: all of it, even what began a marker.
  EXPECT_EQ(harmony(false, {"<|channel|>", "analysis", "<|message|>", "Still thinking <|"}).reasoning, "Still thinking <|");
  EXPECT_EQ(harmony(false, {"<|channel|>", "final", "<|message|>", "Half an ans"}).content, "Half an ans");
  // Cut inside a call's arguments: the call as written; cut after whole arguments: a call.
  const split cut = harmony(true, {"<|channel|>", "commentary to=functions.get_weather", "<|message|>", "{\"location\": \"Par"});
  EXPECT_TRUE(cut.calls.empty());
  EXPECT_EQ(cut.content, "<|channel|>commentary to=functions.get_weather<|message|>{\"location\": \"Par");
  EXPECT_EQ(harmony(true, {"<|channel|>", "commentary to=functions.f", "<|message|>", "{\"a\": 1}"}).calls.size(), 1u);
  // Not harmony at all: plain content, shown as it comes (below), its leading space kept.
  EXPECT_EQ(harmony(false, {" Plain", " text", "\n", "more"}).content, " Plain text\nmore");
  // A header that runs on past a newline is text, up to the next message.
  const split runs = harmony(false, {"<|channel|>", "final\nHello", "<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "Hi"});
  EXPECT_EQ(runs.content, "<|channel|>final\nHelloHi");
}

TEST(ChatOutput, HarmonyStreamsAsItComes) {
  chat_output_parser p(gpt_oss, true, false);
  EXPECT_EQ(p.push("<|channel|>analysis").reasoning, "");  // a header is held back until <|message|>
  EXPECT_EQ(p.push("<|message|>Let me").reasoning, "Let me");
  EXPECT_EQ(p.push(" think<|e").reasoning, " think");  // "<|e" may begin <|end|>
  const auto c = p.push("nd|><|start|>assistant<|channel|>final<|message|>It is 4");
  EXPECT_EQ(c.reasoning, "");
  EXPECT_EQ(c.content, "It is 4");
  EXPECT_EQ(p.push(".", true).content, ".");
  chat_output_parser plain(gpt_oss, false, false);
  EXPECT_EQ(plain.push("Hello").content, "Hello");
}

// Any sequence of harmony's pieces, well formed or not, splits the same whole, byte by byte and
// token by token (a fixed seed: the same sequences every run).
TEST(ChatOutput, HarmonySplitsTheSameHoweverTheTextIsCut) {
  const std::vector<std::string> alphabet = {"<|start|>", "assistant", "<|channel|>", "analysis", "final", "commentary", " to=",
                                             "functions.f", "python", "<|constrain|>", "json", " ", "<|message|>", "<|end|>",
                                             "<|return|>", "<|call|>", "{\"a\": 1}", "{", "text", "\n", "<|", "|>"};
  std::mt19937 rng(7);
  for (int n = 0; n < 400; ++n) {
    std::vector<std::string> tokens(rng() % 24);
    for (std::string& t : tokens) t = alphabet[rng() % alphabet.size()];
    for (const bool tools : {false, true}) harmony(tools, tokens);
  }
}

// The other direction: an assistant message's reasoning_content reaches gpt-oss's template, which
// reads it as `thinking` (and writes it back as an analysis message before a call).
TEST(ChatOutput, HarmonyReasoningGoesBackToTheTemplateAsThinking) {
  const chat_template t(read_chat("gpt-oss.jinja"), "<|startoftext|>", "<|return|>");
  const std::vector<chat_message> messages = {
      {.role = "user", .content = "Weather in Paris?"},
      {.role = "assistant",
       .content = "",
       .tool_calls_json = R"([{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"location": "Paris"}}}])",
       .reasoning_content = "Need weather."},
      {.role = "tool", .content = "{\"temp\": 21}", .tool_call_id = "call_1"}};
  const std::string prompt = t.render(messages, true);
  EXPECT_NE(prompt.find("<|start|>assistant<|channel|>analysis<|message|>Need weather.<|end|>"
                        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"),
            std::string::npos)
      << prompt;
  EXPECT_TRUE(prompt.ends_with("<|start|>assistant")) << prompt;  // where the parser's first header begins
}

}  // namespace
