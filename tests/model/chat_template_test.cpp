// Chat templates against tests/data/chat/goldens.json: tools/chat/render_goldens.py renders the
// real templates stored beside it with Jinja2 the way transformers does, over a fixed set of
// conversations (with and without tools). anvil's interpreter must match every output byte for
// byte, and must throw wherever the real template raises.
#include "model/chat/chat_template.h"

#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <boost/json.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/model_error.h"

namespace {

namespace json = boost::json;
using anvil::model::chat_inputs;
using anvil::model::chat_message;
using anvil::model::chat_template;
using anvil::model::model_error;
using ::testing::HasSubstr;

std::string read_data(const std::string& name) {
  std::ifstream in(std::filesystem::path(ANVIL_TEST_DATA_DIR) / "chat" / name, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open tests/data/chat/" << name;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string str(const json::value& v) { return std::string(v.as_string()); }

const json::object& goldens() {
  static const json::value parsed = json::parse(read_data("goldens.json"));
  return parsed.as_object();
}

// The clock the goldens pin strftime_now to: 2025-02-03 12:00:00.
std::tm golden_now() {
  std::tm t{};
  t.tm_year = 2025 - 1900;
  t.tm_mon = 1;
  t.tm_mday = 3;
  t.tm_hour = 12;
  std::time_t flat = timegm(&t);
  gmtime_r(&flat, &t);  // fills tm_wday / tm_yday
  return t;
}

chat_template load(const json::object& entry) {
  chat_template t(read_data(str(entry.at("file"))), str(entry.at("bos_token")), str(entry.at("eos_token")));
  t.pin_clock(golden_now());
  return t;
}

std::string label(const json::object& tmpl, const json::object& render) {
  return str(tmpl.at("name")) + " / " + str(render.at("conversation")) +
         (render.at("add_generation_prompt").as_bool() ? " / generation prompt" : "");
}

TEST(ChatTemplateGoldens, EveryRenderingMatchesTransformersByteForByte) {
  const json::object& conversations = goldens().at("conversations").as_object();
  int outputs = 0, errors = 0;
  for (const json::value& t : goldens().at("templates").as_array()) {
    const json::object& tmpl = t.as_object();
    const chat_template ct = load(tmpl);
    for (const json::value& r : tmpl.at("renders").as_array()) {
      const json::object& render = r.as_object();
      const json::object& conv = conversations.at(str(render.at("conversation"))).as_object();
      json::object vars = tmpl.at("variables").as_object();
      vars["messages"] = conv.at("messages");
      vars["tools"] = conv.at("tools");
      vars["documents"] = nullptr;
      vars["add_generation_prompt"] = render.at("add_generation_prompt");
      if (const json::value* out = render.if_contains("output")) {
        ++outputs;
        try {
          EXPECT_EQ(ct.render_variables(vars), str(*out)) << label(tmpl, render);
        } catch (const model_error& e) {
          ADD_FAILURE() << label(tmpl, render) << ": threw " << e.what();
        }
      } else {
        ++errors;
        EXPECT_THROW(ct.render_variables(vars), model_error) << label(tmpl, render) << " should raise " << str(render.at("error"));
      }
    }
  }
  EXPECT_GT(outputs, 100);
  EXPECT_GT(errors, 10);
}

// raise_exception's message comes back with the template line that raised it.
TEST(ChatTemplate, RaisedErrorsNameTheLine) {
  const chat_template t("{% if messages|length == 0 %}\n{{ raise_exception('no messages') }}\n{% endif %}", "", "");
  try {
    t.render(std::vector<chat_message>{}, true);
    FAIL() << "expected a throw";
  } catch (const model_error& e) {
    EXPECT_STREQ(e.what(), "chat template, line 2: no messages");
  }
}

TEST(ChatTemplate, SyntaxErrorsNameTheLine) {
  try {
    chat_template("line one\n{% if x %}\n{{ 1 + }}\n{% endif %}", "", "");
    FAIL() << "expected a throw";
  } catch (const model_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("chat template, line 3:"));
  }
  EXPECT_THROW(chat_template("{% for x in y %}never closed", "", ""), model_error);
  EXPECT_THROW(chat_template("{{ 'unterminated }}", "", ""), model_error);
  EXPECT_THROW(chat_template("{% unknowntag %}", "", ""), model_error);
  EXPECT_THROW(chat_template("{{ x", "", ""), model_error);
  EXPECT_THROW(chat_template("{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}", "", ""), model_error);
  EXPECT_THROW(chat_template("{{ " + std::string(1000, '-') + "1 }}", "", ""), model_error);
}

std::string run(const std::string& source, const std::string& vars_json = "{}") {
  return chat_template(source, "<s>", "</s>").render_variables(json::parse(vars_json).as_object());
}

TEST(JinjaInterpreter, WhitespaceControlAsTransformersConfiguresIt) {
  // trim_blocks eats the newline after a block tag; lstrip_blocks the indentation before one.
  EXPECT_EQ(run("{% if true %}\n  a\n  {% endif %}\nb"), "  a\nb");
  EXPECT_EQ(run("x  {%- if true -%}  y  {%- endif -%}  z"), "xyz");
  EXPECT_EQ(run("a {{- ' b ' -}} c"), "a b c");
  EXPECT_EQ(run("  {%+ if true %}k{% endif %}"), "  k");
  EXPECT_EQ(run("{# comment #}\nz\n"), "z");  // one trailing newline of the source is dropped
}

TEST(JinjaInterpreter, ExpressionsFollowPythonSemantics) {
  EXPECT_EQ(run("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.0 }} {{ 1e-5 }}"),
            "3 -4 -2 3.5 1024 1.0 1e-05");
  EXPECT_EQ(run("{{ 'ab' * 3 }} {{ [1, 2] + [3] }} {{ 'a' ~ 1 ~ none }}"), "ababab [1, 2, 3] a1None");
  EXPECT_EQ(run("{{ {'a': 'x', 'b': [true, none]} }}"), "{'a': 'x', 'b': [True, None]}");
  EXPECT_EQ(run("{{ 'x' if false }}|{{ 1 if 0 else 2 }}|{{ none or 'd' }}|{{ 0 and 1 }}"), "|2|d|0");
  EXPECT_EQ(run("{{ 'héllo'[1] }} {{ 'héllo'[-2:] }} {{ 'héllo'|length }} {{ [1,2,3][::-1] }}"), "é lo 5 [3, 2, 1]");
  EXPECT_EQ(run("{{ 'a' in 'cat' }} {{ 2 not in [1, 2] }} {{ 'k' in {'k': 1} }}"), "True False True");
  EXPECT_EQ(run("{{ '  a b  '.strip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'x'.upper() }}"),
            "a b|['a', 'b', '', 'c']|['a', 'b']|X");
  EXPECT_EQ(run("{{ 'abc'.startswith(('x', 'a')) }} {{ 'abc'.endswith('bc') }} {{ 'a-b-c'.rsplit('-', 1) }}"),
            "True True ['a-b', 'c']");
}

TEST(JinjaInterpreter, LoopsScopesAndNamespaces) {
  EXPECT_EQ(run("{% for x in [1, 2, 3] if x != 2 %}{{ loop.index }}{{ x }}{{ ',' if not loop.last }}{% endfor %}"),
            "11,23");
  EXPECT_EQ(run("{% set n = 1 %}{% for x in [1] %}{% set n = 5 %}{% endfor %}{{ n }}"), "1");
  EXPECT_EQ(run("{% set ns = namespace(n=1) %}{% for x in [1] %}{% set ns.n = 5 %}{% endfor %}{{ ns.n }}"), "5");
  EXPECT_EQ(run("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(run("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(run("{% for x in range(5) %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}"),
            "02");
  EXPECT_EQ(run("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}"), "[1B][23]");
  EXPECT_EQ(run("{% set s %}in {{ 1 }}{% endset %}{{ s }}!"), "in 1!");
  EXPECT_EQ(run("{{ loop }}|{{ missing }}|{{ missing is defined }}|{{ d.x is defined }}", R"({"d": {}})"),
            "||False|False");
}

TEST(JinjaInterpreter, Filters) {
  EXPECT_EQ(run(R"({{ x|tojson }})", R"({"x": {"a": [1, 2.5, "é\n\"", null, true]}})"),
            R"({"a": [1, 2.5, "é\n\"", null, true]})");
  EXPECT_EQ(run(R"({{ x|tojson(indent=2) }})", R"({"x": {"a": [1], "b": {}}})"), "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}");
  EXPECT_EQ(run("{{ ms|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(', ') }}",
                R"({"ms": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}, {"role": "user", "content": "c"}]})"),
            "a, c");
  EXPECT_EQ(run("{{ [3, 1, 2]|sort|list }} {{ ['b', 'A']|sort }} {{ [1, 1, 2]|unique|list }} {{ [1, 2]|reverse|list }}"),
            "[1, 2, 3] ['A', 'b'] [1, 2] [2, 1]");
  EXPECT_EQ(run("{{ missing|default('d') }} {{ ''|default('e', true) }} {{ ' x '|trim }} {{ 'a\nb'|indent(2) }}"),
            "d e x a\n  b");
  EXPECT_EQ(run("{{ [1, 2]|first }}{{ [1, 2]|last }} {{ '5'|int + 1 }} {{ 2|float }} {{ [1, 2, 3]|sum }}"), "12 6 2.0 6");
}

