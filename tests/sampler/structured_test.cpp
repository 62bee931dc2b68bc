// Constrained decoding's core: regular expressions as DFAs (against hand-checked matches), JSON
// schemas as regular expressions (random schemas: random walks of their automata always give JSON
// that parses and validates), and token masks (the mask of a state is exactly the tokens whose
// bytes the automaton accepts from it).
#include <random>
#include <string>
#include <vector>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "sampler/structured/gbnf.h"
#include "sampler/structured/json_schema.h"
#include "sampler/structured/regex.h"
#include "sampler/structured/token_masks.h"
#include "tests/sampler/random_schemas.h"

namespace {

using namespace anvil::sampler::structured;
using anvil::testing::schema_gen;
using anvil::testing::validates;
namespace json = boost::json;

TEST(StructuredRegex, MatchesWhatTheSyntaxSays) {
  const auto m = [](std::string_view re, std::string_view text) { return compile_regex(re).matches(text); };
  // One quantifier per atom, as in Python's re: a stack of them is refused (100,000 of them once
  // overflowed the compiler's stack).
  for (const std::string& bad : {std::string("a**"), std::string("a*{2}"), std::string("a{2}{3}"), "a" + std::string(100000, '*')}) {
    EXPECT_THROW(compile_regex(bad), structured_error) << bad.substr(0, 10);
  }
  EXPECT_TRUE(m("(?:a*)*b", "aab"));
  EXPECT_TRUE(m("abc", "abc"));
  EXPECT_FALSE(m("abc", "abcd"));  // the whole output matches
  EXPECT_TRUE(m("^a(b|cd)*e$", "acdbbe"));
  EXPECT_FALSE(m("a(b|cd)*e", "ace"));
  EXPECT_TRUE(m("[a-c]{2,3}", "cab"));
  EXPECT_FALSE(m("[a-c]{2,3}", "cabc"));
  EXPECT_TRUE(m(R"(\d+\.\d{2})", "12.50"));
  EXPECT_TRUE(m("x{3,}", "xxxxx"));
  EXPECT_FALSE(m("x{3,}", "xx"));
  EXPECT_TRUE(m("[^\"\\\\]*", "héllo 世界 👋"));  // classes match whole UTF-8 characters
  EXPECT_FALSE(m("[^\"\\\\]*", "a\"b"));
  EXPECT_TRUE(m(".", "é"));
  EXPECT_FALSE(m(".", "\n"));
  EXPECT_TRUE(m("[é-ê]", "ê"));
  EXPECT_FALSE(m("[é-ê]", "e"));
  EXPECT_TRUE(m(R"(\u00e9|\x41)", "A"));
  EXPECT_TRUE(m("(?:ab)?c", "c"));
  for (const char* bad : {"(ab", "a)", "[ab", "*a", "a{2,1}", "a{1001}", R"(\1)", "(?=a)", "a*?", R"(\b)", "a\\"}) {
    EXPECT_THROW(compile_regex(bad), structured_error) << bad;
  }
  EXPECT_THROW(compile_regex("(a|b)*a(a|b){12}", 1000), structured_error);  // 2^13 states
}

// A random walk through the automaton to an accepting state: one output the constraint allows.
// Prefers to finish as it goes, so walks end.
std::string random_walk(const dfa& d, std::mt19937_64& rng) {
  std::string out;
  std::int32_t s = d.start;
  for (int steps = 0; steps < 20000; ++steps) {
    std::vector<int> bytes;
    for (int b = 0; b < 256; ++b) {
      if (d.next[std::size_t(s)][std::size_t(b)] != dfa::dead) bytes.push_back(b);
    }
    if (d.accepting[std::size_t(s)] && (bytes.empty() || rng() % 4 == 0 || steps > 300)) return out;
    if (bytes.empty()) break;
    // Past a few hundred bytes, prefer the bytes that close strings, objects and arrays.
    int b = bytes[rng() % bytes.size()];
    if (steps > 300) {
      for (const int c : {'"', '}', ']', '0', 'l', 'e'}) {
        if (std::find(bytes.begin(), bytes.end(), c) != bytes.end() && rng() % 2) b = c;
      }
    }
    out += char(b);
    s = d.next[std::size_t(s)][std::size_t(b)];
  }
  ADD_FAILURE() << "the walk did not end: " << out.substr(0, 200);
  return out;
}

TEST(StructuredJsonSchema, RandomSchemasOnlyAdmitJsonThatValidates) {
  schema_gen gen(20261126);
  for (int i = 0; i < 300; ++i) {
    const json::value s = gen.schema(3);
    SCOPED_TRACE(json::serialize(s));
    const dfa d = compile_regex(json_schema_regex(s));
    for (int w = 0; w < 4; ++w) {
      const std::string out = random_walk(d, gen.rng());
      json::error_code ec;
      const json::value v = json::parse(out, ec);
      ASSERT_FALSE(ec) << out;
      EXPECT_TRUE(validates(v, s)) << out;
    }
  }
}

TEST(StructuredJsonSchema, OrderOptionalPropertiesRefsAndRefusals) {
  const dfa d = compile_regex(json_schema_regex(json::parse(
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},"required":["b"]})")));
  EXPECT_TRUE(d.matches(R"({"b":"x"})"));
  EXPECT_TRUE(d.matches(R"({"a": 1, "b": "x", "c": true})"));
  EXPECT_TRUE(d.matches(R"({"b":"x","c":false})"));
  EXPECT_FALSE(d.matches(R"({"a":1})"));          // b is required
  EXPECT_FALSE(d.matches(R"({"b":"x","a":1})"));  // schema order
  EXPECT_FALSE(d.matches(R"({,"b":"x"})"));
  const dfa tree = compile_regex(json_schema_regex(json::parse(
      R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}},"$ref":"#/$defs/node"})")));
  EXPECT_TRUE(tree.matches(R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"));
  EXPECT_TRUE(compile_regex(json_schema_regex(json::parse(R"({"type":"string","format":"date"})"))).matches(R"("2025-02-03")"));
  EXPECT_TRUE(compile_regex(json_object_regex()).matches(R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_FALSE(compile_regex(json_object_regex()).matches(R"([1])"));
  for (const char* bad : {R"({"not":{"type":"string"}})", R"({"type":"integer","maximum":5})", R"({"allOf":[{}]})",
                          R"({"type":"string","format":"hostname"})", R"({"type":"strange"})", R"({"$ref":"#/nowhere"})",
                          R"({"type":"object","properties":{"a":{}},"required":["b"]})"}) {
    EXPECT_THROW(json_schema_regex(json::parse(bad)), structured_error) << bad;
  }
}

// Tool calls in each family's form, their arguments valid against the tool's parameters.
TEST(StructuredJsonSchema, ToolCallsInEachFamilysForm) {
  const std::string tools = R"([{"type":"function","function":{"name":"w","parameters":{"type":"object",
      "properties":{"city":{"enum":["Paris","Rome"]}},"required":["city"]}}},{"type":"function","function":{"name":"t"}}])";
  const dfa hermes = compile_regex(tool_calls_regex(tools, "", {.open = "<tool_call>\n", .close = "\n</tool_call>", .args_key = "arguments"}, true));
  EXPECT_TRUE(hermes.matches("<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>\n"
                             "<tool_call>\n{\"name\":\"t\",\"arguments\":{}}\n</tool_call>"));
  EXPECT_FALSE(hermes.matches("<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"));
  const dfa list = compile_regex(tool_calls_regex(
      tools, "", {.args_key = "arguments", .separator = ", ", .list_open = "[TOOL_CALLS][", .list_close = "]"}, true));
  EXPECT_TRUE(list.matches(R"([TOOL_CALLS][{"name": "w", "arguments": {"city": "Paris"}}, {"name": "t", "arguments": {}}])"));
  EXPECT_FALSE(list.matches(R"([TOOL_CALLS]{"name": "w", "arguments": {"city": "Paris"}})"));
  const dfa args = compile_regex(tool_calls_regex(tools, "w", {.open = "[TOOL_CALLS]", .separator = "", .args_marker = "[ARGS]"}, true));
  EXPECT_TRUE(args.matches(R"([TOOL_CALLS]w[ARGS]{"city": "Paris"}[TOOL_CALLS]w[ARGS]{"city":"Rome"})"));
  EXPECT_FALSE(args.matches(R"([TOOL_CALLS]t[ARGS]{})"));  // only the named one
  EXPECT_THROW(tool_calls_regex(tools, "nope", {}, false), structured_error);
}

