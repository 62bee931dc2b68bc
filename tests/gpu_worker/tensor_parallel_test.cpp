// Tensor parallelism on the CPU (model/arch/tensor_parallel.h, gpu_worker/host_group.h): the
// in-process collectives; every reference architecture split over 1, 2 and 4 ranks against the
// whole model (logits of both golden prompts in one batch) and against PyTorch's 64 greedy tokens
// through the engine; sampled requests and the arena through the engine; the refusals.
#include <algorithm>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "gpu_worker/host_group.h"
#include "model/arch/cpu_forward.h"
#include "model/arch/tensor_parallel.h"
#include "tests/engine/requests.h"
#include "tests/model/fixtures.h"
#include "tests/model/reference_golden.h"

namespace {

using namespace anvil;
namespace asio = boost::asio;

const std::string dir = std::string(ANVIL_TEST_DATA_DIR) + "/reference/";

using model::testing::golden;

golden read_golden(const std::string& arch) { return model::testing::read_golden(dir, arch); }

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  return model::testing::rel_l2(a.data(), b.data(), a.size());
}

// Each rank calls fn(r) in a thread of its own; returns when all have.
template <class F>
void on_ranks(int n, F fn) {
  std::vector<std::thread> threads;
  for (int r = 1; r < n; ++r) threads.emplace_back([&fn, r] { fn(r); });
  fn(0);
  for (std::thread& t : threads) t.join();
}

TEST(HostGroup, SumsInRankOrderOnEveryRankAndGathersRankAfterRank) {
  for (int n : {1, 2, 3, 4}) {
    gpu_worker::host_group g(n);
    std::vector<std::vector<float>> x(static_cast<std::size_t>(n)), all(static_cast<std::size_t>(n));
    on_ranks(n, [&](int r) {
      std::vector<float>& mine = x[std::size_t(r)];
      for (int i = 0; i < 11; ++i) mine.push_back(float(r * 100 + i) + 0.1f);
      g.rank(r).all_reduce_sum(mine);
      all[std::size_t(r)].resize(std::size_t(3 * n));
      const std::vector<float> part{float(r), float(r) + 0.5f, -float(r)};
      g.rank(r).all_gather(part, all[std::size_t(r)]);
    });
    for (int r = 0; r < n; ++r) {
      for (int i = 0; i < 11; ++i) {
        float want = 0.1f + float(i);  // rank 0's, then rank 1's added, ...
        for (int q = 1; q < n; ++q) want += float(q * 100 + i) + 0.1f;
        EXPECT_EQ(x[std::size_t(r)][std::size_t(i)], want) << n << " ranks, rank " << r << ", element " << i;
      }
      for (int q = 0; q < n; ++q) {
        EXPECT_EQ(all[std::size_t(r)][std::size_t(3 * q)], float(q));
        EXPECT_EQ(all[std::size_t(r)][std::size_t(3 * q + 2)], -float(q));
      }
    }
  }
}

TEST(HostGroup, AFailedRankMakesTheOthersCollectivesThrowUntilReset) {
  gpu_worker::host_group g(3);
  std::vector<int> outcome(3, 0);  // 1: returned, 2: collective_aborted
  on_ranks(3, [&](int r) {
    if (r == 2) {
      g.abort();  // rank 2 failed before its first collective
      return;
    }
    std::vector<float> v(4, 1.f);
    try {
      g.rank(r).all_reduce_sum(v);
      outcome[std::size_t(r)] = 1;
    } catch (const gpu_worker::collective_aborted&) {
      outcome[std::size_t(r)] = 2;
    }
  });
  EXPECT_EQ(outcome[0], 2);
  EXPECT_EQ(outcome[1], 2);
  g.reset();
  std::vector<std::vector<float>> v(3, std::vector<float>(5, 2.f));
  on_ranks(3, [&](int r) { g.rank(r).all_reduce_sum(v[std::size_t(r)]); });
  for (const auto& x : v) EXPECT_EQ(x, std::vector<float>(5, 6.f));
}

class TensorParallelReference : public ::testing::TestWithParam<std::string> {};