TEST(JinjaInterpreter, ErrorsAreTemplateErrorsNeverCrashes) {
  EXPECT_THROW(run("{{ missing.attr }}"), model_error);
  EXPECT_THROW(run("{{ 1 + 'a' }}"), model_error);
  EXPECT_THROW(run("{{ x.append(1) }}", R"({"x": []})"), model_error);  // the sandbox forbids mutation
  EXPECT_THROW(run("{{ 1 // 0 }}"), model_error);
  EXPECT_THROW(run("{{ none|tojson }}{{ missing|tojson }}"), model_error);
  EXPECT_THROW(run("{{ 'x'|nosuchfilter }}"), model_error);
  EXPECT_THROW(run("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"), model_error);  // unbounded recursion
  EXPECT_THROW(run("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"), model_error);
  EXPECT_THROW(run("{% set s = 'x' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}"), model_error);
  // Values a hostile template builds stay bounded: size, nesting depth, no cycles.
  EXPECT_THROW(run("{{ ('x' * 1000000).replace('x', 'yyyyyyyyyyyyyyyyyyyy') }}"), model_error);
  EXPECT_THROW(run("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"), model_error);
  EXPECT_THROW(run("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}"), model_error);
  EXPECT_THROW(run("{% set ns = namespace() %}{% set ns.me = ns %}"), model_error);
  EXPECT_THROW(run("{% set ns = namespace() %}{% set ns.l = [1, {'a': ns}] %}"), model_error);
  EXPECT_THROW(run("{{ [[1, 2] * 1000] * 100000 }}"), model_error);
  EXPECT_THROW(run(std::string(500, '{') + "% if true %}"), model_error);
  std::string nested_ifs;
  for (int i = 0; i < 1000; ++i) nested_ifs += "{% if true %}";
  EXPECT_THROW(run(nested_ifs), model_error);
}

