// Perplexity by sliding windows (model/arch/perplexity.h): the window plan scores every token once,
// and the CPU-forward result equals a direct log-softmax over each window's full logits.
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "model/arch/cpu_forward.h"
#include "model/arch/perplexity.h"
#include "tests/model/fixtures.h"

namespace {

using namespace anvil::model;
using anvil::model::testing::synth_fixture;

std::vector<std::int32_t> random_tokens(std::size_t n, std::int32_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = std::int32_t(rng() % std::uint32_t(vocab));
  return t;
}

// Logits of every position of `tokens` fed from position 0 in one step, on a fresh cache.
std::vector<float> full_logits(const llm& m, std::span<const std::int32_t> tokens) {
  const std::int64_t block = 16, n_blocks = std::int64_t(tokens.size() + block - 1) / block;
  kv_cache_storage cache(m.hp, n_blocks, block);
  std::vector<std::int32_t> table(std::size_t(n_blocks), 0);
  std::iota(table.begin(), table.end(), 0);
  const forward_seq seq{tokens, 0, table, true};
  std::vector<float> logits;
  cpu_forward(m).run(std::span(&seq, 1), cache, logits);
  return logits;
}

double log_softmax_at(const float* row, std::int64_t n, std::int32_t target) {
  double max = row[0];
  for (std::int64_t i = 1; i < n; ++i) max = std::max(max, double(row[i]));
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += std::exp(double(row[i]) - max);
  return double(row[target]) - max - std::log(sum);
}

TEST(PerplexityWindows, ScoreEveryTokenButTheFirstExactlyOnce) {
  for (const auto& [n, ctx, stride] : std::vector<std::array<std::int64_t, 3>>{
           {2, 8, 4}, {8, 8, 4}, {9, 8, 4}, {100, 16, 8}, {100, 16, 1}, {101, 16, 5}, {37, 64, 32}}) {
    const auto w = perplexity_windows(n, ctx, stride);
    std::vector<int> scored(std::size_t(n), 0);
    for (std::size_t i = 0; i < w.size(); ++i) {
      EXPECT_EQ(w[i].begin, std::int64_t(i) * stride);
      EXPECT_EQ(w[i].end, std::min(w[i].begin + ctx, n));
      EXPECT_GT(w[i].first_scored, w[i].begin) << "a window's first token has no context";
      for (std::int64_t t = w[i].first_scored; t < w[i].end; ++t) ++scored[std::size_t(t)];
    }
    EXPECT_EQ(w.back().end, n);
    if (w.size() > 1) {
      EXPECT_LT(w[w.size() - 2].end, n) << "windows stop at the first that reaches the end";
    }
    EXPECT_EQ(scored[0], 0);
    for (std::int64_t t = 1; t < n; ++t) EXPECT_EQ(scored[std::size_t(t)], 1) << "n " << n << " token " << t;
  }
}

TEST(PerplexityWindows, FirstWindowScoresFromTokenOneThenOnlyNewTokens) {
  const auto w = perplexity_windows(20, 8, 4);
  ASSERT_EQ(w.size(), 4u);  // [0,8) [4,12) [8,16) [12,20)
  EXPECT_EQ(w[0].first_scored, 1);
  EXPECT_EQ(w[1].first_scored, 8);
  EXPECT_EQ(w[2].first_scored, 12);
  EXPECT_EQ(w[3].first_scored, 16);
}

TEST(PerplexityWindows, WithoutOverlapTheFirstTokenOfEachWindowIsNotScored) {
  const auto w = perplexity_windows(20, 8, 8);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[1].first_scored, 9);
  EXPECT_EQ(w[2].first_scored, 17);
}

TEST(PerplexityWindows, RefusesBadArguments) {
  EXPECT_THROW(perplexity_windows(1, 8, 4), std::invalid_argument);
  EXPECT_THROW(perplexity_windows(10, 8, 0), std::invalid_argument);
  EXPECT_THROW(perplexity_windows(10, 8, 9), std::invalid_argument);
  EXPECT_THROW(perplexity_windows(10, 1, 1), std::invalid_argument);
}

TEST(TokenNll, IsMinusLogSoftmax) {
  const std::vector<float> logits = {1.f, 2.f, 3.f, 1000.f, -5.f};
  const double lse = 1000.0 + std::log(1.0 + std::exp(-997.0) + std::exp(-998.0) + std::exp(-999.0) + std::exp(-1005.0));
  EXPECT_NEAR(token_nll(logits, 2), lse - 3.0, 1e-9);
  EXPECT_NEAR(token_nll(logits, 3), lse - 1000.0, 1e-12);
}

