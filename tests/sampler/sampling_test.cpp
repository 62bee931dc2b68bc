#include "sampler/sampling.h"

#include <cmath>
#include <map>
#include <vector>

#include <gtest/gtest.h>

namespace {

using anvil::sampler::sample_token;
using anvil::sampler::sampling_params;
using anvil::sampler::validate;

TEST(Sampling, GreedyPicksTheLargestLogitAndBreaksTiesByLowestId) {
  std::mt19937_64 rng(1);
  const std::vector<float> logits = {0.1f, 2.f, -1.f, 2.f};
  EXPECT_EQ(sample_token(logits, {}, {}, rng), 1);
}

TEST(Sampling, GreedyDoesNotAdvanceTheGenerator) {
  std::mt19937_64 a(5), b(5);
  sample_token(std::vector<float>{1.f, 0.f}, {}, {}, a);
  EXPECT_EQ(a(), b());
}

TEST(Sampling, SameSeedGivesTheSameChoices) {
  sampling_params p;
  p.temperature = 1.f;
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = std::sin(float(i));
  std::mt19937_64 a(42), b(42);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sample_token(logits, p, {}, a), sample_token(logits, p, {}, b));
}

TEST(Sampling, FollowsTheSoftmaxDistribution) {
  sampling_params p;
  p.temperature = 1.f;
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  std::mt19937_64 rng(7);
  std::map<int, int> n;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) n[sample_token(logits, p, {}, rng)]++;
  EXPECT_NEAR(n[0] / double(draws), 0.5, 0.02);
  EXPECT_NEAR(n[1] / double(draws), 0.3, 0.02);
  EXPECT_NEAR(n[2] / double(draws), 0.2, 0.02);
}

TEST(Sampling, TopKTopPAndMinPCutTheTail) {
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  auto support = [&](sampling_params p) {
    p.temperature = 1.f;
    std::mt19937_64 rng(3);
    std::map<int, int> n;
    for (int i = 0; i < 4000; ++i) n[sample_token(logits, p, {}, rng)]++;
    return n.size();
  };
  sampling_params k;
  k.top_k = 2;
  EXPECT_EQ(support(k), 2u);
  sampling_params tp;
  tp.top_p = 0.65f;  // 0.4 + 0.3 reaches it
  EXPECT_EQ(support(tp), 2u);
  sampling_params mp;
  mp.min_p = 0.4f;  // keeps p >= 0.16
  EXPECT_EQ(support(mp), 3u);
  EXPECT_EQ(support({}), 4u);
}

TEST(Sampling, PenaltiesLowerSeenTokens) {
  std::mt19937_64 rng(1);
  const std::vector<float> logits = {2.f, 1.9f, -1.f};
  const std::vector<std::int32_t> history = {0, 0};
  sampling_params rep;
  rep.repetition_penalty = 1.5f;  // 2 / 1.5 < 1.9
  EXPECT_EQ(sample_token(logits, rep, history, rng), 1);
  sampling_params freq;
  freq.frequency_penalty = 0.1f;  // 2 - 0.2 < 1.9
  EXPECT_EQ(sample_token(logits, freq, history, rng), 1);
  sampling_params pres;
  pres.presence_penalty = 0.05f;  // 2 - 0.05 > 1.9
  EXPECT_EQ(sample_token(logits, pres, history, rng), 0);
}

TEST(Sampling, ValidatesRanges) {
  EXPECT_FALSE(validate({}).has_value());
  auto bad = [](auto mutate) {
    sampling_params p;
    mutate(p);
    return validate(p).value_or("");
  };
  EXPECT_NE(bad([](auto& p) { p.top_p = 0.f; }).find("top_p"), std::string::npos);
  EXPECT_NE(bad([](auto& p) { p.top_p = 1.5f; }).find("top_p"), std::string::npos);
  EXPECT_NE(bad([](auto& p) { p.temperature = -1.f; }).find("temperature"), std::string::npos);
  EXPECT_NE(bad([](auto& p) { p.temperature = NAN; }).find("temperature"), std::string::npos);
  EXPECT_NE(bad([](auto& p) { p.top_k = -1; }).find("top_k"), std::string::npos);
  EXPECT_NE(bad([](auto& p) { p.min_p = 1.f; }).find("min_p"), std::string::npos);
  EXPECT_NE(bad([](auto& p) { p.repetition_penalty = 0.f; }).find("repetition_penalty"), std::string::npos);
  EXPECT_NE(bad([](auto& p) { p.presence_penalty = 3.f; }).find("presence_penalty"), std::string::npos);
}

TEST(Sampling, ValidatesLogprobsAndLogitBias) {
  auto bad = [](auto mutate, std::int64_t vocab = 0) {
    sampling_params p;
    mutate(p);
    return validate(p, vocab).value_or("");
  };
  EXPECT_EQ(bad([](auto& p) { p.logprobs = 20; }), "");
  EXPECT_NE(bad([](auto& p) { p.logprobs = 21; }).find("logprobs"), std::string::npos);
  EXPECT_NE(bad([](auto& p) { p.logprobs = -1; }).find("logprobs"), std::string::npos);
  EXPECT_EQ(bad([](auto& p) { p.logit_bias = {{0, -100.f}, {9, 100.f}}; }, 10), "");
  EXPECT_NE(bad([](auto& p) { p.logit_bias = {{0, 100.5f}}; }).find("logit_bias"), std::string::npos);
  EXPECT_NE(bad([](auto& p) { p.logit_bias = {{0, NAN}}; }).find("logit_bias"), std::string::npos);
  EXPECT_NE(bad([](auto& p) { p.logit_bias = {{-1, 1.f}}; }).find("logit_bias token -1"), std::string::npos);
  EXPECT_NE(bad([](auto& p) { p.logit_bias = {{10, 1.f}}; }, 10).find("logit_bias token 10"), std::string::npos);
  EXPECT_EQ(bad([](auto& p) { p.logit_bias = {{10, 1.f}}; }), "");  // vocabulary unknown: only the sign is checked
}

TEST(Sampling, LogitBiasComesBeforeThePenalties) {
  std::mt19937_64 rng(1);
  const std::vector<float> logits = {1.f, 1.5f};
  const std::vector<std::int32_t> history = {0};
  sampling_params p;
  p.logit_bias = {{0, 1.f}};       // token 0: 1 + 1 = 2
  p.repetition_penalty = 2.f;      // then 2 / 2 = 1 < 1.5; penalising first gives 0.5 + 1 = 1.5
  EXPECT_EQ(sample_token(logits, p, history, rng), 1);
  p.repetition_penalty = 1.f;
  EXPECT_EQ(sample_token(logits, p, history, rng), 0);
  p.logit_bias = {{5, 10.f}};      // outside the vocabulary: skipped
  EXPECT_EQ(sample_token(logits, p, history, rng), 1);
}

}  // namespace
