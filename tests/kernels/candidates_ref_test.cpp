// The logits → candidates reference (kernels/candidates.h) is the definition the GPU kernel will be
// tested against, so each rule is pinned here: bias, each penalty and their order, temperature,
// the top-K order and its ties, the log-normaliser's stability, the tail mass and the tail draw.
#include "kernels/candidates.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "tests/chi_square.h"
#include "tests/random_data.h"

namespace {

using anvil::gpu_worker::logit_params;
using anvil::gpu_worker::seq_output;
using anvil::kernels::candidates_ref;
using anvil::kernels::tail_uniform;

logit_params top(std::int32_t k) {
  logit_params p;
  p.top_k = k;
  return p;
}

// The processed logit of `token`, as the output reports it when it is a candidate.
float logit_of(const seq_output& o, std::int32_t token) {
  for (const auto& c : o.top) {
    if (c.token == token) return c.logit;
  }
  ADD_FAILURE() << "token " << token << " is not a candidate";
  return NAN;
}

using anvil::test_support::randn;

TEST(CandidatesRef, AddsTheLogitBiasToItsTokens) {
  logit_params p = top(4);
  p.logit_bias = {{2, 1.5f}, {0, -1.f}, {2, 0.25f}};  // repeated ids add up
  const seq_output o = candidates_ref(std::vector<float>{0.f, 0.f, 0.f, 0.5f}, p, 0);
  EXPECT_EQ(o.top[0].token, 2);
  EXPECT_FLOAT_EQ(o.top[0].logit, 1.75f);
  EXPECT_FLOAT_EQ(logit_of(o, 0), -1.f);
  EXPECT_FLOAT_EQ(logit_of(o, 3), 0.5f);
}

TEST(CandidatesRef, RejectsCallerBugsWithInvalidArgument) {
  const std::vector<float> l = {0.f, 1.f, 2.f};
  auto with = [](auto mutate) {
    logit_params p = top(2);
    mutate(p);
    return p;
  };
  EXPECT_THROW(candidates_ref(l, with([](auto& p) { p.logit_bias = {{3, 1.f}}; }), 0), std::invalid_argument);
  EXPECT_THROW(candidates_ref(l, with([](auto& p) { p.logit_bias = {{-1, 1.f}}; }), 0), std::invalid_argument);
  EXPECT_THROW(candidates_ref(l, with([](auto& p) { p.token_counts = {{3, 1}}; }), 0), std::invalid_argument);
  EXPECT_THROW(candidates_ref(l, with([](auto& p) { p.token_counts = {{1, 1}, {1, 2}}; }), 0), std::invalid_argument);
  EXPECT_THROW(candidates_ref(l, with([](auto& p) { p.token_counts = {{1, -1}}; }), 0), std::invalid_argument);
  EXPECT_THROW(candidates_ref(l, with([](auto& p) { p.top_k = 0; }), 0), std::invalid_argument);
  EXPECT_THROW(candidates_ref(std::vector<float>{}, top(1), 0), std::invalid_argument);
  EXPECT_THROW(candidates_ref(std::vector<float>{0.f, NAN}, top(1), 0), std::invalid_argument);
  EXPECT_THROW(candidates_ref(std::vector<float>{0.f, INFINITY}, top(1), 0), std::invalid_argument);
  EXPECT_THROW(candidates_ref(std::vector<float>{-INFINITY, -INFINITY}, top(1), 0), std::invalid_argument);
  EXPECT_NO_THROW(candidates_ref(l, with([](auto& p) { p.logit_bias = {{2, 1.f}}; }), 0));
}

TEST(CandidatesRef, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  logit_params p = top(4);
  p.repetition_penalty = 2.f;
  p.token_counts = {{0, 1}, {1, 5}, {3, 0}};  // a zero count is not a seen token
  const seq_output o = candidates_ref(std::vector<float>{2.f, -1.f, 3.f, 4.f}, p, 0);
  EXPECT_FLOAT_EQ(logit_of(o, 0), 1.f);
  EXPECT_FLOAT_EQ(logit_of(o, 1), -2.f);
  EXPECT_FLOAT_EQ(logit_of(o, 2), 3.f);
  EXPECT_FLOAT_EQ(logit_of(o, 3), 4.f);
}

TEST(CandidatesRef, PresencePenaltyIsSubtractedOnceWhateverTheCount) {
  logit_params p = top(3);
  p.presence_penalty = 0.5f;
  p.token_counts = {{0, 1}, {1, 4}};
  const seq_output o = candidates_ref(std::vector<float>{2.f, 2.f, 2.f}, p, 0);
  EXPECT_FLOAT_EQ(logit_of(o, 0), 1.5f);
  EXPECT_FLOAT_EQ(logit_of(o, 1), 1.5f);
  EXPECT_FLOAT_EQ(logit_of(o, 2), 2.f);
}

TEST(CandidatesRef, FrequencyPenaltyIsSubtractedPerOccurrence) {
  logit_params p = top(3);
  p.frequency_penalty = 0.25f;
  p.token_counts = {{0, 1}, {1, 4}};
  const seq_output o = candidates_ref(std::vector<float>{2.f, 2.f, 2.f}, p, 0);
  EXPECT_FLOAT_EQ(logit_of(o, 0), 1.75f);
  EXPECT_FLOAT_EQ(logit_of(o, 1), 1.f);
  EXPECT_FLOAT_EQ(logit_of(o, 2), 2.f);
}

TEST(CandidatesRef, AppliesBiasThenPenaltiesThenTemperature) {
  logit_params p = top(2);
  p.logit_bias = {{0, 1.f}};
  p.token_counts = {{0, 1}};
  p.repetition_penalty = 2.f;
  p.presence_penalty = 0.5f;
  p.temperature = 0.25f;
  // ((1 + 1) / 2 - 0.5) / 0.25 = 2; any other order gives something else.
  const seq_output o = candidates_ref(std::vector<float>{1.f, 0.f}, p, 0);
  EXPECT_FLOAT_EQ(logit_of(o, 0), 2.f);
  EXPECT_FLOAT_EQ(logit_of(o, 1), 0.f);
}

TEST(CandidatesRef, TemperatureDividesAndNonPositiveLeavesTheLogitsAlone) {
  const std::vector<float> l = {3.f, -1.f};
  for (float t : {0.f, -1.f}) {
    logit_params p = top(2);
    p.temperature = t;
    const seq_output o = candidates_ref(l, p, 0);
    EXPECT_FLOAT_EQ(logit_of(o, 0), 3.f) << "t=" << t;
    EXPECT_FLOAT_EQ(logit_of(o, 1), -1.f) << "t=" << t;
  }
  logit_params p = top(2);
  p.temperature = 2.f;
  const seq_output o = candidates_ref(l, p, 0);
  EXPECT_FLOAT_EQ(logit_of(o, 0), 1.5f);
  EXPECT_FLOAT_EQ(logit_of(o, 1), -0.5f);
  EXPECT_NEAR(o.log_normalizer, std::log(std::exp(1.5) + std::exp(-0.5)), 1e-6);
}

TEST(CandidatesRef, TopKIsSortedByLogitDescendingWithTiesToTheLowerId) {
  const std::vector<float> l = {1.f, 3.f, 3.f, 2.f, 3.f, 2.f};
  const seq_output o = candidates_ref(l, top(4), 0);
  ASSERT_EQ(o.top.size(), 4u);
  EXPECT_EQ(o.top[0].token, 1);
  EXPECT_EQ(o.top[1].token, 2);
  EXPECT_EQ(o.top[2].token, 4);
  EXPECT_EQ(o.top[3].token, 3);  // 3 before 5: equal logits
  EXPECT_FLOAT_EQ(o.top[3].logit, 2.f);
  EXPECT_EQ(o.seq_id, 0u);  // the caller's to fill
}

TEST(CandidatesRef, KCoveringTheVocabularyLeavesNoTail) {
  const std::vector<float> l = randn(7, 1);
  for (std::int32_t k : {7, 8, 1000}) {
    logit_params p = top(k);
    p.seed = 5;
    const seq_output o = candidates_ref(l, p, 3);
    EXPECT_EQ(o.top.size(), 7u) << "k=" << k;
    EXPECT_EQ(o.tail_mass, 0.f) << "k=" << k;
    EXPECT_EQ(o.tail.token, -1) << "k=" << k;
    std::set<std::int32_t> ids;
    for (const auto& c : o.top) ids.insert(c.token);
    EXPECT_EQ(ids.size(), 7u);
  }
}

TEST(CandidatesRef, LogNormalizerAndTailMassMatchTheSoftmax) {
  const std::vector<float> l = randn(300, 2, 3.f);
  const seq_output o = candidates_ref(l, top(20), 0);
  long double z = 0;
  for (float x : l) z += std::exp((long double)x);
  EXPECT_NEAR(o.log_normalizer, double(std::log(z)), 1e-5);
  double top_p = 0;
  for (const auto& c : o.top) top_p += std::exp(double(c.logit) - double(std::log(z)));
  EXPECT_NEAR(o.tail_mass, 1.0 - top_p, 1e-6);
  EXPECT_GT(o.tail_mass, 0.f);
  // The top really is the top: nothing outside it beats the last candidate.
  std::vector<float> sorted = l;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  EXPECT_EQ(o.top.back().logit, sorted[19]);
}

TEST(CandidatesRef, StaysFiniteAndShiftInvariantWithHugeLogits) {
  const std::vector<float> base = randn(100, 3);
  std::vector<float> huge = base;
  for (float& x : huge) x += 1e4f;
  const seq_output a = candidates_ref(base, top(10), 0);
  const seq_output b = candidates_ref(huge, top(10), 0);
  ASSERT_TRUE(std::isfinite(b.log_normalizer));
  // Float logits near 1e4 are spaced ~1e-3 apart, so the shift is exact only to that.
  EXPECT_NEAR(b.log_normalizer - 1e4f, a.log_normalizer, 2e-3);
  EXPECT_NEAR(b.tail_mass, a.tail_mass, 5e-3);
  for (std::size_t i = 0; i < a.top.size(); ++i) EXPECT_EQ(b.top[i].token, a.top[i].token);
  // All equal and huge: uniform, log_normalizer = 1e4 + log(n).
  const seq_output u = candidates_ref(std::vector<float>(64, 1e4f), top(16), 0);
  EXPECT_NEAR(u.log_normalizer, 1e4 + std::log(64.0), 1e-3);
  EXPECT_NEAR(u.tail_mass, 0.75, 1e-6);
  // Huge negative ones as well.
  const seq_output n = candidates_ref(std::vector<float>(64, -1e4f), top(16), 0);
  EXPECT_NEAR(n.log_normalizer, -1e4 + std::log(64.0), 1e-3);
}

TEST(CandidatesRef, MinusInfinityLogitsWeighNothing) {
  const float ninf = -INFINITY;
  // Three live tokens; with K = 2 only token 4 is left in the tail.
  const std::vector<float> l = {ninf, 1.f, ninf, 0.f, -1.f, ninf};
  const seq_output o = candidates_ref(l, top(2), 0);
  EXPECT_NEAR(o.log_normalizer, std::log(std::exp(1.0) + 1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(o.tail_mass, std::exp(-1.0) / (std::exp(1.0) + 1.0 + std::exp(-1.0)), 1e-6);
  for (std::int64_t pos = 0; pos < 50; ++pos) EXPECT_EQ(candidates_ref(l, top(2), pos).tail.token, 4);
  // Only masked tokens outside the top: no tail.
  const seq_output none = candidates_ref(l, top(3), 0);
  EXPECT_EQ(none.tail_mass, 0.f);
  EXPECT_EQ(none.tail.token, -1);
  // K past the live tokens: masked ones fill the end of the top, ties by id.
  const seq_output all = candidates_ref(l, top(5), 0);
  EXPECT_EQ(all.top[3].token, 0);
  EXPECT_EQ(all.top[4].token, 2);
  EXPECT_EQ(all.top[4].logit, ninf);
}

TEST(CandidatesRef, TailUniformIsSplitmix64OfSeedAndPosition) {
  // splitmix64's first output from state 0 is 0xE220A8397B1DCDAF; its top 53 bits make the double.
  EXPECT_EQ(tail_uniform(0, 0), double(0xE220A8397B1DCDAFull >> 11) * 0x1.0p-53);
  double sum = 0;
  for (std::int64_t pos = 0; pos < 10000; ++pos) {
    const double u = tail_uniform(42, pos);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.01);
  EXPECT_NE(tail_uniform(1, 7), tail_uniform(2, 7));
  EXPECT_NE(tail_uniform(1, 7), tail_uniform(1, 8));
}

TEST(CandidatesRef, TailDrawIsOutsideTheTopAndDeterministicPerSeedAndPosition) {
  const std::vector<float> l = randn(50, 4);
  logit_params p = top(8);
  p.seed = 1234;
  std::set<std::int32_t> drawn;
  int differs_by_seed = 0;
  for (std::int64_t pos = 0; pos < 500; ++pos) {
    const seq_output o = candidates_ref(l, p, pos);
    ASSERT_GE(o.tail.token, 0);
    for (const auto& c : o.top) ASSERT_NE(c.token, o.tail.token) << "pos=" << pos;
    EXPECT_EQ(o.tail.logit, l[std::size_t(o.tail.token)]);  // its processed logit (no processing here)
    const seq_output again = candidates_ref(l, p, pos);
    EXPECT_EQ(again.tail.token, o.tail.token);
    logit_params other = p;
    other.seed = 99;
    differs_by_seed += candidates_ref(l, other, pos).tail.token != o.tail.token;
    drawn.insert(o.tail.token);
  }
  EXPECT_GT(drawn.size(), 20u);   // it moves with the position
  EXPECT_GT(differs_by_seed, 250);  // and with the seed
}

TEST(CandidatesRef, TailDrawIsTheFirstIdWhoseCumulativeWeightExceedsTheUniform) {
  // The rule the GPU kernel's prefix sum follows, restated: scan the tail in ascending id order.
  const std::vector<float> l = randn(40, 6, 2.f);
  logit_params p = top(5);
  p.seed = 31337;
  for (std::int64_t pos = 0; pos < 300; ++pos) {
    const seq_output o = candidates_ref(l, p, pos);
    std::vector<bool> in_top(l.size(), false);
    for (const auto& c : o.top) in_top[std::size_t(c.token)] = true;
    const float m = *std::max_element(l.begin(), l.end());
    long double total = 0;
    for (std::size_t t = 0; t < l.size(); ++t) total += in_top[t] ? 0 : std::exp((long double)l[t] - m);
    const long double target = tail_uniform(p.seed, pos) * total;
    long double cum = 0;
    std::int32_t expected = -1;
    for (std::size_t t = 0; t < l.size() && expected < 0; ++t) {
      if (in_top[t]) continue;
      cum += std::exp((long double)l[t] - m);
      if (cum > target) expected = std::int32_t(t);
    }
    EXPECT_EQ(o.tail.token, expected) << "pos=" << pos;
  }
}

TEST(CandidatesRef, TailDrawsFollowTheRestrictedDistribution) {
  const std::vector<float> l = randn(50, 5);
  logit_params p = top(8);
  p.temperature = 0.7f;
  p.seed = 77;
  const seq_output o0 = candidates_ref(l, p, 0);
  std::vector<bool> in_top(50, false);
  for (const auto& c : o0.top) in_top[std::size_t(c.token)] = true;
  // q(t) ∝ exp(l_t / T) over the tokens outside the top.
  std::vector<double> q(50, 0.0);
  double z = 0;
  for (std::size_t t = 0; t < 50; ++t) z += q[t] = in_top[t] ? 0.0 : std::exp(double(l[t]) / 0.7);
  for (double& x : q) x /= z;

  const int draws = 40000;
  std::vector<std::int64_t> counts(50, 0);
  for (std::int64_t pos = 0; pos < draws; ++pos) counts[std::size_t(candidates_ref(l, p, pos).tail.token)]++;
  const auto r = anvil::testing::chi_square(counts, q);
  EXPECT_LT(r.statistic, r.bound) << "dof " << r.dof;
  // The test has power: the same draws do not look uniform over the tail.
  std::vector<double> uniform(50, 0.0);
  for (std::size_t t = 0; t < 50; ++t) uniform[t] = in_top[t] ? 0.0 : 1.0 / 42;
  EXPECT_GT(anvil::testing::chi_square(counts, uniform).statistic, 10 * r.bound);
}

}  // namespace
