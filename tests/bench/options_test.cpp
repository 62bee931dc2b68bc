// Option validation and parsing, and the prompts built from options.
#include "bench/load/bench_options.h"

#include <cmath>
#include <cstdio>
#include <fstream>

#include <gtest/gtest.h>

#include "bench/load/prompts.h"
#include "tests/scratch_dir.h"

namespace anvil::bench {
namespace {

bench_options valid() {
  bench_options o;
  o.url = "tcp://127.0.0.1:8081";
  return o;
}

TEST(BenchOptions, ParsesTargets) {
  std::string err;
  auto t = parse_target("tcp://localhost:8081", err);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->proto, bench_target::protocol::line);
  EXPECT_EQ(t->host, "localhost");
  EXPECT_EQ(t->port, 8081);
  t = parse_target("http://10.0.0.2:8000/", err);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->proto, bench_target::protocol::http);
  EXPECT_EQ(t->port, 8000);
  EXPECT_EQ(parse_target("http://h", err)->port, 80);
  EXPECT_EQ(parse_target("http://[::1]:8000", err)->host, "::1");
  for (const char* bad : {"https://h:1", "tcp://h", "tcp://:1", "tcp://h:0", "tcp://h:99999", "http://h:1/v1", "h:1"})
    EXPECT_FALSE(parse_target(bad, err)) << bad;
}

TEST(BenchOptions, ValidationNamesTheProblem) {
  EXPECT_EQ(validate_options(valid()), "");
  auto o = valid();
  o.concurrency = 4;
  o.request_rate = 2;
  EXPECT_NE(validate_options(o).find("not both"), std::string::npos);
  o = valid();
  o.num_prompts = 0;
  EXPECT_NE(validate_options(o).find("--num-prompts"), std::string::npos);
  o = valid();
  o.burstiness = 0;
  EXPECT_NE(validate_options(o).find("--burstiness"), std::string::npos);
  o = valid();
  o.url = "http://127.0.0.1:8000";
  o.endpoint = "/v1/chat/completions";
  o.random_token_ids = true;
  EXPECT_NE(validate_options(o).find("--random-token-ids"), std::string::npos);
  o = valid();
  o.token_min = 10;
  o.token_max = 5;
  EXPECT_NE(validate_options(o).find("--token-min"), std::string::npos);
  o = valid();
  o.percentiles = {100};
  EXPECT_NE(validate_options(o).find("--percentiles"), std::string::npos);
}

TEST(BenchOptions, ConcurrencyIsAnInfiniteRateWithACap) {
  auto o = valid();
  o.concurrency = 8;
  EXPECT_EQ(in_flight_cap(o), 8);
  EXPECT_TRUE(std::isinf(effective_rate(o)));
  o = valid();
  o.request_rate = 4;
  o.max_concurrency = 2;
  EXPECT_EQ(in_flight_cap(o), 2);
  EXPECT_EQ(effective_rate(o), 4);
}

TEST(BenchOptions, ParsesGoodputPercentilesAndRates) {
  std::string err;
  auto s = parse_goodput({"ttft:500", "e2el:2000.5"}, err);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->ttft_ms, 500);
  EXPECT_FALSE(s->tpot_ms);
  EXPECT_EQ(s->e2el_ms, 2000.5);
  EXPECT_FALSE(parse_goodput({"ttft:0"}, err));
  EXPECT_FALSE(parse_goodput({"latency:5"}, err));
  EXPECT_FALSE(parse_goodput({"ttft:5", "ttft:6"}, err));
  EXPECT_EQ(parse_percentiles("50,90,99.9", err), (std::vector<double>{50, 90, 99.9}));
  EXPECT_FALSE(parse_percentiles("50,x", err));
  EXPECT_TRUE(std::isinf(*parse_rate("inf", err)));
  EXPECT_EQ(parse_rate("2.5", err), 2.5);
  EXPECT_FALSE(parse_rate("0", err));
}

TEST(BenchPrompts, RandomPromptsAreSeededAndSized) {
  auto o = valid();
  o.num_prompts = 3;
  o.input_len = 50;
  o.output_len = 7;
  const auto a = random_prompts(o), b = random_prompts(o);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0].text, b[0].text);
  EXPECT_NE(a[0].text, a[1].text);
  EXPECT_EQ(std::count(a[0].text.begin(), a[0].text.end(), ' '), 49);
  EXPECT_EQ(a[0].output_len, 7);
  o.random_token_ids = true;
  o.token_min = 3;
  o.token_max = 9;
  for (const auto& p : random_prompts(o)) {
    ASSERT_EQ(p.token_ids.size(), 50u);
    EXPECT_EQ(p.estimated_input_len, 50);
    for (auto t : p.token_ids) EXPECT_TRUE(t >= 3 && t <= 9);
  }
}

TEST(BenchPrompts, DatasetCyclesAndKeepsOutputLens) {
  const std::string path = anvil::testing::scratch_path("bench_dataset.jsonl");
  {
    std::ofstream f(path);
    f << R"({"prompt": "one two", "output_len": 3})" << "\n\n"
      << R"({"messages": [{"role": "user", "content": "hi"}]})" << "\n";
  }
  std::string err;
  const auto ps = load_dataset(path, 5, 9, err);
  ASSERT_TRUE(ps) << err;
  ASSERT_EQ(ps->size(), 5u);
  EXPECT_EQ((*ps)[0].text, "one two");
  EXPECT_EQ((*ps)[0].output_len, 3);
  EXPECT_EQ((*ps)[1].messages.size(), 1u);
  EXPECT_EQ((*ps)[1].output_len, 9);
  EXPECT_EQ((*ps)[4].text, "one two");
  {
    std::ofstream f(path);
    f << R"({"prompt": 5})" << "\n";
  }
  EXPECT_FALSE(load_dataset(path, 1, 9, err));
  EXPECT_NE(err.find(":1:"), std::string::npos) << err;
  EXPECT_FALSE(load_dataset(path + ".missing", 1, 9, err));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace anvil::bench
