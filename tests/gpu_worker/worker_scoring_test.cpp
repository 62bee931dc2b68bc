// Scoring through the worker interface (step_plan score_targets, step_result scores) on the CPU
// worker: the log-probabilities are the reference forward pass's log-softmax at the targets, a
// scoring step gives the same candidates as a plain one, broken score targets are refused, and
// perplexity through the worker (gpu_worker/worker_perplexity.h, what `anvil perplexity` runs)
// equals model::perplexity. The GPU worker is held to the same in gpu_worker_test.
#include <cmath>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <boost/system/system_error.hpp>
#include <gtest/gtest.h>

#include "gpu_worker/cpu_worker.h"
#include "gpu_worker/worker_perplexity.h"
#include "model/arch/cpu_forward.h"
#include "model/arch/perplexity.h"
#include "tests/model/fixtures.h"

namespace {

using namespace anvil;
using namespace anvil::gpu_worker;
using model::synth_mix;
using model::testing::synth_fixture;

std::vector<std::int32_t> random_tokens(std::size_t n, std::uint32_t seed, std::int32_t vocab) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = std::int32_t(rng() % std::uint32_t(vocab));
  return t;
}

std::vector<std::int32_t> iota_blocks(std::int64_t n, std::int32_t first = 0) {
  std::vector<std::int32_t> b(static_cast<std::size_t>(n));
  std::iota(b.begin(), b.end(), first);
  return b;
}

step_result run(worker& w, step_plan p) { return w.async_execute(std::move(p), boost::asio::use_future).get(); }

class WorkerScoring : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = std::make_unique<model::llm>(model::load_llm(model::gguf_file::open(synth_fixture("tiny", synth_mix::q8_0))));
  }
  std::int32_t vocab() const { return std::int32_t(model_->hp.n_vocab); }
  std::unique_ptr<model::llm> model_;
};

TEST_F(WorkerScoring, LogprobsAreTheReferenceLogSoftmaxAtTheTargets) {
  cpu_worker w(*model_, {16, 8u << 20, 128, 4});
  const std::vector<std::int32_t> tokens = random_tokens(40, 1, vocab());
  // The reference: every row's logits from the forward pass.
  model::kv_cache_storage cache(model_->hp, 4, 16);
  const std::vector<std::int32_t> table = iota_blocks(3);
  model::cpu_forward fwd(*model_);
  std::vector<float> logits;
  const model::forward_seq fs{tokens, 0, table, true};
  fwd.run(std::span(&fs, 1), cache, logits);

  step_plan p;
  seq_step s;
  s.seq_id = 7;
  s.tokens = tokens;
  s.block_table = iota_blocks(3);
  s.score_targets.assign(tokens.size(), -1);
  for (std::size_t j = 0; j + 1 < tokens.size(); j += 3) s.score_targets[j] = tokens[j + 1];
  s.score_targets.back() = 5;
  p.seqs.push_back(s);
  const step_result r = run(w, p);
  ASSERT_EQ(r.scores.size(), 1u);
  EXPECT_TRUE(r.outputs.empty());
  EXPECT_EQ(r.scores[0].seq_id, 7u);
  ASSERT_EQ(r.scores[0].logprobs.size(), tokens.size());
  const auto V = std::size_t(vocab());
  for (std::size_t j = 0; j < tokens.size(); ++j) {
    if (s.score_targets[j] < 0) {
      EXPECT_EQ(r.scores[0].logprobs[j], 0.f) << j;
      continue;
    }
    const double want = -model::token_nll(std::span<const float>(logits).subspan(j * V, V), s.score_targets[j]);
    EXPECT_NEAR(r.scores[0].logprobs[j], want, 1e-5 * std::max(1.0, std::fabs(want))) << j;
    EXPECT_LT(r.scores[0].logprobs[j], 0.f) << j;
  }
}