// GBNF grammars: llama.cpp's syntax, recursion unrolled to a bounded nesting, refusals named.
TEST(StructuredGbnf, GrammarsMatchWhatTheySay) {
  const auto g = [](std::string_view grammar) { return compile_gbnf(grammar); };
  const dfa yes_no = g(R"(root ::= ("yes" | "no") "." # a comment
)");
  EXPECT_TRUE(yes_no.matches("yes."));
  EXPECT_FALSE(yes_no.matches("maybe."));
  // Rules over several lines, classes, escapes, repeats, any character.
  const dfa list = g(R"(
root ::= item ("," ws item){0,2}
item ::=
  [a-zA-Z_] [a-zA-Z0-9_\-]* | "\"" [^"\n]+ "\""
ws   ::= [ \t]?
)");
  EXPECT_TRUE(list.matches("a1,b-2, \"x y\""));
  EXPECT_FALSE(list.matches("a,b,c,d"));  // {0,2}
  EXPECT_FALSE(list.matches("1a"));
  EXPECT_TRUE(g(R"(root ::= "\u00e9" [\u4e00-\u9fff]+ . "\x41")").matches("é世界\nA"));
  // Recursion, unrolled: nesting up to the bound matches, deeper does not.
  const dfa parens = compile_regex(gbnf_regex("root ::= p\np ::= \"(\" p* \")\"", 3));
  EXPECT_TRUE(parens.matches("(()(()))"));
  EXPECT_FALSE(parens.matches("((()))()"));  // not one group
  EXPECT_FALSE(parens.matches("(((())))"));  // four deep
  // llama.cpp's json.gbnf, unchanged.
  const dfa json_g = g(R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)");
  EXPECT_TRUE(json_g.matches(R"({"a": [1, 2.5, {"b": null}], "c": "d\n"})"));
  EXPECT_FALSE(json_g.matches(R"({"a": })"));
  for (const char* bad : {"root ::= \"a", "root ::= [a-", "root ::= x", "x ::= \"a\"", "root ::= \"a\"\nroot ::= \"b\"",
                          "root ::= (\"a\"", "root ::= \"a\"{3,1}", "root ::= r\nr ::= \"(\" r \")\"", "root ::= \"\\q\"",
                          "root ::= \"a\" | nowhere"}) {
    EXPECT_THROW(compile_gbnf(bad), structured_error) << bad;
  }
  // Inputs that would nest without bound (stacked repeats, long chains of rules, deep groups) are
  // refused, not recursed into: each came in one request and would have overflowed the stack.
  std::string stars(100000, '*'), chain = "root ::= a0\n";
  for (int i = 0; i < 20000; ++i) chain += "a" + std::to_string(i) + " ::= \"x\" a" + std::to_string(i + 1) + "\n";
  chain += "a20000 ::= \"y\"\n";
  for (const std::string& bad : {"root ::= \"a\"" + stars, std::string("root ::= \"a\"*{2}"), chain,
                                 "root ::= " + std::string(5000, '(') + "\"a\"" + std::string(5000, ')')}) {
    EXPECT_THROW(compile_gbnf(bad), structured_error) << bad.substr(0, 40);
  }
  EXPECT_NO_THROW(compile_gbnf("root ::= (\"a\"*)* (\"b\"{2})+"));  // repeats of groups of repeats are fine
  try {
    compile_gbnf("root ::= a\n\na ::= \"x\" b");
    FAIL();
  } catch (const structured_error& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("`b`"), std::string::npos) << e.what();
  }
}

