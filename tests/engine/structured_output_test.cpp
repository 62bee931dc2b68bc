// Structured output through the engine: 1,000 random JSON schemas (tests/sampler/random_schemas.h)
// decoded by a random-weight model with temperature 1, 64 at a time, every output parsing and
// validating and ending by itself; regular expressions, GBNF grammars and json_object the same way; bad
// constraints refused with the field named; constrained and unconstrained requests sharing steps.
#include <future>
#include <map>
#include <string>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "sampler/structured/gbnf.h"
#include "sampler/structured/regex.h"
#include "tests/engine/requests.h"
#include "tests/model/fixtures.h"
#include "tests/sampler/random_schemas.h"

namespace {

using namespace anvil;
namespace asio = boost::asio;
namespace json = boost::json;

engine_config config() {
  engine_config c;
  c.model_path = model::testing::synth_fixture("tiny", model::synth_mix::f32);
  c.kv_budget_bytes = 32u << 20;
  c.max_seqs = 64;
  c.max_batch_tokens = 1024;
  c.max_model_len = 2048;
  return c;
}

generate_request constrained(structured_output c, std::uint64_t seed) {
  generate_request r;
  r.prompt_tokens = anvil::testing::random_prompt(4 + seed % 5, std::uint32_t(seed));
  r.max_tokens = 1500;
  r.sampling.temperature = 1.f;
  r.sampling.seed = seed;
  r.constraint = std::move(c);
  return r;
}

TEST(StructuredOutput, ThousandRandomSchemasGiveOutputsThatValidate) {
  auto eng = engine::create(config());
  anvil::testing::schema_gen gen(424242);
  // A quarter of them under the sanitizers (a Debug build, where the thousand took 143 s of CI's
  // two cores); the first 250 schemas are the same either way.
#if defined(ANVIL_SANITIZED)
  constexpr int total = 250;
#else
  constexpr int total = 1000;
#endif
  int done = 0;
  for (int batch = 0; batch < total / 64 + 1 && done < total; ++batch) {
    std::vector<json::value> schemas;
    std::vector<std::future<completion>> futures;
    for (int i = 0; i < 64 && done + i < total; ++i) {
      schemas.push_back(gen.schema(3));
      structured_output c{.what = structured_output::kind::json_schema, .spec = json::serialize(schemas.back()),
                          .field = "response_format"};
      futures.push_back(eng->async_generate(constrained(std::move(c), std::uint64_t(done + i)), asio::use_future));
    }
    for (std::size_t i = 0; i < futures.size(); ++i) {
      const completion out = futures[i].get();
      SCOPED_TRACE(json::serialize(schemas[i]));
      EXPECT_EQ(out.finish_reason, "stop") << out.text;
      json::error_code ec;
      const json::value v = json::parse(out.text, ec);
      ASSERT_FALSE(ec) << out.text;
      EXPECT_TRUE(anvil::testing::validates(v, schemas[i])) << out.text;
    }
    done += int(futures.size());
  }
  EXPECT_EQ(done, total);
  eng->async_stop(asio::use_future).get();
}

// Overlapped steps (engine_config::overlap_steps) plan constrained sequences ahead too, their masks
// sent once the step before has completed (sched/scheduler.h): the tokens are those of serial
// steps, request for request, and the steps are planned ahead.
TEST(StructuredOutput, ConstrainedStepsArePlannedAheadAndGiveTheTokensOfSerialSteps) {
  const std::string pattern = R"(\{"n": [0-9]{1,6}, "s": "[a-z ]{0,30}"\})";
  std::map<bool, std::vector<completion>> runs;
  std::map<bool, engine_stats> stats;
  for (const bool overlap : {false, true}) {
    engine_config cfg = config();
    cfg.overlap_steps = overlap;
    auto eng = engine::create(cfg);
    anvil::testing::schema_gen gen(77);
    std::vector<std::future<completion>> futures;
    for (int i = 0; i < 16; ++i) {
      structured_output c = i % 2 ? structured_output{.what = structured_output::kind::regex, .spec = pattern, .field = "regex"}
                                  : structured_output{.what = structured_output::kind::json_schema,
                                                      .spec = json::serialize(gen.schema(2)),
                                                      .field = "response_format"};
      generate_request r = constrained(std::move(c), 500u + std::uint64_t(i));
      if (i % 4 == 0) r.sampling.temperature = 0.f;  // greedy ones too
      futures.push_back(eng->async_generate(std::move(r), asio::use_future));
    }
    for (auto& f : futures) runs[overlap].push_back(f.get());
    stats[overlap] = eng->stats();
    eng->async_stop(asio::use_future).get();
  }
  const sampler::structured::dfa d = sampler::structured::compile_regex(pattern);
  for (std::size_t i = 0; i < runs[true].size(); ++i) {
    EXPECT_EQ(runs[true][i].tokens, runs[false][i].tokens) << "request " << i;
    EXPECT_EQ(runs[true][i].finish_reason, "stop") << "request " << i << ": " << runs[true][i].text;
    if (i % 2) {
      EXPECT_TRUE(d.matches(runs[true][i].text)) << runs[true][i].text;
    }
  }
  EXPECT_GT(stats[true].sched.steps_ahead, stats[true].sched.steps / 2) << stats[true].sched.steps;
  EXPECT_EQ(stats[false].sched.steps_ahead, 0);
}

TEST(StructuredOutput, RegexAndJsonObjectAndUnconstrainedNeighbours) {
  auto eng = engine::create(config());
  const std::string pattern = R"((yes|no), [0-9]{3}-[a-z]{2,4}!)";
  const sampler::structured::dfa d = sampler::structured::compile_regex(pattern);
  std::vector<std::future<completion>> regex, object, free;
  for (int i = 0; i < 12; ++i) {
    regex.push_back(eng->async_generate(
        constrained({.what = structured_output::kind::regex, .spec = pattern, .field = "regex"}, std::uint64_t(i)),
        asio::use_future));
    object.push_back(eng->async_generate(
        constrained({.what = structured_output::kind::json_object, .spec = {}, .field = "response_format"}, 100u + std::uint64_t(i)),
        asio::use_future));
    free.push_back(eng->async_generate(anvil::testing::greedy_request(anvil::testing::random_prompt(5, 7u + std::uint32_t(i)), 20),
                                       asio::use_future));
  }
  for (auto& f : regex) {
    const completion c = f.get();
    EXPECT_TRUE(d.matches(c.text)) << c.text;
    EXPECT_EQ(c.finish_reason, "stop");
  }
  for (auto& f : object) {
    const completion c = f.get();
    if (c.finish_reason == "length") continue;  // an object may nest and run long; the cut is honest
    json::error_code ec;
    const json::value v = json::parse(c.text, ec);
    EXPECT_FALSE(ec) << c.text;
    EXPECT_TRUE(v.is_object()) << c.text;
  }
  for (auto& f : free) EXPECT_EQ(f.get().tokens.size(), 20u);  // the neighbours are untouched

  // A bad constraint is refused before it is queued, naming its field.
  generate_request bad = constrained({.what = structured_output::kind::json_schema, .spec = R"({"not": {}})",
                                      .field = "response_format"}, 1);
  EXPECT_NE(eng->explain(bad).find("`response_format`: json_schema: `not`"), std::string::npos) << eng->explain(bad);
  EXPECT_FALSE(eng->submit(bad, [](const stream_event&) {}));
  generate_request bad_re = constrained({.what = structured_output::kind::regex, .spec = "(a", .field = "regex"}, 1);
  EXPECT_NE(eng->explain(bad_re).find("`regex`: regex:"), std::string::npos) << eng->explain(bad_re);
  EXPECT_EQ(eng->explain(bad_re), eng->explain(bad_re));  // the second answer comes from the cache of failures
  eng->async_stop(asio::use_future).get();
}

// A recursive GBNF grammar (arithmetic with parentheses): every output is in its language and ends
// by itself (the unrolled language is finite); a bad grammar is refused naming the field and line.
TEST(StructuredOutput, GrammarsConstrainTheOutput) {
  auto eng = engine::create(config());
  const std::string grammar = R"gbnf(# sums of numbers and bracketed sums
root ::= expr "="
expr ::= term (("+" | "-") term){0,3}
term ::= [0-9]{1,3} | "(" expr ")"
)gbnf";
  const sampler::structured::dfa d = sampler::structured::compile_gbnf(grammar);
  std::vector<std::future<completion>> outs;
  for (int i = 0; i < 12; ++i) {
    outs.push_back(eng->async_generate(
        constrained({.what = structured_output::kind::grammar, .spec = grammar, .field = "grammar"}, 200u + std::uint64_t(i)),
        asio::use_future));
  }
  int bracketed = 0;
  for (auto& f : outs) {
    const completion c = f.get();
    EXPECT_TRUE(d.matches(c.text)) << c.text;
    EXPECT_EQ(c.finish_reason, "stop") << c.text;
    bracketed += c.text.find('(') != std::string::npos;
  }
  EXPECT_GT(bracketed, 0);  // the recursive alternative is reachable
  generate_request bad = constrained({.what = structured_output::kind::grammar, .spec = "root ::= a\na ::= \"(\" b",
                                      .field = "grammar"}, 1);
  EXPECT_NE(eng->explain(bad).find("`grammar`: grammar line 2: rule `b` is not defined"), std::string::npos)
      << eng->explain(bad);
  eng->async_stop(asio::use_future).get();
}

}  // namespace
