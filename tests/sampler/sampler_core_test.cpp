// sampler_core without Asio: choose() on hand-built and reference-built candidates (greedy,
// logprobs, top_logprobs, the tail entry, contract checks) and the per-request table.
#include "sampler/sampler_core.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/candidates.h"
#include "tests/random_data.h"

namespace {

using anvil::gpu_worker::logit_params;
using anvil::gpu_worker::seq_output;
using anvil::kernels::candidates_ref;
using namespace anvil::sampler;

using anvil::test_support::randn;

sampling_params sampled(float temperature = 1.f) {
  sampling_params p;
  p.temperature = temperature;
  return p;
}

// A distribution over 4 tokens with known probabilities, K = 2: top {3: 0.5, 1: 0.3}, tail 0.2
// held by token 0 (0.15) and token 2 (0.05); the worker drew token 2.
seq_output four_tokens() {
  seq_output o;
  o.top = {{3, std::log(0.5f)}, {1, std::log(0.3f)}};
  o.log_normalizer = 0.f;
  o.tail_mass = 0.2f;
  o.tail = {2, std::log(0.05f)};
  return o;
}

// Processed log-softmax in double, the definition logprobs must match.
std::vector<double> log_softmax(const std::vector<float>& l) {
  const double m = *std::max_element(l.begin(), l.end());
  double z = 0;
  for (float x : l) z += std::exp(double(x) - m);
  std::vector<double> out(l.size());
  for (std::size_t i = 0; i < l.size(); ++i) out[i] = double(l[i]) - m - std::log(z);
  return out;
}

TEST(SamplerChoose, GreedyTakesTheFirstCandidateWithoutADraw) {
  std::mt19937_64 rng(3), untouched(3);
  const choice c = choose(four_tokens(), sampled(0.f), rng, 0);
  EXPECT_EQ(c.token, 3);
  EXPECT_FALSE(c.from_tail);
  EXPECT_NEAR(c.logprob, std::log(0.5), 1e-6);
  EXPECT_EQ(rng(), untouched());
}

TEST(SamplerChoose, GreedyIsTheArgmaxOfTheProcessedLogits) {
  for (unsigned seed = 0; seed < 20; ++seed) {
    const std::vector<float> raw = randn(200, seed, 2.f);
    logit_params lp;
    lp.top_k = 4;
    lp.logit_bias = {{int(seed), 3.f}};
    lp.token_counts = {{int(seed) + 1, 2}, {int(seed) + 7, 1}};
    lp.repetition_penalty = 1.3f;
    lp.frequency_penalty = 0.4f;
    sampling_params sp;
    sp.logit_bias = lp.logit_bias;
    sp.repetition_penalty = lp.repetition_penalty;
    sp.frequency_penalty = lp.frequency_penalty;
    const std::vector<std::int32_t> history = {int(seed) + 1, int(seed) + 7, int(seed) + 1};
    std::mt19937_64 a(1), b(1);
    EXPECT_EQ(choose(candidates_ref(raw, lp, 0), sp, a, 0).token, sample_token(raw, sp, history, b)) << seed;
  }
}

TEST(SamplerChoose, LogprobsAreTheLogSoftmaxOfTheProcessedLogits) {
  const std::vector<float> raw = randn(100, 11, 2.f);
  logit_params lp;
  lp.top_k = 10;
  lp.temperature = 0.7f;
  std::vector<float> processed = raw;
  for (float& x : processed) x /= 0.7f;
  const std::vector<double> ls = log_softmax(processed);
  std::mt19937_64 rng(5);
  for (std::int64_t pos = 0; pos < 300; ++pos) {
    const choice c = choose(candidates_ref(raw, lp, pos), sampled(0.7f), rng, 5);
    EXPECT_NEAR(c.logprob, ls[std::size_t(c.token)], 1e-5) << "token " << c.token << (c.from_tail ? " (tail)" : "");
  }
}

TEST(SamplerChoose, TopLogprobsAreTheMostLikelyTokensInOrder) {
  const std::vector<float> raw = {0.5f, 2.f, -1.f, 2.f, 1.f, 0.f};
  logit_params lp;
  lp.top_k = 4;
  const std::vector<double> ls = log_softmax(raw);
  std::mt19937_64 rng(1);
  const choice c = choose(candidates_ref(raw, lp, 0), sampled(), rng, 3);
  ASSERT_EQ(c.top_logprobs.size(), 3u);
  const std::int32_t expected[] = {1, 3, 4};  // 1 and 3 tie: the lower id first
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(c.top_logprobs[i].token, expected[i]);
    EXPECT_NEAR(c.top_logprobs[i].logprob, ls[std::size_t(expected[i])], 1e-6);
  }
  EXPECT_TRUE(choose(candidates_ref(raw, lp, 0), sampled(), rng, 0).top_logprobs.empty());
  // More than K asked: the K candidates are all there is.
  EXPECT_EQ(choose(candidates_ref(raw, lp, 0), sampled(), rng, 20).top_logprobs.size(), 4u);
}

TEST(SamplerChoose, TheTailTokenIsChosenWithTheTailMassAndReportsItsLogprob) {
  std::mt19937_64 rng(9);
  int tail = 0;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) {
    const choice c = choose(four_tokens(), sampled(), rng, 0);
    if (c.from_tail) {
      ++tail;
      EXPECT_EQ(c.token, 2);
      EXPECT_NEAR(c.logprob, std::log(0.05), 1e-6);
    }
  }
  EXPECT_NEAR(tail / double(draws), 0.2, 0.015);
}