TEST(StructuredTokenMasks, AMaskIsExactlyTheTokensTheAutomatonTakes) {
  // A small vocabulary of pieces, an end-of-generation token (5) and a never-allowed one (6).
  const std::vector<std::string> bytes = {"{", "\"", "a", "\"a\"", "}", "", "", ":", " ", "1", "12", "{\"", "\":"};
  auto vocab = std::make_shared<const vocab_trie>(bytes, std::vector<std::int32_t>{5});
  token_masks masks(compile_regex(json_schema_regex(json::parse(
                        R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})"))),
                    vocab);
  std::int32_t s = masks.start();
  std::mt19937_64 rng(7);
  for (int step = 0; step < 50; ++step) {
    const std::vector<std::uint32_t> m = masks.mask(s);
    std::vector<std::int32_t> allowed;
    for (std::int32_t t = 0; t < std::int32_t(bytes.size()); ++t) {
      const bool bit = (m[std::size_t(t) / 32] >> (t % 32)) & 1u;
      EXPECT_EQ(bit, masks.advance(s, t) != dfa::dead) << "state " << s << " token " << t;
      if (bit) allowed.push_back(t);
    }
    EXPECT_FALSE((m[0] >> 6) & 1u);
    ASSERT_FALSE(allowed.empty());
    const std::int32_t t = allowed[rng() % allowed.size()];
    if (t == 5) {
      EXPECT_TRUE(masks.accepting(s));
      break;
    }
    s = masks.advance(s, t);
  }
  EXPECT_EQ(masks.mask(masks.start()), masks.mask(masks.start()));  // kept, and the same
}

}  // namespace
