// The class of "one request's sampling numbers break the step": thousands of parameter sets from
// the accepted ranges (edges and subnormals included, tests/sampler/edge_params.h) over raw logits
// of any finite scale, through the worker's reference processing (candidates_ref), the sampler
// core and sample_token. Every set must give finite processed logits, a finite log-normaliser,
// candidates the sampler accepts, a token in the vocabulary and finite log-probabilities.
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/candidates.h"
#include "kernels/draw.h"
#include "sampler/sampler_core.h"
#include "sampler/sampling.h"
#include "tests/sampler/edge_params.h"

namespace {

using namespace anvil;
using anvil::testing::edge_logits;
using anvil::testing::edge_sampling_params;
using anvil::testing::edge_token_counts;
using anvil::testing::logit_params_of;

std::string describe(const sampler::sampling_params& p) {
  return "temperature=" + std::to_string(p.temperature) + " (" + std::to_string(double(p.temperature)) +
         ") top_k=" + std::to_string(p.top_k) + " top_p=" + std::to_string(double(p.top_p)) +
         " min_p=" + std::to_string(double(p.min_p)) + " repetition=" + std::to_string(double(p.repetition_penalty)) +
         " presence=" + std::to_string(p.presence_penalty) + " frequency=" + std::to_string(p.frequency_penalty) +
         " biases=" + std::to_string(p.logit_bias.size());
}

TEST(SamplingEdges, TheIssueExamplesGiveFiniteCandidates) {
  // temperature 1e-38 and repetition_penalty 1e-38 used to turn logits into infinities.
  const std::vector<float> logits = {3.f, -2.f, 7.5f, 0.f, -40.f};
  for (const float t : {1e-38f, FLT_TRUE_MIN}) {
    gpu_worker::logit_params p;
    p.temperature = t;
    p.top_k = 2;
    const gpu_worker::seq_output out = kernels::candidates_ref(logits, p, 5);
    EXPECT_FALSE(sampler::check_candidates(out)) << t;
    EXPECT_EQ(out.top[0].token, 2);  // greedy: the logits are left alone
    EXPECT_EQ(out.top[0].logit, 7.5f);
  }
  gpu_worker::logit_params p;
  p.temperature = 1.f;
  p.repetition_penalty = 1e-38f;
  p.token_counts = {{2, 1}, {1, 3}};
  p.top_k = 5;
  const gpu_worker::seq_output out = kernels::candidates_ref(logits, p, 5);
  EXPECT_FALSE(sampler::check_candidates(out));
  EXPECT_EQ(out.top[0].token, 2);
  EXPECT_EQ(out.top[0].logit, FLT_MAX);       // 7.5 / 1e-38 saturates
  EXPECT_EQ(out.top[3].token, 1);  // -2 * 1e-38: a subnormal, still above token 4's -40
  EXPECT_EQ(out.top[4].logit, -40.f);
  std::mt19937_64 rng(1);
  sampler::sampling_params sp;
  sp.temperature = 1.f;
  const sampler::choice c = sampler::choose(out, sp, rng, 5);
  EXPECT_EQ(c.token, 2);
  for (const auto& t : c.top_logprobs) EXPECT_TRUE(std::isfinite(t.logprob)) << t.token;
}

TEST(SamplingEdges, NoAcceptedParameterSetGivesANonFiniteNumber) {
  std::mt19937_64 rng(20261124);
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    const std::int32_t vocab = std::int32_t(1 + rng() % 300);
    const sampler::sampling_params sp = edge_sampling_params(rng, vocab);
    ASSERT_FALSE(sampler::validate(sp, vocab)) << "the generator left the accepted ranges: " << describe(sp);
    SCOPED_TRACE("set " + std::to_string(i) + ": vocab=" + std::to_string(vocab) + " " + describe(sp));
    const std::vector<float> logits = edge_logits(rng, vocab);
    const auto counts = edge_token_counts(rng, vocab);
    const std::int32_t k = anvil::testing::candidates_k(sp);

    gpu_worker::seq_output out;
    ASSERT_NO_THROW(out = kernels::candidates_ref(logits, logit_params_of(sp, counts, k), std::int64_t(i)));
    for (const auto& c : out.top) ASSERT_FALSE(std::isnan(c.logit) || c.logit == INFINITY) << c.token;
    ASSERT_TRUE(std::isfinite(out.log_normalizer));
    ASSERT_FALSE(sampler::check_candidates(out)) << *sampler::check_candidates(out);

    std::mt19937_64 draw(sp.seed);
    const sampler::choice ch = sampler::choose(out, sp, draw, sp.logprobs);
    ASSERT_TRUE(ch.token >= 0 && ch.token < vocab);
    ASSERT_TRUE(std::isfinite(ch.logprob));
    for (const auto& t : ch.top_logprobs) ASSERT_TRUE(std::isfinite(t.logprob));
    // The worker's draw (candidates_ref under logit_params::draw) is the sampler's choice with
    // the uniform of the same seed and position, and the sampler takes it as it is.
    const sampler::choice same = sampler::choose(out, sp, kernels::draw_uniform(sp.seed, std::int64_t(i)), 0);
    ASSERT_EQ(out.drawn, same.token);
    ASSERT_EQ(sampler::take_drawn(out, sp.logprobs).token, same.token);

    // The direct path over the whole vocabulary, with a history that has the same counts.
    std::vector<std::int32_t> history;
    for (const auto& [id, count] : counts) history.insert(history.end(), std::size_t(std::min(count, 3)), id);
    std::mt19937_64 direct(sp.seed);
    const std::int32_t t = sampler::sample_token(logits, sp, history, direct);
    ASSERT_TRUE(t >= 0 && t < vocab);
  }
}

}  // namespace