// Both golden prompts in one batch on `m` (a whole model, or a rank's shard joined by `tp`): every
// position's logits.
std::vector<float> both_prompts_logits(const model::llm& m, const golden& g, model::tp_link tp = {}) {
  const std::int32_t slots = m.hp.has_recurrent() ? 2 : 0;
  model::kv_cache_storage cache(m.hp, 16, 8, kernels::kv_dtype::f16, std::pmr::get_default_resource(), 0, slots);
  const std::vector<std::int32_t> t0{0, 1, 2, 3, 4, 5, 6, 7}, t1{8, 9, 10, 11, 12, 13, 14, 15};
  const std::vector<model::forward_seq> batch{
      {.tokens = g.prompts[0], .start_pos = 0, .block_table = t0, .all_logits = true, .state_slot = slots ? 0 : -1},
      {.tokens = g.prompts[1], .start_pos = 0, .block_table = t1, .all_logits = true, .state_slot = slots ? 1 : -1}};
  std::vector<float> logits;
  model::cpu_forward(m, 0, std::pmr::get_default_resource(), tp).run(batch, cache, logits);
  return logits;
}

// Both golden prompts in one batch, every position's logits, on n ranks of the model's shards.
std::vector<float> sharded_logits(const model::llm& m, const golden& g, int n) {
  gpu_worker::host_group group(n);
  std::vector<model::llm_shard> shards;
  for (int r = 0; r < n; ++r) shards.emplace_back(m, r, n);
  std::vector<std::vector<float>> logits(static_cast<std::size_t>(n));
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  on_ranks(n, [&](int r) {
    try {
      const model::llm_shard& s = shards[std::size_t(r)];
      logits[std::size_t(r)] = both_prompts_logits(s.model(), g, {.comm = &group.rank(r), .vocab = s.vocab()});
    } catch (const std::exception& e) {
      errors[std::size_t(r)] = e.what();
      group.abort();
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[std::size_t(r)], "") << "rank " << r;
  for (int r = 1; r < n; ++r) EXPECT_EQ(logits[std::size_t(r)], logits[0]) << "rank " << r << "'s gathered logits";
  return logits[0];
}

TEST_P(TensorParallelReference, ShardsGiveTheWholeModelsLogits) {
  const golden g = read_golden(GetParam());
  const model::llm m = model::load_llm(model::gguf_file::open(dir + "ref-" + GetParam() + ".gguf"));
  const std::vector<float> whole = both_prompts_logits(m, g);
  // One rank through the collectives: the same arithmetic as the whole model, bit for bit.
  EXPECT_EQ(sharded_logits(m, g, 1), whole);
  for (int n : {2, 4}) {
    const std::vector<float> got = sharded_logits(m, g, n);
    ASSERT_EQ(got.size(), whole.size()) << n << " ranks";
    // The sums of partial projections round differently from one dot product: float32 rounding.
    EXPECT_LT(rel_l2(got, whole), 1e-5) << n << " ranks";
  }
}

// The engine on the CPU backend with the model split over N ranks: PyTorch's 64 greedy tokens for
// the first golden prompt, as the whole model gives them (reference_test).
TEST_P(TensorParallelReference, TheEngineGivesPyTorchsGreedyTokensOnEveryRankCount) {
  const golden g = read_golden(GetParam());
  for (int n : {1, 2, 4}) {
    engine_config cfg;
    cfg.model_path = dir + "ref-" + GetParam() + ".gguf";
    cfg.backend = worker_backend::cpu;
    cfg.tensor_parallel = n;
    cfg.max_model_len = 128;
    auto eng = engine::create(cfg);
    const completion c = eng->async_generate(anvil::testing::greedy_request(g.prompts[0], 64), asio::use_future).get();
    EXPECT_EQ(c.tokens, g.greedy) << n << " ranks";
    eng->async_stop(asio::use_future).get();
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, TensorParallelReference,
                         ::testing::Values("llama", "qwen2", "qwen3", "qwen3moe", "mixtral", "qwen2moe", "gpt-oss", "gemma3",
                                           "gemma4", "gemma4moe", "mistral3", "qwen35", "qwen35moe"),
                         [](const auto& p) {
                           std::string s = p.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// Concurrent requests, sampled ones among them, split over two ranks give what the whole model
// gives (the same seeds), and the worker's arena stays as it was after start-up.
TEST(TensorParallelEngine, MixedConcurrentRequestsGiveTheWholeModelsTokensAndTheArenaStaysFlat) {
  const auto run = [](int n) {
    engine_config cfg;
    cfg.model_path = model::testing::synth_fixture("tiny", model::synth_mix::f32);
    cfg.backend = worker_backend::cpu;
    cfg.tensor_parallel = n;
    cfg.kv_budget_bytes = 8u << 20;
    cfg.max_seqs = 16;
    cfg.max_model_len = 256;
    auto eng = engine::create(cfg);
    const std::uint64_t at_start = eng->stats().device_allocations;
    std::vector<std::future<completion>> futures;
    for (int i = 0; i < 12; ++i) {
      futures.push_back(eng->async_generate(
          anvil::testing::mixed_request(anvil::testing::random_prompt(std::size_t(3 + i * 5), std::uint32_t(i)), 12, i, 7),
          asio::use_future));
    }
    std::vector<std::vector<std::int32_t>> out;
    for (auto& f : futures) out.push_back(f.get().tokens);
    EXPECT_EQ(eng->stats().device_allocations, at_start) << n << " ranks";
    eng->async_stop(asio::use_future).get();
    return out;
  };
  const auto whole = run(1);
  EXPECT_EQ(run(2), whole);
}

TEST(TensorParallelRefusal, NamesWhatDoesNotDivide) {
  const model::llm m = model::load_llm(model::gguf_file::open(dir + "ref-llama.gguf"));  // 4 heads, 2 KV heads, width 160
  EXPECT_EQ(model::tp_refusal(m, 1), "");
  EXPECT_EQ(model::tp_refusal(m, 4), "");
  EXPECT_EQ(model::tp_refusal(m, 3), "layer 0: the 4 attention heads do not divide over 3 ranks");
  EXPECT_EQ(model::tp_refusal(m, 0), "tensor parallelism needs at least one rank, not 0");
  // Slices of ceil(V / N): 5 tokens over 4 ranks would be 2, 2, 1 and none.
  EXPECT_EQ(model::vocab_slice_of(5, 2, 4).end - model::vocab_slice_of(5, 2, 4).begin, 1);
  EXPECT_GE(model::vocab_slice_of(5, 3, 4).begin, 5);
  EXPECT_EQ(model::vocab_slice_of(272, 3, 4).end, 272);
  EXPECT_THROW(model::llm_shard(m, 3, 3), std::invalid_argument);
  EXPECT_THROW(model::llm_shard(m, 2, 2), std::invalid_argument);  // no rank 2 of 2

  engine_config cfg;
  cfg.model_path = dir + "ref-llama.gguf";
  cfg.backend = worker_backend::cpu;
  cfg.tensor_parallel = 3;
  try {
    engine::create(cfg);
    ADD_FAILURE() << "three ranks of four heads were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "--tensor-parallel 3: layer 0: the 4 attention heads do not divide over 3 ranks");
  }
}

// A quantized model's column slices must be whole blocks: the tiny shape's attention output has
// 4 heads of 64, so 2 ranks take 128 columns each, whole Q8_0 blocks (32) but half a Q4_K block.
TEST(TensorParallelRefusal, AQuantizedSliceMustBeWholeBlocks) {
  const model::llm q8 = model::load_llm(model::gguf_file::open(model::testing::synth_fixture("tiny", model::synth_mix::q8_0)));
  for (int n : {2, 4}) {
    EXPECT_EQ(model::tp_refusal(q8, n), "") << n;
    const model::llm_shard s(q8, n - 1, n);
    EXPECT_EQ(s.model().hp.n_head * n, q8.hp.n_head);
    EXPECT_EQ(s.model().layers[0].wo.in * n, q8.layers[0].wo.in);
    EXPECT_EQ(s.model().layers[0].down.in * n, q8.layers[0].down.in);
    EXPECT_EQ(s.vocab().end, q8.hp.n_vocab);
    EXPECT_LT(s.weight_bytes(), q8.weight_bytes());
  }
  const model::llm q4 = model::load_llm(model::gguf_file::open(model::testing::synth_fixture("tiny", model::synth_mix::q4_k_m)));
  EXPECT_EQ(model::tp_refusal(q4, 2),
            "layer 0: attn_output: a rank's runs of 128 columns (of 2 ranks) are not whole Q4_K blocks of 256");
}

}  // namespace