// The render() entry point sends message fields as transformers' callers do: content null for
// a tool-calling turn, tool calls with object arguments, tools and extra keywords as variables.
TEST(ChatTemplate, MessagesToolsAndKeywordsReachTheTemplate) {
  const chat_template t(
      "{% for m in messages %}{{ m.role }}:{{ m.content if m.content is not none else '-' }}"
      "{% if m.tool_calls is defined %}{{ m.tool_calls[0].function.arguments.city }}{% endif %}"
      "{% if m.tool_call_id is defined %}#{{ m.tool_call_id }}{% endif %};{% endfor %}"
      "{{ tools|length }}{{ tools[0].function.name }}|{{ enable_thinking }}|{{ add_generation_prompt }}",
      "", "");
  const std::vector<chat_message> ms = {
      {.role = "user", .content = "Weather?"},
      {.role = "assistant", .content = "", .content_is_null = true,
       .tool_calls_json = R"([{"id":"c1","type":"function","function":{"name":"w","arguments":{"city":"Paris"}}}])"},
      {.role = "tool", .content = "sunny", .tool_call_id = "c1"}};
  const std::string out = t.render(chat_inputs{.messages = ms,
                                               .add_generation_prompt = true,
                                               .tools_json = R"([{"type":"function","function":{"name":"w"}}])",
                                               .template_kwargs_json = R"({"enable_thinking": false})"});
  EXPECT_EQ(out, "user:Weather?;assistant:-Paris;tool:sunny#c1;1w|False|True");
  EXPECT_THROW(t.render(chat_inputs{.messages = ms, .tools_json = "[oops"}), model_error);
}

TEST(ChatTemplate, GptOssTakesToolCallsBackAsOpenAiClientsSendThem) {
  // An assistant tool-call message with null content (what anvil returns and clients send back)
  // and its reasoning; a second one with a preamble and reasoning both. gpt-oss's own template
  // fails on the first (null is not a string) and raises on the second.
  const chat_template t(read_data("gpt-oss.jinja"), "<|startoftext|>", "<|return|>");
  const std::string call = R"([{"id":"c1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}}])";
  const std::vector<chat_message> ms = {
      {.role = "user", .content = "Weather in Paris?"},
      {.role = "assistant", .content = "", .content_is_null = true, .tool_calls_json = call,
       .reasoning_content = "Need the weather tool."},
      {.role = "tool", .content = "sunny", .tool_call_id = "c1"},
      {.role = "assistant", .content = "Checking again.", .tool_calls_json = call, .reasoning_content = "Once more."},
      {.role = "tool", .content = "still sunny", .tool_call_id = "c1"}};
  const std::string out = t.render(chat_inputs{
      .messages = ms,
      .tools_json = R"([{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object"}}}])"});
  EXPECT_THAT(out, HasSubstr("<|start|>assistant<|channel|>analysis<|message|>Need the weather tool.<|end|>"
                             "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"));
  EXPECT_THAT(out, HasSubstr("<|channel|>analysis<|message|>Once more.<|end|>"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("Checking again.")));
}

}  // namespace