TEST(Perplexity, EqualsLogSoftmaxOfEachWindowsFullLogits) {
  const llm m = load_llm(gguf_file::open(synth_fixture("tiny", synth_mix::f32)));
  const auto tokens = random_tokens(100, std::int32_t(m.hp.n_vocab), 7);
  const std::int64_t ctx = 32, stride = 12, v = m.hp.n_vocab;
  double want = 0;
  std::int64_t n = 0;
  for (const ppl_window& w : perplexity_windows(100, ctx, stride)) {
    const auto win = std::span(tokens).subspan(std::size_t(w.begin), std::size_t(w.end - w.begin));
    const std::vector<float> logits = full_logits(m, win);
    for (std::int64_t i = w.first_scored; i < w.end; ++i, ++n)
      want -= log_softmax_at(logits.data() + (i - 1 - w.begin) * v, v, tokens[std::size_t(i)]);
  }
  const perplexity_result r = perplexity(m, tokens, {.ctx = ctx, .stride = stride});
  EXPECT_EQ(r.n_scored, 99);
  EXPECT_EQ(n, 99);
  EXPECT_EQ(r.n_windows, std::int64_t(perplexity_windows(100, ctx, stride).size()));
  EXPECT_NEAR(r.nll_sum, want, 1e-9 * std::abs(want));
  EXPECT_NEAR(r.perplexity(), std::exp(want / 99), 1e-9 * std::exp(want / 99));
  double sum = 0;
  for (double x : r.window_nll) sum += x;
  EXPECT_NEAR(sum, r.nll_sum, 1e-9 * std::abs(want));
}

TEST(Perplexity, OneWindowWhenTheTextFitsIsTheWholeSequencesNll) {
  const llm m = load_llm(gguf_file::open(synth_fixture("tiny", synth_mix::f32)));
  const auto tokens = random_tokens(40, std::int32_t(m.hp.n_vocab), 3);
  const std::vector<float> logits = full_logits(m, tokens);
  double want = 0;
  for (std::size_t i = 1; i < tokens.size(); ++i) want -= log_softmax_at(logits.data() + (i - 1) * m.hp.n_vocab, m.hp.n_vocab, tokens[i]);
  const perplexity_result r = perplexity(m, tokens, {.ctx = 64});
  EXPECT_EQ(r.n_windows, 1);
  EXPECT_NEAR(r.nll_sum, want, 1e-9 * want);
}

TEST(Perplexity, RunningAWindowInChunksChangesNothing) {
  const llm m = load_llm(gguf_file::open(synth_fixture("tiny", synth_mix::q8_0)));
  const auto tokens = random_tokens(90, std::int32_t(m.hp.n_vocab), 11);
  const perplexity_result whole = perplexity(m, tokens, {.ctx = 40, .stride = 20});
  const perplexity_result chunked = perplexity(m, tokens, {.ctx = 40, .stride = 20, .batch = 7});
  EXPECT_EQ(whole.n_scored, chunked.n_scored);
  EXPECT_NEAR(whole.nll_sum, chunked.nll_sum, 1e-4 * whole.nll_sum);
}

TEST(Perplexity, ReportsProgressPerWindow) {
  const llm m = load_llm(gguf_file::open(synth_fixture("tiny", synth_mix::f32)));
  const auto tokens = random_tokens(50, std::int32_t(m.hp.n_vocab), 5);
  std::vector<std::int64_t> seen;
  perplexity(m, tokens, {.ctx = 20, .stride = 10}, [&](std::int64_t done, std::int64_t total) {
    EXPECT_EQ(total, 4);
    seen.push_back(done);
  });
  EXPECT_EQ(seen, (std::vector<std::int64_t>{1, 2, 3, 4}));
}

TEST(Perplexity, RefusesAWindowLongerThanTheModelsContext) {
  const llm m = load_llm(gguf_file::open(synth_fixture("tiny", synth_mix::f32)));
  const auto tokens = random_tokens(10, std::int32_t(m.hp.n_vocab), 1);
  try {
    perplexity(m, tokens, {.ctx = m.hp.n_ctx_train + 1});
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("longer than the model's context"), std::string::npos) << e.what();
  }
  EXPECT_THROW(perplexity(m, std::span(tokens).first(1), {.ctx = 8}), std::invalid_argument);
}

}  // namespace
