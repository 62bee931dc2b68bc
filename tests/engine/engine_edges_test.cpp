// Sampling parameters at the edges of their accepted ranges, through the whole CPU engine: each
// request ends normally, a greedy request sharing its steps gets exactly its reference tokens, and
// the engine stays healthy (a numerical problem in one request's sampling must never fail a step).
#include <cmath>
#include <cstdint>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "tests/engine/requests.h"
#include "tests/model/fixtures.h"
#include "tests/model/reference_greedy.h"
#include "tests/sampler/edge_params.h"

namespace {

using namespace anvil;
namespace asio = boost::asio;
using anvil::testing::greedy_request;
using anvil::testing::random_prompt;
using model::testing::synth_fixture;

engine_config edge_config() {
  engine_config c;
  c.model_path = synth_fixture("tiny", model::synth_mix::f32);
  c.kv_budget_bytes = 8u << 20;
  c.max_batch_tokens = 256;
  c.max_seqs = 32;
  c.max_prefill_chunk = 64;
  c.max_model_len = 512;
  c.max_queue = 4096;  // every request of the property test waits its turn
  return c;
}

std::vector<std::int32_t> reference_greedy(const std::vector<std::int32_t>& prompt, std::int64_t n) {
  static const model::llm m = model::load_llm(model::gguf_file::open(synth_fixture("tiny", model::synth_mix::f32)));
  return model::testing::reference_greedy(m, prompt, n);
}

// What each edge request must give: an ordinary end, tokens in the vocabulary, finite logprobs.
void expect_ordinary(const std::vector<stream_event>& events, std::int32_t vocab, const std::string& what) {
  ASSERT_FALSE(events.empty()) << what;
  const stream_event& last = events.back();
  EXPECT_TRUE(last.done) << what;
  EXPECT_TRUE(last.finish_reason == "length" || last.finish_reason == "stop")
      << what << ": " << last.finish_reason << " " << last.error.message();
  for (const stream_event& e : events) {
    for (std::int32_t t : e.tokens) EXPECT_TRUE(t >= 0 && t < vocab) << what;
    for (float lp : e.logprobs) EXPECT_TRUE(std::isfinite(lp)) << what;
    for (const auto& alts : e.top_logprobs) {
      for (const auto& a : alts) EXPECT_TRUE(std::isfinite(a.logprob)) << what;
    }
  }
}

TEST(EngineEdges, TinyTemperatureAndPenaltyEndOnlyTheirOwnRequests) {
  auto eng = engine::create(edge_config());
  const std::vector<std::int32_t> prompt = {65, 110, 100, 32, 71, 111, 100};  // "And God" in byte tokens
  for (const char* which : {"temperature", "repetition_penalty"}) {
    generate_request r = greedy_request(prompt, 2);
    r.sampling.temperature = 1e-38f;
    if (std::string(which) == "repetition_penalty") {
      r.sampling.temperature = 1.f;
      r.sampling.repetition_penalty = 1e-38f;
    }
    auto edge = eng->async_generate(std::move(r), asio::use_future);
    auto bystander = eng->async_generate(greedy_request(random_prompt(9, 3), 4), asio::use_future);
    const completion c = edge.get();
    EXPECT_EQ(c.finish_reason, "length") << which;
    EXPECT_EQ(bystander.get().tokens, reference_greedy(random_prompt(9, 3), 4)) << which;
    EXPECT_TRUE(eng->healthy()) << which;
  }
  eng->async_stop(asio::use_future).get();
}

TEST(EngineEdges, RandomAcceptedParameterSetsNeverFailAStep) {
  auto eng = engine::create(edge_config());
  const std::int32_t vocab = std::int32_t(eng->tokenizer().n_vocab());
#if defined(ANVIL_SANITIZED)
  constexpr int n = 300;
#else
  constexpr int n = 2000;
#endif
  std::mt19937_64 rng(424242);
  // Events arrive on an engine thread; each request's list is read only after its last event.
  struct run {
    std::string what;
    std::vector<stream_event> events;
    std::promise<void> done;
  };
  std::vector<std::unique_ptr<run>> runs;
  std::vector<std::future<void>> finished;
  std::vector<std::pair<std::vector<std::int32_t>, std::future<completion>>> bystanders;
  for (int i = 0; i < n; ++i) {
    generate_request r = greedy_request(random_prompt(1 + rng() % 24, std::uint32_t(i)), 1 + std::int64_t(rng() % 3));
    r.sampling = anvil::testing::edge_sampling_params(rng, vocab);
    r.ignore_eos = rng() % 2 == 0;
    auto x = std::make_unique<run>();
    x->what = "request " + std::to_string(i) + ": temperature=" + std::to_string(double(r.sampling.temperature)) +
              " repetition=" + std::to_string(double(r.sampling.repetition_penalty)) +
              " top_k=" + std::to_string(r.sampling.top_k) + " logprobs=" + std::to_string(r.sampling.logprobs);
    finished.push_back(x->done.get_future());
    run* raw = x.get();
    auto id = eng->submit(std::move(r), [raw](const stream_event& e) {
      raw->events.push_back(e);
      if (e.done) raw->done.set_value();
    });
    ASSERT_TRUE(id) << x->what << ": " << id.error().message();
    runs.push_back(std::move(x));
    if (i % 25 == 0) {  // a greedy request in the same steps gets its reference tokens exactly
      std::vector<std::int32_t> prompt = random_prompt(5 + std::size_t(i % 7), std::uint32_t(1000 + i));
      auto f = eng->async_generate(greedy_request(prompt, 3), asio::use_future);
      bystanders.emplace_back(std::move(prompt), std::move(f));
    }
  }
  for (std::size_t i = 0; i < runs.size(); ++i) {
    finished[i].get();
    expect_ordinary(runs[i]->events, vocab, runs[i]->what);
  }
  for (auto& [prompt, f] : bystanders) EXPECT_EQ(f.get().tokens, reference_greedy(prompt, 3));
  EXPECT_TRUE(eng->healthy());
  EXPECT_EQ(eng->stats().requests.finished_error, 0u);
  eng->async_stop(asio::use_future).get();
}

}  // namespace