TEST_F(WorkerScoring, AScoringStepGivesThePlainStepsCandidatesAndScoresSeveralSequences) {
  cpu_worker plain(*model_, {16, 8u << 20, 128, 4});
  cpu_worker scoring(*model_, {16, 8u << 20, 128, 4});
  step_plan p;
  for (std::uint64_t id = 1; id <= 3; ++id) {
    seq_step s;
    s.seq_id = id;
    s.tokens = random_tokens(5 + 7 * id, std::uint32_t(id), vocab());
    s.block_table = iota_blocks(2, std::int32_t(2 * id));
    s.want_candidates = true;
    s.logits.top_k = 8;
    p.seqs.push_back(s);
  }
  step_plan q = p;
  q.seqs[0].score_targets.assign(q.seqs[0].tokens.size(), 3);
  q.seqs[2].score_targets.assign(q.seqs[2].tokens.size(), -1);
  q.seqs[2].score_targets[0] = 9;
  const step_result a = run(plain, p), b = run(scoring, q);
  ASSERT_EQ(a.outputs.size(), 3u);
  ASSERT_EQ(b.outputs.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(a.outputs[i].seq_id, b.outputs[i].seq_id);
    EXPECT_EQ(a.outputs[i].log_normalizer, b.outputs[i].log_normalizer) << i;
    ASSERT_EQ(a.outputs[i].top.size(), b.outputs[i].top.size());
    for (std::size_t k = 0; k < a.outputs[i].top.size(); ++k) {
      EXPECT_EQ(a.outputs[i].top[k].token, b.outputs[i].top[k].token) << i << " " << k;
      EXPECT_EQ(a.outputs[i].top[k].logit, b.outputs[i].top[k].logit) << i << " " << k;
    }
  }
  ASSERT_EQ(b.scores.size(), 2u);  // plan order: seq 1, then seq 3
  EXPECT_EQ(b.scores[0].seq_id, 1u);
  EXPECT_EQ(b.scores[1].seq_id, 3u);
  EXPECT_LT(b.scores[1].logprobs[0], 0.f);
  EXPECT_EQ(b.scores[1].logprobs[1], 0.f);
}

TEST_F(WorkerScoring, RefusesBrokenScoreTargets) {
  cpu_worker w(*model_, {16, 8u << 20, 128, 4});
  const auto refused = [&](std::vector<std::int32_t> targets) {
    step_plan p;
    seq_step s;
    s.tokens = {1, 2, 3};
    s.block_table = {0};
    s.score_targets = std::move(targets);
    p.seqs.push_back(s);
    try {
      run(w, p);
    } catch (const boost::system::system_error& e) {
      return e.code() == make_error_code(errc::invalid_argument);
    }
    return false;
  };
  EXPECT_TRUE(refused({1, 2}));                // not one per fed token
  EXPECT_TRUE(refused({1, 2, vocab()}));       // outside the vocabulary
  EXPECT_TRUE(refused({1, -2, 3}));            // below -1
  EXPECT_FALSE(refused({-1, -1, vocab() - 1}));
}

TEST_F(WorkerScoring, PerplexityThroughTheWorkerEqualsTheReference) {
  const std::vector<std::int32_t> tokens = random_tokens(300, 3, vocab());
  model::perplexity_options opt;
  opt.ctx = 96;
  opt.stride = 40;
  opt.batch = 32;  // windows in chunks: scores cross chunk boundaries
  const model::perplexity_result want = model::perplexity(*model_, tokens, opt);
  cpu_worker w(*model_, {16, 8u << 20, 32, 1});
  const std::uint64_t allocs = w.device_allocations();
  std::int64_t calls = 0;
  const model::perplexity_result got =
      gpu_worker::perplexity(w, tokens, opt, model_->hp.n_ctx_train, [&](std::int64_t, std::int64_t) { ++calls; });
  EXPECT_EQ(got.n_scored, want.n_scored);
  EXPECT_EQ(got.n_windows, want.n_windows);
  EXPECT_EQ(calls, want.n_windows);
  ASSERT_EQ(got.window_nll.size(), want.window_nll.size());
  for (std::size_t i = 0; i < got.window_nll.size(); ++i) {
    EXPECT_NEAR(got.window_nll[i], want.window_nll[i], 1e-5 * std::max(1.0, want.window_nll[i])) << "window " << i;
  }
  EXPECT_NEAR(got.perplexity(), want.perplexity(), 1e-6 * want.perplexity());
  // Steps of 32 scored rows: the logits buffer, planned for one row, grows once, and says so.
  EXPECT_EQ(w.device_allocations() - allocs, 1u);
}

TEST_F(WorkerScoring, PerplexityRefusesWhatTheWorkerCannotHold) {
  const std::vector<std::int32_t> tokens = random_tokens(100, 4, vocab());
  cpu_worker small(*model_, {16, model::kv_cache_storage::bytes_per_block(model_->hp, 16) * 2, 32, 1});  // 2 blocks
  model::perplexity_options opt;
  opt.ctx = 64;
  opt.batch = 32;
  EXPECT_THROW(gpu_worker::perplexity(small, tokens, opt, model_->hp.n_ctx_train), std::invalid_argument);
  opt.ctx = 32;
  opt.batch = 0;  // the whole window
  EXPECT_NO_THROW(gpu_worker::perplexity(small, tokens, opt, model_->hp.n_ctx_train));
  opt.ctx = 32;
  opt.batch = 64;  // more than the worker's step limit? (cut to ctx, so fine)
  EXPECT_NO_THROW(gpu_worker::perplexity(small, tokens, opt, model_->hp.n_ctx_train));
  cpu_worker narrow(*model_, {16, 8u << 20, 8, 1});
  opt.batch = 16;
  EXPECT_THROW(gpu_worker::perplexity(narrow, tokens, opt, model_->hp.n_ctx_train), std::invalid_argument);
}

}  // namespace
