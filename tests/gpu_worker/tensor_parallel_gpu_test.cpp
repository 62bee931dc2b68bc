// Tensor parallelism on the GPU (gpu_worker.cpp's tp_gpu_backend, gpu_worker/communicator.h):
// one rank through the whole tensor-parallel path (shard, NCCL, gathered logits) gives the plain
// worker's candidates bit for bit; on a machine with more GPUs, the model split over 2 (and 4)
// gives the one-GPU engine's greedy tokens except at near ties, and allocates nothing after
// start-up. Runs only where the runtime sees a GPU.
#include <algorithm>
#include <cstdio>
#include <future>
#include <string>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "gpu_worker/communicator.h"
#include "gpu_worker/gpu_worker.h"
#include "model/arch/tensor_parallel.h"
#include "tests/engine/requests.h"
#include "tests/gpu_worker/gpu_engine_util.h"
#include "tests/model/fixtures.h"

namespace {

using namespace anvil;
using model::synth_mix;
using model::testing::synth_fixture;

struct tp_case {
  const char* shape;
  synth_mix mix;
};

std::string name_of(const tp_case& c) {
  std::string n = std::string(c.shape) + "_" + std::string(model::synth_mix_name(c.mix));
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

int device_count() {
  int n = 0;
  return hipGetDeviceCount(&n) == hipSuccess ? n : 0;
}

gpu_worker::step_result run(gpu_worker::worker& w, const gpu_worker::step_plan& p) {
  return w.async_execute(p, boost::asio::use_future).get();
}

class GpuTensorParallel : public ::testing::TestWithParam<tp_case> {};

// Prefill of three prompts, then decode steps feeding each its greedy token: the same plans on a
// plain worker and on one rank through the tensor-parallel path; the candidates must be equal.
TEST_P(GpuTensorParallel, OneRankThroughTheCommunicatorGivesThePlainWorkersCandidates) {
  REQUIRE_GPU();
  const model::llm m = model::load_llm(model::gguf_file::open(synth_fixture(GetParam().shape, GetParam().mix)));
  gpu_worker::gpu_worker_config gc;
  gc.block_size = 16;
  gc.max_batch_tokens = 256;
  gc.max_seqs = 16;
  gc.max_context = 512;
  gc.kv_budget_bytes = 16u << 20;
  gpu_worker::gpu_worker plain(m, gc);
  gc.through_communicator = true;
  gpu_worker::gpu_worker ranked(m, gc);
  EXPECT_EQ(ranked.plan().n_blocks, plain.plan().n_blocks);
  const std::uint64_t allocs = ranked.device_allocations();
  std::vector<gpu_worker::seq_step> seqs;
  for (std::uint64_t i = 0; i < 3; ++i) {
    gpu_worker::seq_step s;
    s.seq_id = i + 1;
    s.tokens = anvil::testing::random_prompt(5 + 23 * i, std::uint32_t(i + 7));
    for (std::int32_t b = 0; b < 8; ++b) s.block_table.push_back(std::int32_t(8 * i) + b);
    s.want_candidates = true;
    s.logits.top_k = 8;
    if (m.hp.has_recurrent()) s.state_slot = std::int32_t(i);
    seqs.push_back(s);
  }
  for (int step = 1; step <= 6; ++step) {
    gpu_worker::step_plan p;
    p.step = std::uint64_t(step);
    p.seqs = seqs;
    const gpu_worker::step_result a = run(plain, p), b = run(ranked, p);
    ASSERT_EQ(a.outputs.size(), b.outputs.size());
    for (std::size_t i = 0; i < a.outputs.size(); ++i) {
      ASSERT_EQ(a.outputs[i].top.size(), b.outputs[i].top.size());
      for (std::size_t j = 0; j < a.outputs[i].top.size(); ++j) {
        EXPECT_EQ(a.outputs[i].top[j].token, b.outputs[i].top[j].token) << "step " << step << ", seq " << i << ", rank " << j;
        EXPECT_EQ(a.outputs[i].top[j].logit, b.outputs[i].top[j].logit) << "step " << step << ", seq " << i << ", rank " << j;
      }
      EXPECT_EQ(a.outputs[i].log_normalizer, b.outputs[i].log_normalizer);
    }
    for (std::size_t i = 0; i < seqs.size(); ++i) {  // each feeds its top token next
      seqs[i].start_pos += std::int64_t(seqs[i].tokens.size());
      seqs[i].tokens = {a.outputs[i].top[0].token};
    }
  }
  EXPECT_EQ(ranked.device_allocations(), allocs);
}

// The model split over 2 and 4 GPUs (as many as there are): greedy tokens of concurrent prompts
// equal the one-GPU engine's up to near ties (the ranks' partial sums round differently:
// expect_equal_up_to_near_ties, GpuEngine's rule).
TEST_P(GpuTensorParallel, SplitOverSeveralGpusGivesTheOneGpuEnginesTokens) {
  REQUIRE_GPU();
  const int devices = device_count();
  if (devices < 2 || !gpu_worker::device_collectives_built()) {
    GTEST_SKIP() << devices << " GPU(s)" << (gpu_worker::device_collectives_built() ? "" : ", no NCCL in this build")
                 << ": the split needs two or more";
  }
  const std::string path = synth_fixture(GetParam().shape, GetParam().mix);
  const model::llm m = model::load_llm(model::gguf_file::open(path));
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::uint32_t i = 0; i < 6; ++i) prompts.push_back(anvil::testing::random_prompt(3 + 17 * i, 50 + i));
  constexpr std::int64_t n = 32;
  engine_config cfg = anvil::testing::engine_cfg(worker_backend::gpu, path);
  cfg.gpu_float_activations = m.has_experts() || m.hp.has_recurrent();  // GpuEngine's reason: routing flips
  std::vector<std::vector<std::int32_t>> one;
  {
    auto eng = engine::create(cfg);
    one = anvil::testing::generate_all(*eng, prompts, n);
  }
  for (int ranks = 2; ranks <= std::min(devices, 4); ranks *= 2) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    if (const std::string why = model::tp_refusal(m, ranks); !why.empty()) {
      std::printf("[ %s over %d GPUs refused: %s ]\n", GetParam().shape, ranks, why.c_str());
      continue;
    }
    cfg.tensor_parallel = ranks;
    auto eng = engine::create(cfg);
    const std::uint64_t at_start = eng->stats().device_allocations;
    const auto split = anvil::testing::generate_all(*eng, prompts, n);
    EXPECT_EQ(eng->stats().device_allocations, at_start);
    const std::string what = "1 / " + std::to_string(ranks) + " GPUs";
    const int identical =
        anvil::testing::expect_equal_up_to_near_ties(m, prompts, one, split, n, kernels::kv_dtype::f16, what.c_str());
    std::printf("[ %s over %d GPUs: %d of %zu prompts identical ]\n", GetParam().shape, ranks, identical, prompts.size());
    EXPECT_TRUE(eng->healthy());
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GpuTensorParallel,
                         ::testing::Values(tp_case{"tiny", synth_mix::f32}, tp_case{"tiny-qwen2", synth_mix::q8_0},
                                           tp_case{"tiny-qwen3", synth_mix::f16}, tp_case{"tiny-qwen3moe", synth_mix::f16},
                                           tp_case{"tiny-qwen2moe", synth_mix::q8_0}, tp_case{"tiny-gpt-oss", synth_mix::mxfp4},
                                           tp_case{"tiny-gemma3", synth_mix::q8_0}, tp_case{"tiny-qwen35", synth_mix::f16},
                                           tp_case{"tiny-mistral3", synth_mix::q8_0}, tp_case{"tiny-gemma4", synth_mix::q8_0},
                                           tp_case{"tiny-gemma4moe", synth_mix::f16}),
                         [](const auto& p) { return name_of(p.param); });

}  // namespace