TEST(SamplerChoose, CutsInsideTheCandidatesNeverReachTheTail) {
  auto support = [](sampling_params p) {
    std::mt19937_64 rng(4);
    std::vector<int> seen(4, 0);
    for (int i = 0; i < 4000; ++i) seen[std::size_t(choose(four_tokens(), p, rng, 0).token)] = 1;
    return std::accumulate(seen.begin(), seen.end(), 0);
  };
  sampling_params k = sampled();
  k.top_k = 1;
  EXPECT_EQ(support(k), 1);
  sampling_params tp = sampled();
  tp.top_p = 0.75f;  // 0.5 + 0.3 reaches it
  EXPECT_EQ(support(tp), 2);
  sampling_params mp = sampled();
  mp.min_p = 0.7f;  // floor 0.35: only token 3
  EXPECT_EQ(support(mp), 1);
  // The documented over-inclusion: the exact top_p = 0.9 cut keeps tokens 3, 1, 0 (0.95), but
  // past the candidates the whole tail takes part, standing for the worker's draw (token 2).
  sampling_params past = sampled();
  past.top_p = 0.9f;
  EXPECT_EQ(support(past), 3);
}

TEST(SamplerChoose, ChecksTheStepContract) {
  EXPECT_FALSE(check_candidates(four_tokens()).has_value());
  auto broken = [](auto mutate) {
    seq_output o = four_tokens();
    mutate(o);
    return check_candidates(o).value_or("");
  };
  EXPECT_NE(broken([](auto& o) { o.top.clear(); }), "");
  EXPECT_NE(broken([](auto& o) { std::swap(o.top[0], o.top[1]); }).find("sorted"), std::string::npos);
  EXPECT_NE(broken([](auto& o) { o.top = {{5, 1.f}, {4, 1.f}}; }).find("sorted"), std::string::npos);
  EXPECT_NE(broken([](auto& o) { o.top[1].token = -2; }), "");
  EXPECT_NE(broken([](auto& o) { o.top[1].logit = NAN; }), "");
  EXPECT_NE(broken([](auto& o) { o.log_normalizer = INFINITY; }).find("log_normalizer"), std::string::npos);
  EXPECT_NE(broken([](auto& o) { o.tail_mass = 1.5f; }).find("tail_mass"), std::string::npos);
  EXPECT_NE(broken([](auto& o) { o.tail.token = -1; }).find("tail token"), std::string::npos);
  EXPECT_EQ(broken([](auto& o) { o.tail_mass = 0.f; o.tail.token = -1; }), "");
  std::mt19937_64 rng(1);
  seq_output empty;
  EXPECT_THROW(choose(empty, sampled(), rng, 0), std::invalid_argument);
  EXPECT_THROW(choose(four_tokens(), sampled(), rng, 21), std::invalid_argument);
  EXPECT_THROW(choose(four_tokens(), sampled(), rng, -1), std::invalid_argument);
}

TEST(SamplerCore, OpensSamplesAndClosesRequests) {
  sampler_core core;
  EXPECT_FALSE(core.open(7, sampled()));
  EXPECT_EQ(core.open(7, sampled()), sampler_errc::already_open);
  sampling_params bad = sampled();
  bad.top_p = 0.f;
  EXPECT_EQ(core.open(8, bad), sampler_errc::invalid_params);
  EXPECT_EQ(core.open_requests(), 1u);

  const sample_outcome ok = core.sample({7, four_tokens(), 2});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->top_logprobs.size(), 2u);
  const sample_outcome unknown = core.sample({8, four_tokens(), 0});
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error(), sampler_errc::unknown_request);
  EXPECT_EQ(core.sample({7, four_tokens(), 21}).error(), sampler_errc::invalid_candidates);
  EXPECT_EQ(core.sample({7, seq_output{}, 0}).error(), sampler_errc::invalid_candidates);

  EXPECT_FALSE(core.close(7));
  EXPECT_EQ(core.close(7), sampler_errc::unknown_request);
  EXPECT_EQ(core.sample({7, four_tokens(), 0}).error(), sampler_errc::unknown_request);
  EXPECT_EQ(core.open_requests(), 0u);
}

TEST(SamplerCore, AFailedEntryCostsItsRequestNoDraw) {
  sampling_params p = sampled();
  p.seed = 2024;
  sampler_core with_failures, clean;
  ASSERT_FALSE(with_failures.open(1, p));
  ASSERT_FALSE(clean.open(1, p));
  for (int i = 0; i < 200; ++i) {
    if (i % 3 == 0) {
      ASSERT_FALSE(with_failures.sample({1, seq_output{}, 0}));
    }
    const sample_outcome a = with_failures.sample({1, four_tokens(), 0});
    const sample_outcome b = clean.sample({1, four_tokens(), 0});
    ASSERT_TRUE(a && b);
    ASSERT_EQ(a->token, b->token) << "draw " << i;
  }
}

TEST(SamplerCore, ABatchAnswersEveryEntryInOrder) {
  sampler_core core;
  ASSERT_FALSE(core.open(1, sampled(0.f)));
  ASSERT_FALSE(core.open(2, sampled(0.f)));
  seq_output other = four_tokens();
  other.top = {{0, 1.f}, {2, 0.f}};
  const std::vector<sample_request> batch = {{2, other, 0}, {9, other, 0}, {1, four_tokens(), 1}};
  const std::vector<sample_outcome> out = core.sample(batch);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0]->token, 0);
  EXPECT_EQ(out[1].error(), sampler_errc::unknown_request);
  EXPECT_EQ(out[2]->token, 3);
  EXPECT_EQ(out[2]->top_logprobs.size(), 1u);
}

}  // namespace
