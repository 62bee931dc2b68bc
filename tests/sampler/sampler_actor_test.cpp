// The sampler actor through its async API: a seed gives the same tokens alone or interleaved with
// other requests (in batches of any composition, from any thread), an unknown id fails only its
// entry, close forgets, and invalid or duplicate opens are refused.
#include "sampler/sampler.h"

#include <future>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include "actors/executor_pool.h"
#include "kernels/candidates.h"

namespace {

namespace asio = boost::asio;
using anvil::actors::executor_pool;
using anvil::gpu_worker::logit_params;
using anvil::gpu_worker::seq_output;
using anvil::kernels::candidates_ref;
using namespace anvil::sampler;

template <class F>
anvil::error_code error_of(F&& future) {
  try {
    future.get();
  } catch (const boost::system::system_error& e) {
    return e.code();
  }
  return {};
}

// A request's sampling parameters and the worker's outputs for it, one per step.
struct script {
  std::uint64_t id;
  sampling_params params;
  std::vector<seq_output> steps;
};

script make_script(std::uint64_t id, std::uint64_t seed, float temperature, float top_p, int steps) {
  script s{id, {}, {}};
  s.params.temperature = temperature;
  s.params.top_p = top_p;
  s.params.seed = seed;
  logit_params lp;
  lp.temperature = temperature;
  lp.top_k = 8;
  lp.seed = seed;
  std::mt19937 rng{static_cast<unsigned>(id)};
  std::normal_distribution<float> d(0.f, 1.5f);
  for (int i = 0; i < steps; ++i) {
    std::vector<float> raw(64);
    for (auto& x : raw) x = d(rng);
    s.steps.push_back(candidates_ref(raw, lp, 100 + i));
    s.steps.back().seq_id = id;
  }
  return s;
}

std::vector<sample_outcome> sample(sampler_actor& a, std::vector<sample_request> batch) {
  return a.async_sample(std::move(batch), asio::use_future).get();
}

// The request's entry for `step` (wrapping around its script).
sample_request entry(const script& s, std::size_t step, std::int32_t n_logprobs = 0) {
  return {s.id, s.steps[step % s.steps.size()], n_logprobs};
}

void stop(sampler_actor& a) { a.async_stop(asio::use_future).get(); }

TEST(SamplerActor, SameSeedGivesTheSameTokensAloneOrInterleaved) {
  executor_pool pool("t", 4);
  const script a = make_script(1, 42, 1.f, 0.9f, 60);
  const script b = make_script(2, 7, 0.7f, 1.f, 60);
  const script c = make_script(3, 42, 1.2f, 1.f, 60);  // the same seed as `a`, other parameters

  std::vector<std::int32_t> alone;
  {
    sampler_actor actor(pool.get_executor());
    actor.async_open(a.id, a.params, asio::use_future).get();
    for (std::size_t i = 0; i < a.steps.size(); ++i) alone.push_back(sample(actor, {entry(a, i)}).at(0)->token);
    stop(actor);
  }
  std::set<std::int32_t> distinct(alone.begin(), alone.end());
  ASSERT_GT(distinct.size(), 5u) << "the script must sample, not decide";

  // Batches of changing composition and order; some hold no entry of `a`, some hold b twice.
  {
    sampler_actor actor(pool.get_executor());
    actor.async_open(b.id, b.params, asio::use_future).get();
    actor.async_open(c.id, c.params, asio::use_future).get();
    actor.async_open(a.id, a.params, asio::use_future).get();
    std::vector<std::int32_t> mixed;
    std::size_t bi = 0, ci = 0;
    for (std::size_t i = 0; i < a.steps.size(); ++i) {
      std::vector<sample_request> batch;
      if (i % 3 == 0) batch = {entry(b, bi++), entry(a, i), entry(c, ci++)};
      if (i % 3 == 1) batch = {entry(a, i, 5), entry(c, ci++)};
      if (i % 3 == 2) batch = {entry(c, ci++), entry(b, bi++), entry(b, bi++), entry(a, i)};
      const std::size_t a_at = i % 3 == 0 ? 1 : i % 3 == 1 ? 0 : 3;
      const std::vector<sample_outcome> out = sample(actor, batch);
      ASSERT_EQ(out.size(), batch.size());
      for (const auto& o : out) ASSERT_TRUE(o);
      mixed.push_back(out[a_at]->token);
      if (i % 5 == 4) sample(actor, {entry(c, ci++), entry(b, bi++)});  // a step without `a`
    }
    EXPECT_EQ(mixed, alone);
    stop(actor);
  }

  // Each request from its own thread, so the interleaving is whatever the scheduler of the day does.
  {
    sampler_actor actor(pool.get_executor());
    for (const script* s : {&a, &b, &c}) actor.async_open(s->id, s->params, asio::use_future).get();
    auto run = [&](const script& s) {
      std::vector<std::int32_t> tokens;
      for (std::size_t i = 0; i < s.steps.size(); ++i) tokens.push_back(sample(actor, {entry(s, i)}).at(0)->token);
      return tokens;
    };
    auto fb = std::async(std::launch::async, run, std::cref(b));
    auto fc = std::async(std::launch::async, run, std::cref(c));
    auto fa = std::async(std::launch::async, run, std::cref(a));
    EXPECT_EQ(fa.get(), alone);
    fb.get();
    fc.get();
    stop(actor);
  }
}

TEST(SamplerActor, AnUnknownIdFailsOnlyItsEntry) {
  executor_pool pool("t", 2);
  sampler_actor actor(pool.get_executor());
  const script a = make_script(1, 5, 1.f, 1.f, 3);
  actor.async_open(a.id, a.params, asio::use_future).get();
  const std::vector<sample_outcome> out = sample(actor, {entry(a, 0, 2), {99, a.steps[1], 0}, entry(a, 2)});
  ASSERT_EQ(out.size(), 3u);
  ASSERT_TRUE(out[0]);
  EXPECT_EQ(out[0]->top_logprobs.size(), 2u);
  ASSERT_FALSE(out[1]);
  EXPECT_EQ(out[1].error(), sampler_errc::unknown_request);
  EXPECT_NE(out[1].error().message().find("unknown request"), std::string::npos);
  EXPECT_TRUE(out[2]);
  EXPECT_TRUE(sample(actor, {}).empty());
  stop(actor);
}

TEST(SamplerActor, CloseForgetsTheRequestAndReopeningStartsOverFromTheSeed) {
  executor_pool pool("t", 2);
  sampler_actor actor(pool.get_executor());
  const script a = make_script(1, 11, 1.f, 1.f, 20);
  actor.async_open(a.id, a.params, asio::use_future).get();
  std::vector<std::int32_t> first;
  for (std::size_t i = 0; i < a.steps.size(); ++i) first.push_back(sample(actor, {entry(a, i)}).at(0)->token);
  actor.async_close(a.id, asio::use_future).get();
  EXPECT_EQ(sample(actor, {entry(a, 0)}).at(0).error(), sampler_errc::unknown_request);
  EXPECT_EQ(error_of(actor.async_close(a.id, asio::use_future)), sampler_errc::unknown_request);

  actor.async_open(a.id, a.params, asio::use_future).get();
  std::vector<std::int32_t> again;
  for (std::size_t i = 0; i < a.steps.size(); ++i) again.push_back(sample(actor, {entry(a, i)}).at(0)->token);
  EXPECT_EQ(again, first);
  stop(actor);
}

TEST(SamplerActor, RefusesInvalidAndDuplicateOpens) {
  executor_pool pool("t", 2);
  sampler_actor actor(pool.get_executor());
  sampling_params bad;
  bad.temperature = -1.f;
  EXPECT_EQ(error_of(actor.async_open(1, bad, asio::use_future)), sampler_errc::invalid_params);
  sampling_params many;
  many.logprobs = 21;
  EXPECT_EQ(error_of(actor.async_open(1, many, asio::use_future)), sampler_errc::invalid_params);
  EXPECT_FALSE(error_of(actor.async_open(1, sampling_params{}, asio::use_future)));
  EXPECT_EQ(error_of(actor.async_open(1, sampling_params{}, asio::use_future)), sampler_errc::already_open);
  stop(actor);
  EXPECT_EQ(error_of(actor.async_open(2, sampling_params{}, asio::use_future)), anvil::errc::stopped);
}

TEST(SamplerActor, CompletesACallbackWithEveryOutcome) {
  executor_pool pool("t", 2);
  sampler_actor actor(pool.get_executor());
  const script a = make_script(4, 3, 0.f, 1.f, 1);
  actor.async_open(a.id, a.params, asio::use_future).get();
  std::promise<std::vector<sample_outcome>> done;
  actor.async_sample({entry(a, 0, 1)}, [&](anvil::error_code ec, std::vector<sample_outcome> out) {
    EXPECT_FALSE(ec);
    done.set_value(std::move(out));
  });
  const std::vector<sample_outcome> out = done.get_future().get();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]->token, a.steps[0].top[0].token);  // temperature 0: greedy
  stop(actor);
}

}  // namespace
