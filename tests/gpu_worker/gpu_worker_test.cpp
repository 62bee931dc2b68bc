// The GPU worker against the CPU worker (the reference forward pass) on `anvil synth` tiny models:
// the same step plans give the same candidates (within f16 tolerances), scores and perplexity agree,
// decode graphs give the eager steps' results, the whole engine on the
// GPU gives the CPU engine's greedy tokens, the device allocation count never moves under load,
// and the KV pool follows the memory fraction. Runs only where the runtime sees a GPU.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "gpu_worker/cpu_worker.h"
#include "gpu_worker/gpu_worker.h"
#include "gpu_worker/worker_perplexity.h"
#include "model/arch/cpu_forward.h"
#include "model/arch/perplexity.h"
#include "tests/gpu_worker/device_alloc_counter.h"
#include "tests/gpu_worker/gpu_engine_util.h"
#include "tests/model/fixtures.h"
#include "tests/model/reference_greedy.h"
#include "tests/sampler/edge_params.h"
#include "tests/sampler/random_schemas.h"

namespace {

using namespace anvil;
using namespace anvil::gpu_worker;
using model::synth_mix;
using model::testing::synth_fixture;
using anvil::testing::engine_cfg;
using anvil::testing::generate_all;
using anvil::testing::greedy_request;


step_result run(worker& w, const step_plan& p) {
  auto f = w.async_execute(p, boost::asio::use_future);
  return f.get();
}

std::vector<std::int32_t> random_tokens(std::size_t n, std::uint32_t seed, std::int32_t vocab = 256) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = std::int32_t(rng() % std::uint32_t(vocab));
  return t;
}

std::vector<std::int32_t> blocks(std::int32_t first, std::int32_t n) {
  std::vector<std::int32_t> b(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) b[std::size_t(i)] = first + i;
  return b;
}

// ---- (a) one step at a time, against the CPU worker ----

struct model_case {
  const char* shape;
  synth_mix mix;
  kernels::kv_dtype kv = kernels::kv_dtype::f16;  // both workers' KV cache elements
  bool float_activations = false;  // the GPU's GEMVs on f32 activations (always with an 8-bit cache)
};

std::string case_name(const model_case& c) {
  std::string n = std::string(c.shape) + "_" + std::string(model::synth_mix_name(c.mix));
  if (c.kv != kernels::kv_dtype::f16) n += "_kv_" + std::string(kernels::kv_dtype_name(c.kv));
  if (c.float_activations) n += "_f32_activations";
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

class GpuWorkerStep : public ::testing::TestWithParam<model_case> {};

// Compares one sequence's candidates: the log-normaliser, and the logit of every CPU top-8 token
// that the GPU lists too; the GPU's best token is the CPU's unless the CPU's top two are a near tie.
void expect_close(const seq_output& cpu, const seq_output& gpu, const std::string& where) {
  ASSERT_EQ(cpu.seq_id, gpu.seq_id) << where;
  ASSERT_FALSE(gpu.top.empty()) << where;
  float scale = 1.f;
  for (const candidate& c : cpu.top) scale = std::max(scale, std::fabs(c.logit));
  const float tol = 2e-2f * scale;
  EXPECT_NEAR(cpu.log_normalizer, gpu.log_normalizer, tol) << where;
  std::map<std::int32_t, float> g;
  for (const candidate& c : gpu.top) g[c.token] = c.logit;
  int matched = 0;
  for (std::size_t i = 0; i < std::min<std::size_t>(8, cpu.top.size()); ++i) {
    auto it = g.find(cpu.top[i].token);
    if (it == g.end()) continue;
    ++matched;
    EXPECT_NEAR(cpu.top[i].logit, it->second, tol) << where << " token " << cpu.top[i].token;
  }
  EXPECT_GE(matched, std::min<int>(6, int(cpu.top.size()))) << where;
  if (cpu.top.size() > 1 && cpu.top[0].logit - cpu.top[1].logit > tol) {
    EXPECT_EQ(cpu.top[0].token, gpu.top[0].token) << where;
  }
  EXPECT_NEAR(cpu.tail_mass, gpu.tail_mass, 2e-2f) << where;
}

void expect_close(const step_result& cpu, const step_result& gpu, const std::string& where) {
  ASSERT_EQ(cpu.outputs.size(), gpu.outputs.size()) << where;
  for (std::size_t i = 0; i < cpu.outputs.size(); ++i) {
    expect_close(cpu.outputs[i], gpu.outputs[i], where + " output " + std::to_string(i));
  }
}

TEST_P(GpuWorkerStep, CandidatesMatchTheCpuWorkerThroughPrefillForkAndDecode) {
  REQUIRE_GPU();
  const model_case mc = GetParam();
  const model::llm m = model::load_llm(model::gguf_file::open(synth_fixture(mc.shape, mc.mix)));
  cpu_worker cpu(m, {.block_size = 16, .kv_budget_bytes = 16u << 20, .max_batch_tokens = 256, .max_seqs = 16,
                     .kv_cache_dtype = mc.kv});
  gpu_worker_config gc;
  gc.block_size = 16;
  gc.max_batch_tokens = 256;
  gc.max_seqs = 16;
  gc.max_context = 512;
  gc.kv_budget_bytes = 16u << 20;
  gc.kv_cache_dtype = mc.kv;
  // An 8-bit cache rounds K and V to steps of up to 1/16 of a value (fp8): the GEMVs' 8-bit
  // activations, whose rounding moves K by ~1e-3, would move some codes by a whole step, so the
  // comparison of the caches runs on the f32 activations the CPU worker uses.
  gc.float_activations = mc.kv != kernels::kv_dtype::f16 || mc.float_activations;
  gpu_worker::gpu_worker gpu(m, gc);
  ASSERT_GE(gpu.plan().n_blocks, 64);
  const std::uint64_t allocs = gpu.device_allocations();

  // Step 1: three prefill chunks (GEMM path: 61 tokens) and a one-token prompt (decode kernel).
  std::map<std::uint64_t, seq_step> seqs;
  const auto add = [&](std::uint64_t id, std::size_t n, std::int32_t first_block, std::int32_t n_blocks) {
    seq_step s;
    s.seq_id = id;
    s.tokens = random_tokens(n, std::uint32_t(id));
    s.block_table = blocks(first_block, n_blocks);
    s.want_candidates = true;
    s.logits.top_k = 16;
    seqs[id] = s;
  };
  add(1, 20, 0, 4);
  add(2, 7, 4, 4);
  add(3, 33, 8, 4);
  add(4, 1, 12, 4);
  seqs[2].logits.temperature = 0.7f;  // the candidates' processing: penalties, bias, temperature
  seqs[2].logits.repetition_penalty = 1.3f;
  seqs[2].logits.presence_penalty = 0.5f;
  seqs[2].logits.token_counts = {{3, 2}, {17, 1}, {200, 4}};
  seqs[2].logits.logit_bias = {{5, 2.f}, {6, -100.f}};
  seqs[2].logits.seed = 42;
  step_plan p1;
  p1.step = 1;
  for (auto& [id, s] : seqs) p1.seqs.push_back(s);
  expect_close(run(cpu, p1), run(gpu, p1), std::string(mc.shape) + " step 1");

  // Step 2: a fork of seq 1 (copy-on-write of its first block into block 16) feeding 5 tokens
  // at position 16, plus one decode token for everybody else; the fork wants no candidates.
  step_plan p2;
  p2.step = 2;
  p2.copies = {{0, 16}};
  for (auto& [id, s] : seqs) {
    s.start_pos += std::int64_t(s.tokens.size());
    s.tokens = random_tokens(1, std::uint32_t(100 + id));
    p2.seqs.push_back(s);
  }
  seq_step fork;
  fork.seq_id = 5;
  fork.start_pos = 16;
  fork.tokens = random_tokens(5, 5);
  fork.block_table = {16, 17};
  p2.seqs.push_back(fork);
  expect_close(run(cpu, p2), run(gpu, p2), std::string(mc.shape) + " step 2");

  // Steps 3..10: decode only (GEMV path, 5 sequences); the fork now wants candidates.
  fork.want_candidates = true;
  seqs[5] = fork;
  for (int step = 3; step <= 10; ++step) {
    step_plan p;
    p.step = std::uint64_t(step);
    for (auto& [id, s] : seqs) {
      s.start_pos += std::int64_t(s.tokens.size());
      s.tokens = random_tokens(1, std::uint32_t(step * 1000 + id));
      p.seqs.push_back(s);
    }
    expect_close(run(cpu, p), run(gpu, p), std::string(mc.shape) + " step " + std::to_string(step));
  }
  EXPECT_EQ(gpu.device_allocations(), allocs);
}

INSTANTIATE_TEST_SUITE_P(
    Models, GpuWorkerStep,
    ::testing::Values(model_case{"tiny", synth_mix::f32}, model_case{"tiny", synth_mix::f16},
                      model_case{"tiny-qwen2", synth_mix::f16}, model_case{"tiny-qwen3", synth_mix::f16},
                      model_case{"tiny", synth_mix::q8_0}, model_case{"tiny-qwen3", synth_mix::q4_k_m},
                      // 8-bit KV caches on both sides (kernels/kv_quant.h): the copy-on-write of step 2
                      // carries the row scales, and the kernels read the codes as the reference does.
                      model_case{"tiny", synth_mix::f16, kernels::kv_dtype::int8},
                      model_case{"tiny-qwen3", synth_mix::f16, kernels::kv_dtype::fp8},
                      model_case{"tiny-qwen2", synth_mix::q4_k_m, kernels::kv_dtype::fp8},
                      // Mixtures of experts (kernels/moe.h): routed by pair on the device, the
                      // shared expert (qwen2moe), experts of two types (q4_k_m: gate/up Q4_K, down Q6_K).
                      model_case{"tiny-qwen3moe", synth_mix::q8_0}, model_case{"tiny-qwen2moe", synth_mix::f16},
                      model_case{"tiny-mixtral", synth_mix::q4_k_m},
                      // IQ4_XS (no integer path: the float GEMV, dequantized batches, float experts).
                      model_case{"tiny-qwen3moe", synth_mix::iq4_xs},
                      // gpt-oss: sinks, a window of 16 on layer 0 (prompts of 20 and 33 tokens), YaRN,
                      // biases everywhere, the clamped SwiGLU; experts in MXFP4 as it ships, and in F16.
                      model_case{"tiny-gpt-oss", synth_mix::mxfp4}, model_case{"tiny-gpt-oss", synth_mix::f16},
                      // gemma3: five sliding layers (window 16) with their own RoPE to one global, heads
                      // of 256 dims (the attention kernels' third size),
                      // the norms on each block's output, GeGLU, the scaled embedding, a tied head.
                      model_case{"tiny-gemma3", synth_mix::f16}, model_case{"tiny-gemma3", synth_mix::q4_k_m},
                      model_case{"tiny-gemma3", synth_mix::q8_0, kernels::kv_dtype::fp8},
                      // mistral3: YaRN, and the queries' temperature from position 32 on (the second
                      // prompt's last tokens and the decode steps).
                      model_case{"tiny-mistral3", synth_mix::q4_k_m},
                      // gemma4: sliding layers of 64-dim heads over two KV heads beside a global one of
                      // 128 on one KV head (each layer's K/V of its own shape in the pool), the global
                      // layer's V its K projection, V normed, the layer's output scale, the
                      // proportional RoPE's factors on the global layer only, soft-capped logits.
                      model_case{"tiny-gemma4", synth_mix::f16}, model_case{"tiny-gemma4", synth_mix::q4_k_m},
                      model_case{"tiny-gemma4", synth_mix::q8_0, kernels::kv_dtype::int8},
                      // gemma4 E2B / E4B's make: per-layer token embeddings, the last two layers (a
                      // sliding one and the last global) on the KV of layers 4 and 5, double-wide.
                      // Quantized weights on f32 activations and an int8 cache: each layer's
                      // per-layer block adds a third normed output to the residual, and the model
                      // carries rounding further than the others. Measured on the H200: 8-bit
                      // activations (Q8_0, Q4_K_M) moved top logits by up to 1.27x this tolerance,
                      // an fp8 cache (F16 and Q8_0) by up to 2.1x, from step 1 on, while F16 and
                      // f32 activations matched. Those paths are checked by their greedy tokens
                      // (GpuEngine below, the near-tie rule).
                      model_case{"tiny-gemma4e", synth_mix::f16},
                      model_case{"tiny-gemma4e", synth_mix::q4_k_m, kernels::kv_dtype::f16, true},
                      model_case{"tiny-gemma4e", synth_mix::q8_0, kernels::kv_dtype::int8},
                      // gemma4 with experts (the 26B-A4B's make): routed from the residual normed by its
                      // scale, each weight times its expert's scale, beside the dense feed-forward, gate
                      // and up the halves of one tensor. Q8_0 on f32 activations: on 8-bit ones two of
                      // five sequences took other experts from decode step 6 on (F16 and the first five
                      // steps matched), measured while synth's gemma4 router gave near-uniform logits,
                      // as the engine suites note for mixtures of experts.
                      model_case{"tiny-gemma4moe", synth_mix::f16},
                      model_case{"tiny-gemma4moe", synth_mix::q8_0, kernels::kv_dtype::f16, true}),
    [](const auto& param_info) { return case_name(param_info.param); });

// Models with recurrent layers (Qwen3.5's gated DeltaNet): each sequence's state in its slot, a
// prompt in two chunks continuing its state, then decode steps; no forks (a state is not shared).
TEST(GpuWorkerRecurrent, CandidatesMatchTheCpuWorkerThroughChunkedPrefillAndDecode) {
  REQUIRE_GPU();
  for (const model_case mc : {model_case{"tiny-qwen35", synth_mix::f16}, model_case{"tiny-qwen35", synth_mix::q4_k_m},
                              model_case{"tiny-qwen35moe", synth_mix::q8_0}}) {
    SCOPED_TRACE(case_name(mc));
    const model::llm m = model::load_llm(model::gguf_file::open(synth_fixture(mc.shape, mc.mix)));
    cpu_worker cpu(m, {.block_size = 16, .kv_budget_bytes = 16u << 20, .max_batch_tokens = 256, .max_seqs = 16});
    gpu_worker_config gc;
    gc.block_size = 16;
    gc.max_batch_tokens = 256;
    gc.max_seqs = 16;
    gc.max_context = 512;
    gc.kv_budget_bytes = 16u << 20;
    // Quantized weights: on the f32 activations the CPU worker uses, as the 8-bit ones' rounding
    // accumulates in the state from step to step (logits 0.17 to 0.3 apart by step 10 on int8).
    gc.float_activations = mc.mix != synth_mix::f16;
    gpu_worker::gpu_worker gpu(m, gc);
    ASSERT_EQ(gpu.plan().n_state_slots, cpu.plan().n_state_slots);
    ASSERT_GE(gpu.plan().n_state_slots, 4);
    const std::uint64_t allocs = gpu.device_allocations();
    std::map<std::uint64_t, seq_step> seqs;
    std::map<std::uint64_t, std::vector<std::int32_t>> prompt;
    const auto add = [&](std::uint64_t id, std::size_t n, std::int32_t first_block, std::int32_t slot) {
      seq_step s;
      s.seq_id = id;
      prompt[id] = random_tokens(n, std::uint32_t(id));
      s.tokens = prompt[id];
      s.block_table = blocks(first_block, 4);
      s.state_slot = slot;  // not in id order: any slot must do
      s.want_candidates = true;
      s.logits.top_k = 16;
      seqs[id] = s;
    };
    add(1, 20, 0, 3);
    add(2, 7, 4, 0);
    add(3, 33, 8, 2);
    add(4, 1, 12, 1);
    // Step 1: seq 3's first 16 tokens only (a chunk: no candidates).
    seqs[3].tokens.resize(16);
    seqs[3].want_candidates = false;
    step_plan p1;
    p1.step = 1;
    for (auto& [id, s] : seqs) p1.seqs.push_back(s);
    expect_close(run(cpu, p1), run(gpu, p1), case_name(mc) + " step 1");
    // Step 2: seq 3's other 17 tokens from its state at 16; one decode token for everybody else.
    step_plan p2;
    p2.step = 2;
    for (auto& [id, s] : seqs) {
      s.start_pos += std::int64_t(s.tokens.size());
      s.tokens = id == 3 ? std::vector<std::int32_t>(prompt[3].begin() + 16, prompt[3].end())
                         : random_tokens(1, std::uint32_t(100 + id));
      s.want_candidates = true;
      p2.seqs.push_back(s);
    }
    expect_close(run(cpu, p2), run(gpu, p2), case_name(mc) + " step 2");
    for (int step = 3; step <= 10; ++step) {  // decode only
      step_plan p;
      p.step = std::uint64_t(step);
      for (auto& [id, s] : seqs) {
        s.start_pos += std::int64_t(s.tokens.size());
        s.tokens = random_tokens(1, std::uint32_t(step * 1000 + id));
        p.seqs.push_back(s);
      }
      expect_close(run(cpu, p), run(gpu, p), case_name(mc) + " step " + std::to_string(step));
    }
    EXPECT_EQ(gpu.device_allocations(), allocs);
  }
}

TEST(GpuWorker, RefusesABrokenPlanWithoutRunningIt) {
  REQUIRE_GPU();
  const model::llm m = model::load_llm(model::gguf_file::open(synth_fixture("tiny", synth_mix::f16)));
  gpu_worker_config gc;
  gc.kv_budget_bytes = 4u << 20;
  gc.max_context = 256;
  gpu_worker::gpu_worker gpu(m, gc);
  step_plan p;
  seq_step s;
  s.tokens = {1, 2, 3};
  s.block_table = {std::int32_t(gpu.plan().n_blocks)};  // out of range
  p.seqs.push_back(s);
  auto f = gpu.async_execute(p, boost::asio::use_future);
  try {
    f.get();
    ADD_FAILURE() << "a block id out of range was accepted";
  } catch (const boost::system::system_error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::invalid_argument));
  }
  p.seqs[0].block_table = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  p.seqs[0].start_pos = 256;  // past max_context
  auto g = gpu.async_execute(p, boost::asio::use_future);
  EXPECT_THROW(g.get(), boost::system::system_error);
  // ... and the worker still runs a good one.
  p.seqs[0].start_pos = 0;
  p.seqs[0].want_candidates = true;
  EXPECT_EQ(run(gpu, p).outputs.size(), 1u);
}

// ---- decode graphs ----

// Decode steps replayed from the start-up graphs give what the same steps launched kernel by
// kernel give: batch sizes 1..6, contexts across attention splits (256 positions), sequences
// leaving and joining, a mixed prefill + decode step (eager) in between.
TEST(GpuWorker, DecodeGraphsGiveTheEagerStepsResults) {
  REQUIRE_GPU();
  for (const synth_mix mix : {synth_mix::f16, synth_mix::q8_0}) {
    const model::llm m = model::load_llm(model::gguf_file::open(synth_fixture("tiny", mix)));
    gpu_worker_config gc;
    gc.max_batch_tokens = 512;
    gc.max_seqs = 8;
    gc.max_context = 1024;
    gc.kv_budget_bytes = 16u << 20;
    gpu_worker_config eager_cfg = gc;
    eager_cfg.graph_max_batch = 0;
    gpu_worker::gpu_worker graphs(m, gc), eager(m, eager_cfg);
    EXPECT_EQ(graphs.plan().decode_graphs, 8);
    EXPECT_EQ(eager.plan().decode_graphs, 0);
    const std::uint64_t allocs = graphs.device_allocations();

    std::map<std::uint64_t, seq_step> seqs;
    std::int32_t next_block = 0;
    const auto add = [&](std::uint64_t id, std::size_t n) {
      seq_step s;
      s.seq_id = id;
      s.tokens = random_tokens(n, std::uint32_t(id));
      s.block_table = blocks(next_block, 64);  // the whole context of 1024
      next_block += 64;
      s.want_candidates = true;
      s.logits.top_k = 8;
      seqs[id] = s;
    };
    add(1, 300);  // past the first attention split
    add(2, 17);
    for (int step = 0; step <= 12; ++step) {
      if (step == 4) add(3, 40);         // joins with a prefill chunk: an eager mixed step
      if (step == 8) seqs.erase(2);      // leaves
      if (step >= 9) add(10 + std::uint64_t(step), 1);  // one-token prompts join as decode rows
      step_plan p;
      p.step = std::uint64_t(step);
      for (const auto& [id, s] : seqs) p.seqs.push_back(s);
      const step_result a = run(eager, p), b = run(graphs, p);
      ASSERT_EQ(a.outputs.size(), b.outputs.size());
      for (std::size_t i = 0; i < a.outputs.size(); ++i) {
        const std::string where = "step " + std::to_string(step) + " seq " + std::to_string(a.outputs[i].seq_id);
        const auto near = [](float x, float y) { return std::fabs(x - y) <= 1e-3f * std::max(1.f, std::fabs(x)); };
        EXPECT_EQ(a.outputs[i].top[0].token, b.outputs[i].top[0].token) << where;
        EXPECT_TRUE(near(a.outputs[i].log_normalizer, b.outputs[i].log_normalizer)) << where;
        for (std::size_t k = 0; k < std::min(a.outputs[i].top.size(), b.outputs[i].top.size()); ++k) {
          EXPECT_TRUE(near(a.outputs[i].top[k].logit, b.outputs[i].top[k].logit)) << where << " rank " << k;
        }
      }
      for (auto& [id, s] : seqs) {  // everybody decodes one token next
        s.start_pos += std::int64_t(s.tokens.size());
        s.tokens = random_tokens(1, std::uint32_t(step * 100 + int(id)));
      }
    }
    EXPECT_EQ(graphs.device_allocations(), allocs);
  }
}

// --gemm-dtype fp8: the plan counts the weights' FP8 copies; steps of 32+ tokens (prefill chunks,
// and decode batches of 32+ replayed from graphs captured with the FP8 GEMM in them) stay close to
// the f16 worker's — E4M3 operands, so a looser bound than the f16 paths' — and nothing is
// allocated after start-up. Both models stack q, k and v into one FP8 copy: qwen3 with its Q/K
// norms read in place from the stacked rows, qwen2 with its q/k/v biases stacked too; a worker
// with three copies per layer (fp8_stack_qkv off) runs beside it, so what the stacking itself
// changes (one scale for the three) is measured apart from what FP8 changes.

// The largest difference of b's logits and log-normaliser from a's, over the candidates both
// hold, relative to a's top logit; fails where a's top token leads by a clear margin and b's
// differs, or where fewer than 4 of 8 candidates are shared (the tiny models' random logits are
// flat past the first few).
float logit_gap(const step_result& a, const step_result& b, const std::string& where) {
  EXPECT_EQ(a.outputs.size(), b.outputs.size()) << where;
  float worst = 0.f;
  for (std::size_t i = 0; i < std::min(a.outputs.size(), b.outputs.size()); ++i) {
    const seq_output &x = a.outputs[i], &y = b.outputs[i];
    const std::string at = where + " seq " + std::to_string(x.seq_id);
    float scale = 1.f;
    for (const candidate& c : x.top) scale = std::max(scale, std::fabs(c.logit));
    std::map<std::int32_t, float> got;
    for (const candidate& c : y.top) got[c.token] = c.logit;
    int shared = 0;
    for (const candidate& c : x.top) {
      const auto it = got.find(c.token);
      if (it == got.end()) continue;
      ++shared;
      worst = std::max(worst, std::fabs(it->second - c.logit) / scale);
    }
    worst = std::max(worst, std::fabs(x.log_normalizer - y.log_normalizer) / scale);
    EXPECT_GE(shared, 4) << at;
    if (x.top.size() > 1 && x.top[0].logit - x.top[1].logit > 0.1f * scale) {
      EXPECT_EQ(x.top[0].token, y.top[0].token) << at;
    }
  }
  return worst;
}

TEST(GpuWorker, Fp8GemmStaysCloseToTheF16WorkerAndAllocatesNothingPerStep) {
  REQUIRE_GPU();
  for (const char* name : {"tiny-qwen3", "tiny-qwen2"}) {
    SCOPED_TRACE(name);
    const model::llm m = model::load_llm(model::gguf_file::open(synth_fixture(name, synth_mix::q4_k_m)));
    gpu_worker_config gc;
    gc.max_batch_tokens = 512;
    gc.max_seqs = 40;
    gc.graph_max_batch = 40;
    gc.max_context = 512;
    gc.kv_budget_bytes = 32u << 20;
    gpu_worker_config fp8_cfg = gc;
    fp8_cfg.gemm_dtype = kernels::gemm_dtype::fp8;
    std::unique_ptr<gpu_worker::gpu_worker> fp8;
    try {
      fp8 = std::make_unique<gpu_worker::gpu_worker>(m, fp8_cfg);
    } catch (const std::runtime_error& e) {
      ASSERT_NE(std::string(e.what()).find("FP8 tensor cores"), std::string::npos) << e.what();
      GTEST_SKIP() << e.what();
    }
    fp8_cfg.fp8_stack_qkv = false;
    gpu_worker::gpu_worker unstacked(m, fp8_cfg);
    gpu_worker::gpu_worker f16(m, gc);
    EXPECT_EQ(fp8->plan().gemm_dtype, kernels::gemm_dtype::fp8);
    EXPECT_GT(fp8->plan().fp8_weight_bytes, 0u);
    EXPECT_EQ(fp8->plan().fp8_stacked_layers, m.hp.n_layer);
    EXPECT_EQ(unstacked.plan().fp8_stacked_layers, 0);
    EXPECT_EQ(f16.plan().fp8_weight_bytes, 0u);
    EXPECT_EQ(fp8->plan().decode_graphs, 40) << "a decode graph with the FP8 GEMM in it failed to capture";
    ASSERT_GE(std::min(fp8->plan().n_blocks, f16.plan().n_blocks), 36 * 8);
    const std::uint64_t allocs = fp8->device_allocations();

    std::map<std::uint64_t, seq_step> seqs;
    for (std::uint64_t id = 1; id <= 36; ++id) {
      seq_step s;
      s.seq_id = id;
      s.tokens = random_tokens(id <= 3 ? 40 + id : 1, std::uint32_t(id));  // 3 prompts of 41-43 tokens, 33 of one
      s.block_table = blocks(std::int32_t(id - 1) * 8, 8);
      s.want_candidates = true;
      s.logits.top_k = 8;
      seqs[id] = s;
    }
    float worst = 0.f, worst_unstacked = 0.f;
    for (int step = 0; step < 6; ++step) {  // a mixed step of 159 tokens, then decode steps of 36
      step_plan p;
      p.step = std::uint64_t(step);
      for (const auto& [id, s] : seqs) p.seqs.push_back(s);
      const step_result a = run(f16, p), b = run(*fp8, p), c = run(unstacked, p);
      const std::string where = "step " + std::to_string(step);
      worst = std::max(worst, logit_gap(a, b, where + " stacked"));
      worst_unstacked = std::max(worst_unstacked, logit_gap(a, c, where + " unstacked"));
      for (auto& [id, s] : seqs) {
        s.start_pos += std::int64_t(s.tokens.size());
        s.tokens = random_tokens(1, std::uint32_t(step * 100 + int(id)));
      }
    }
    std::printf("[ fp8 GEMM against f16: largest logit / log-normaliser difference %.3g of the top logit "
                "(three copies per layer: %.3g) ]\n",
                worst, worst_unstacked);
    // Measured on an H200: qwen3 0.091 stacked, 0.078 with three copies; qwen2 0.148 and 0.128.
    // One scale for q, k and v moves every weight's rounding, not its precision: a worst case
    // within half again of the three copies' (plus a little for so few samples) is that noise.
    EXPECT_LT(worst, 0.2f);
    EXPECT_LT(worst, 1.5f * worst_unstacked + 0.02f);
    EXPECT_EQ(fp8->device_allocations(), allocs);
  }
}

// ---- scoring (perplexity, prompt log-probabilities) against the CPU worker ----

class GpuWorkerScores : public ::testing::TestWithParam<model_case> {};

TEST_P(GpuWorkerScores, LogprobsAndPerplexityMatchTheCpuWorker) {
  REQUIRE_GPU();
  const model_case mc = GetParam();
  const model::llm m = model::load_llm(model::gguf_file::open(synth_fixture(mc.shape, mc.mix)));
  cpu_worker cpu(m, {16, 16u << 20, 256, 16});
  for (const bool float_activations : {false, true}) {
    SCOPED_TRACE(float_activations ? "f32 activations" : "8-bit activations");
    gpu_worker_config gc;
    gc.max_batch_tokens = 256;
    gc.max_seqs = 16;  // 16 logit rows per head launch: 70 scored rows take 5 (the last one a GEMV)
    gc.max_context = 512;
    gc.kv_budget_bytes = 16u << 20;
    gc.float_activations = float_activations;
    gpu_worker::gpu_worker gpu(m, gc);
    const std::uint64_t allocs = gpu.device_allocations();

    // One step: a 70-token chunk scoring every other token and wanting candidates, a 3-token
    // chunk scoring all three, and a decode token scoring nothing.
    step_plan p;
    seq_step a;
    a.seq_id = 1;
    a.tokens = random_tokens(70, 11);
    a.block_table = blocks(0, 5);
    a.want_candidates = true;
    a.score_targets.assign(a.tokens.size(), -1);
    for (std::size_t j = 0; j < a.tokens.size(); j += 2) a.score_targets[j] = std::int32_t((j * 37) % 256);
    seq_step b;
    b.seq_id = 2;
    b.tokens = random_tokens(3, 12);
    b.block_table = blocks(5, 1);
    b.score_targets = {4, 5, 6};
    seq_step c;
    c.seq_id = 3;
    c.tokens = {9};
    c.block_table = blocks(6, 1);
    c.want_candidates = true;
    p.seqs = {a, b, c};
    const step_result want = run(cpu, p), got = run(gpu, p);
    expect_close(want, got, std::string(mc.shape) + " scoring step");
    ASSERT_EQ(got.scores.size(), 2u);
    for (std::size_t i = 0; i < 2; ++i) {
      ASSERT_EQ(got.scores[i].seq_id, want.scores[i].seq_id);
      ASSERT_EQ(got.scores[i].logprobs.size(), want.scores[i].logprobs.size());
      for (std::size_t j = 0; j < got.scores[i].logprobs.size(); ++j) {
        const float w = want.scores[i].logprobs[j], g = got.scores[i].logprobs[j];
        EXPECT_NEAR(g, w, 2e-2f * std::max(1.f, std::fabs(w))) << "seq " << i << " row " << j;
        if (w == 0.f) {
          EXPECT_EQ(g, 0.f) << "seq " << i << " row " << j << ": no target, no score";
        }
      }
    }

    // Perplexity through both workers on the same tokens: windows of 96 in chunks of 40.
    cpu_worker cpu_small(m, {16, 16u << 20, 40, 1});
    const std::vector<std::int32_t> text = random_tokens(400, 13);
    model::perplexity_options opt;
    opt.ctx = 96;
    opt.stride = 48;
    opt.batch = 40;
    const model::perplexity_result pc = gpu_worker::perplexity(cpu_small, text, opt, m.hp.n_ctx_train);
    const model::perplexity_result pg = gpu_worker::perplexity(gpu, text, opt, m.hp.n_ctx_train);
    std::printf("[ %s %s: perplexity CPU %.6f, GPU %.6f ]\n", mc.shape, float_activations ? "f32" : "int8",
                pc.perplexity(), pg.perplexity());
    EXPECT_EQ(pg.n_scored, pc.n_scored);
    EXPECT_NEAR(pg.perplexity(), pc.perplexity(), 1e-2 * pc.perplexity());
    EXPECT_EQ(gpu.device_allocations(), allocs);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GpuWorkerScores,
                         ::testing::Values(model_case{"tiny", synth_mix::f16}, model_case{"tiny", synth_mix::q8_0},
                                           model_case{"tiny-qwen3", synth_mix::q4_k_m},
                                           model_case{"tiny-gemma4", synth_mix::f16}),  // soft-capped logits
                         [](const auto& param_info) {
                           std::string n = std::string(param_info.param.shape) + "_" +
                                           std::string(model::synth_mix_name(param_info.param.mix));
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// ---- (d) the KV pool follows the memory fraction ----

// A mixture of experts is refused by the GPU worker with a message that names it and the way
// out, and an engine left to choose its backend runs such a model on the CPU.
TEST(GpuWorker, AutoRunsAMixtureOfExpertsOnTheGpu) {
  REQUIRE_GPU();
  engine_config cfg;
  cfg.model_path = synth_fixture("tiny-qwen3moe", synth_mix::q8_0);
  cfg.backend = worker_backend::automatic;
  cfg.kv_budget_bytes = 8u << 20;
  auto eng = engine::create(cfg);
  EXPECT_EQ(eng->backend(), worker_backend::gpu);
  const completion c = eng->async_generate(greedy_request({1, 2, 3}, 4), boost::asio::use_future).get();
  EXPECT_EQ(c.tokens.size(), 4u);
  EXPECT_TRUE(eng->healthy());
  eng->async_stop(boost::asio::use_future).get();
}

TEST(GpuWorker, KvPoolFollowsTheMemoryFractionAndTheCap) {
  REQUIRE_GPU();
  const model::llm m = model::load_llm(model::gguf_file::open(synth_fixture("tiny", synth_mix::f16)));
  const auto blocks_for = [&](double fraction, std::size_t cap) {
    gpu_worker_config gc;
    gc.memory_fraction = fraction;
    gc.kv_budget_bytes = cap;
    gpu_worker::gpu_worker gpu(m, gc);
    EXPECT_EQ(gpu.plan().kv_bytes % std::size_t(gpu.plan().n_blocks), 0u);
    return std::pair(gpu.plan().n_blocks, gpu.plan().kv_bytes);
  };
  const auto [n1, b1] = blocks_for(0.02, 0);
  const auto [n2, b2] = blocks_for(0.04, 0);
  std::printf("fraction 0.02: %lld blocks (%.2f GB); 0.04: %lld blocks (%.2f GB)\n", static_cast<long long>(n1),
              double(b1) / 1e9, static_cast<long long>(n2), double(b2) / 1e9);
  EXPECT_NEAR(double(n2) / double(n1), 2.0, 0.05);
  const std::size_t per_block = b1 / std::size_t(n1);
  EXPECT_EQ(per_block, std::size_t(m.hp.n_layer * 2 * 16 * m.hp.n_head_kv * m.hp.head_dim * 2));  // f16 K and V
  const auto [n3, b3] = blocks_for(0.5, 100 * per_block + per_block / 2);
  EXPECT_EQ(n3, 100);
  EXPECT_EQ(b3, 100 * per_block);
  // 8-bit caches: a byte per element and a float scale per row, so the same cap holds about twice
  // the blocks.
  for (const kernels::kv_dtype t : {kernels::kv_dtype::int8, kernels::kv_dtype::fp8}) {
    gpu_worker_config gc;
    gc.memory_fraction = 0.5;
    gc.kv_budget_bytes = 100 * per_block;
    gc.kv_cache_dtype = t;
    gpu_worker::gpu_worker gpu(m, gc);
    const std::size_t per_block8 = std::size_t(m.hp.n_layer * 2 * 16 * m.hp.n_head_kv * (m.hp.head_dim + 4));
    EXPECT_EQ(gpu.plan().n_blocks, std::int64_t(100 * per_block / per_block8)) << kernels::kv_dtype_name(t);
    EXPECT_EQ(gpu.plan().kv_bytes, std::size_t(gpu.plan().n_blocks) * per_block8);
    EXPECT_EQ(gpu.plan().kv_cache_dtype, t);
  }
}

// ---- (b), (c) the whole engine ----

class GpuEngine : public ::testing::TestWithParam<model_case> {};

TEST_P(GpuEngine, GreedyTokensEqualTheCpuEnginesForManyConcurrentPrompts) {
  REQUIRE_GPU();
  const model_case mc = GetParam();
  const std::string path = synth_fixture(mc.shape, mc.mix);
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::uint32_t i = 0; i < 6; ++i) prompts.push_back(random_tokens(3 + 17 * i, 50 + i));  // 3..88 tokens
  constexpr std::int64_t n = 40;
  std::vector<std::vector<std::int32_t>> on_cpu, on_gpu;
  engine_config cpu_cfg = engine_cfg(worker_backend::cpu, path), gpu_cfg = engine_cfg(worker_backend::gpu, path);
  cpu_cfg.kv_cache_dtype = gpu_cfg.kv_cache_dtype = mc.kv;
  const model::llm m = model::load_llm(model::gguf_file::open(path));
  const bool float_weights = mc.mix == synth_mix::f32 || mc.mix == synth_mix::f16;
  // A mixture of experts routes on the hidden state: the 8-bit activations' rounding (~1e-3 of a
  // row's scale) can flip a later layer's choice of experts, and the near-tie rule below, which
  // looks at the last layer's logits only, cannot see such a flip (tiny-qwen2moe Q4_K_M diverged
  // at a final gap of 0.39). So their GPU engine runs f32 activations here; the experts' integer
  // path is checked against the CPU worker step by step (GpuWorkerStep) and exactly against the
  // reference on rounded rows (moe_gpu_test).
  // The same for a model with recurrent layers (Qwen3.5): its state carries each step's rounding
  // into every later token (tiny-qwen35 Q8_0 diverged at final gaps of up to 0.09); the DeltaNet
  // kernels themselves are checked against their references (delta_net_gpu_test).
  if ((m.hp.n_expert > 0 || m.hp.has_recurrent()) && !float_weights) gpu_cfg.gpu_float_activations = true;
  {
    auto eng = engine::create(cpu_cfg);
    on_cpu = generate_all(*eng, prompts, n);
  }
  {
    auto eng = engine::create(gpu_cfg);
    ASSERT_EQ(eng->backend(), worker_backend::gpu);
    on_gpu = generate_all(*eng, prompts, n);
    EXPECT_TRUE(eng->healthy());
  }
  // Equal up to near ties (expect_equal_up_to_near_ties). Float weights (f16 KV the only
  // rounding) may flip at most one prompt; quantized weights run their decode GEMVs on 8-bit
  // activations (kernels/gemv.h), whose rounding (~1e-3 of a row's scale) flips more near ties, so
  // there only the near-tie rule holds.
  const int identical = anvil::testing::expect_equal_up_to_near_ties(m, prompts, on_cpu, on_gpu, n, mc.kv, "cpu / gpu");
  if (float_weights && mc.kv == kernels::kv_dtype::f16) {
    EXPECT_GE(identical, int(prompts.size()) - 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GpuEngine,
                         ::testing::Values(model_case{"tiny", synth_mix::f32}, model_case{"tiny-qwen3", synth_mix::f16},
                                           model_case{"tiny-qwen2", synth_mix::q4_k_m},
                                           model_case{"tiny-qwen3", synth_mix::f16, kernels::kv_dtype::fp8},
                                           model_case{"tiny-qwen3moe", synth_mix::f16},
                                           model_case{"tiny-qwen2moe", synth_mix::q4_k_m},
                                           model_case{"tiny-mixtral", synth_mix::q8_0},
                                           model_case{"tiny-gpt-oss", synth_mix::mxfp4},
                                           model_case{"tiny-gemma3", synth_mix::q8_0},
                                           model_case{"tiny-qwen35", synth_mix::q8_0},
                                           model_case{"tiny-qwen35moe", synth_mix::f16},
                                           model_case{"tiny-mistral3", synth_mix::q8_0},
                                           model_case{"tiny-gemma4", synth_mix::q8_0},
                                           model_case{"tiny-gemma4e", synth_mix::q4_k_m},
                                           model_case{"tiny-gemma4e", synth_mix::q8_0, kernels::kv_dtype::fp8},
                                           model_case{"tiny-gemma4moe", synth_mix::f16}),
                         [](const auto& param_info) { return case_name(param_info.param); });

// The window pool on the GPU (engine_config::window_pool, gpu_worker/kv_plan.h): the sliding
// layers keep only their window (16 positions here) in a pool of their own, through prompts of up
// to 88 tokens and 40 more generated; the tokens are those of every layer keeping everything,
// exactly (the kernels read the same K and V from other blocks), the window blocks all go back,
// and nothing is allocated after start-up. One request at a time, so that both runs batch the
// same way (concurrent requests batch as they arrive, and a step's row count picks its GEMV or
// GEMM path: GpuEngine above compares those with its near-tie rule, window pool on).
TEST(GpuEngineWindowPool, TheSlidingLayersWindowGivesTheTokensOfTheWholeCache) {
  REQUIRE_GPU();
  for (const model_case mc : {model_case{"tiny-gemma3", synth_mix::q8_0}, model_case{"tiny-gpt-oss", synth_mix::mxfp4},
                              model_case{"tiny-gemma3", synth_mix::f16, kernels::kv_dtype::fp8},
                              model_case{"tiny-gemma4", synth_mix::q8_0},     // layers of two KV shapes, each pool
                              model_case{"tiny-gemma4e", synth_mix::q8_0}}) {  // shared layers read their source's pool
    SCOPED_TRACE(case_name(mc));
    const std::string path = synth_fixture(mc.shape, mc.mix);
    std::vector<std::vector<std::int32_t>> prompts;
    for (std::uint32_t i = 0; i < 6; ++i) prompts.push_back(random_tokens(3 + 17 * i, 70 + i));  // 3..88 tokens
    std::vector<std::vector<std::int32_t>> whole, windowed;
    for (const bool window_pool : {false, true}) {
      engine_config cfg = engine_cfg(worker_backend::gpu, path);
      cfg.kv_cache_dtype = mc.kv;
      cfg.window_pool = window_pool;
      cfg.prefix_caching = false;  // the same schedule both ways
      auto eng = engine::create(cfg);
      const std::uint64_t allocations = eng->stats().device_allocations;
      for (const std::vector<std::int32_t>& p : prompts) {
        (window_pool ? windowed : whole).push_back(generate_all(*eng, {p}, 40).at(0));
      }
      const engine_stats st = eng->stats();
      EXPECT_EQ(st.kv.window_counts.total > 0, window_pool);
      EXPECT_EQ(st.kv.window_counts.in_use, 0);
      EXPECT_EQ(st.device_allocations, allocations);
      EXPECT_TRUE(eng->healthy());
    }
    EXPECT_EQ(windowed, whole);
  }
}

// --f16-weight-copies: the long steps' GEMMs multiply f16 copies made at start-up instead of
// dequantizing each weight on every step: the same values, so the same tokens, exactly; nothing is
// allocated after start-up. One request at a time (both runs batch the same way); prompts of up to
// 88 tokens take the GEMM path. The fp8 GEMM and the copies exclude each other.
TEST(GpuEngineF16Copies, LongStepsOnTheCopiesGiveTheTokensOfDequantizingEachStep) {
  REQUIRE_GPU();
  for (const model_case mc : {model_case{"tiny-qwen3", synth_mix::q4_k_m},
                              model_case{"tiny-gemma4e", synth_mix::q8_0},  // the per-layer inputs' matrices too
                              model_case{"tiny-qwen35", synth_mix::q8_0}}) {  // the DeltaNet projections
    SCOPED_TRACE(case_name(mc));
    const std::string path = synth_fixture(mc.shape, mc.mix);
    std::vector<std::vector<std::int32_t>> prompts;
    for (std::uint32_t i = 0; i < 4; ++i) prompts.push_back(random_tokens(20 + 23 * i, 90 + i));  // 20..89 tokens
    std::vector<std::vector<std::int32_t>> plain, copied;
    for (const bool copies : {false, true}) {
      engine_config cfg = engine_cfg(worker_backend::gpu, path);
      cfg.f16_weight_copies = copies;
      cfg.prefix_caching = false;
      auto eng = engine::create(cfg);
      const std::uint64_t allocations = eng->stats().device_allocations;
      for (const std::vector<std::int32_t>& p : prompts) (copies ? copied : plain).push_back(generate_all(*eng, {p}, 24).at(0));
      EXPECT_EQ(eng->stats().device_allocations, allocations);
      EXPECT_TRUE(eng->healthy());
    }
    EXPECT_EQ(copied, plain);
  }
  engine_config fp8 = engine_cfg(worker_backend::gpu, synth_fixture("tiny-qwen3", synth_mix::q4_k_m));
  fp8.f16_weight_copies = true;
  fp8.gemm_dtype = kernels::gemm_dtype::fp8;
  EXPECT_THROW((void)engine::create(fp8), std::exception);
}

// Overlapped steps on the device: a step planned ahead feeds the token the draw kernel chose
// (kernels/draw.h) in the step before, without it leaving the device's records first. Each
// request, run alone, gets exactly the tokens of serial steps for every kind of draw; the device
// clock timed the steps and the gaps between them.
TEST(GpuEngineOverlap, EachRequestAloneGetsTheTokensOfSerialStepsForEverySamplingKind) {
  REQUIRE_GPU();
  const std::string path = synth_fixture("tiny-qwen3", synth_mix::f16);
  std::map<bool, std::vector<std::vector<std::int32_t>>> runs;
  std::map<bool, sched::sched_stats> stats;
  for (const bool overlap : {false, true}) {
    engine_config cfg = engine_cfg(worker_backend::gpu, path);
    cfg.overlap_steps = overlap;
    auto eng = engine::create(cfg);
    ASSERT_EQ(eng->backend(), worker_backend::gpu);
    for (int i = 0; i < 12; ++i) {
      generate_request r = anvil::testing::sampling_kinds_request(random_tokens(4 + 9 * std::uint32_t(i), 300 + std::uint32_t(i)), i);
      r.max_tokens += 20;
      runs[overlap].push_back(eng->async_generate(std::move(r), boost::asio::use_future).get().tokens);
    }
    stats[overlap] = eng->stats().sched;
    EXPECT_TRUE(eng->healthy());
  }
  for (std::size_t i = 0; i < runs[true].size(); ++i) EXPECT_EQ(runs[true][i], runs[false][i]) << "request " << i;
  EXPECT_GT(stats[true].steps_ahead, 0);
  EXPECT_EQ(stats[false].steps_ahead, 0);
  for (const bool overlap : {false, true}) {
    const sched::sched_stats& s = stats[overlap];
    EXPECT_GT(s.timed_steps, 0) << overlap;
    EXPECT_GT(s.timed_gaps, 0) << overlap;
    EXPECT_GT(s.device_busy_us, 0) << overlap;
    EXPECT_GE(s.device_idle_us, 0) << overlap;
    std::printf("overlap %d: %lld steps (%lld ahead), busy %.1f us per step, idle %.1f us per gap\n", int(overlap),
                static_cast<long long>(s.steps), static_cast<long long>(s.steps_ahead),
                s.device_busy_us / double(s.timed_steps), s.device_idle_us / double(s.timed_gaps));
  }
}

// The one rule, against the runtime itself: after start-up no CUDA runtime call of anvil's
// allocates device or pinned memory (each is interposed and counted, device_alloc_counter.h) and
// the device's free memory does not move (what cuBLAS or the driver might allocate inside
// themselves) through 1,000 mixed requests — prefills of every length, decodes, sampled and
// greedy, logprobs — with cancels at every stage. The worker's own count must agree.
TEST(GpuEngineLoad, NoDeviceOrPinnedAllocationAfterStartUpThrough1000MixedRequestsWithCancels) {
  REQUIRE_GPU();
  const anvil::testing::runtime_allocations before_engine = anvil::testing::runtime_allocations_made();  // other tests' too
  auto eng = engine::create(engine_cfg(worker_backend::gpu, synth_fixture("tiny", synth_mix::q8_0)));
  const std::uint64_t at_start = eng->stats().device_allocations;
  ASSERT_GT(at_start, 0u);
  const anvil::testing::runtime_allocations runtime_at_start = anvil::testing::runtime_allocations_made();
  const std::size_t free_at_start = anvil::testing::device_free_bytes();
  if (anvil::testing::counted()) {
    // The interposition sees the worker's buffers (its count also holds the BLAS handle, whose
    // memory cuBLAS allocates inside itself: the free-memory check covers that kind).
    const std::uint64_t device = runtime_at_start.device - before_engine.device;
    const std::uint64_t pinned = runtime_at_start.pinned - before_engine.pinned;
    EXPECT_GT(device, 0u);
    EXPECT_GT(pinned, 0u);
    EXPECT_LE(device + pinned, at_start);
    EXPECT_GT(free_at_start, 0u);
  }
  std::mt19937 rng(7);
  std::vector<std::future<completion>> done;
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 1000; ++i) {
    auto prompt = random_tokens(1 + rng() % 120, std::uint32_t(i));
    const std::int64_t max_tokens = 1 + std::int64_t(rng() % 24);
    generate_request r = anvil::testing::mixed_request(std::move(prompt), max_tokens, i, std::int32_t(rng() % 256));
    auto p = std::make_shared<std::promise<completion>>();
    done.push_back(p->get_future());
    auto id = eng->submit(std::move(r), [p, c = completion{}](const stream_event& e) mutable {
      c.tokens.insert(c.tokens.end(), e.tokens.begin(), e.tokens.end());
      if (e.done) {
        c.finish_reason = e.finish_reason;
        p->set_value(c);
      }
    });
    ASSERT_TRUE(id.has_value());
    ids.push_back(*id);
    if (i % 5 == 4) eng->cancel(ids[rng() % ids.size()]);  // queued, prefilling, decoding or done
    if (i % 40 == 39) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  int cancelled = 0, finished = 0;
  for (auto& f : done) {
    const completion c = f.get();
    (c.finish_reason == "cancelled" ? cancelled : finished)++;
    EXPECT_NE(c.finish_reason, "error");
  }
  engine_stats s = eng->stats();
  for (int i = 0; i < 200 && s.kv.counts.in_use != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s = eng->stats();
  }
  const anvil::testing::runtime_allocations runtime_after = anvil::testing::runtime_allocations_made();
  const std::size_t free_after = anvil::testing::device_free_bytes();
  std::printf("1000 requests: %d finished, %d cancelled; worker allocations %llu; runtime calls so far in this process "
              "at start-up: %llu device, %llu pinned; after: %llu device, %llu pinned; free device memory %zu -> %zu bytes\n",
              finished, cancelled, static_cast<unsigned long long>(at_start),
              static_cast<unsigned long long>(runtime_at_start.device), static_cast<unsigned long long>(runtime_at_start.pinned),
              static_cast<unsigned long long>(runtime_after.device), static_cast<unsigned long long>(runtime_after.pinned),
              free_at_start, free_after);
  EXPECT_TRUE(s.healthy);
  EXPECT_EQ(s.device_allocations, at_start);
  EXPECT_EQ(runtime_after, runtime_at_start);
  EXPECT_EQ(free_after, free_at_start);
  EXPECT_EQ(s.kv.counts.in_use, 0);
  eng->async_stop(boost::asio::use_future).get();
  if (anvil::testing::counted()) {  // and the interposition is live: one stray call is seen
    ASSERT_TRUE(anvil::testing::allocate_and_free_once());
    EXPECT_EQ(anvil::testing::runtime_allocations_made().device, runtime_after.device + 1);
  }
}

// The sampling-edge property test (tests/sampler/edge_params.h) through the GPU engine: the
// issue's temperature and repetition_penalty of 1e-38 and 1,000 random accepted parameter sets
// end normally, so does a greedy request in the same steps, and the engine stays healthy.
TEST(GpuEngineEdges, AcceptedSamplingParametersNeverFailAStep) {
  REQUIRE_GPU();
  const std::string path = synth_fixture("tiny", synth_mix::q8_0);
  auto eng = engine::create(engine_cfg(worker_backend::gpu, path));
  const std::int32_t vocab = std::int32_t(eng->tokenizer().n_vocab());
  std::mt19937_64 rng(20261124);
  std::vector<std::future<completion>> done;
  std::vector<std::string> what;
  for (int i = 0; i < 1002; ++i) {
    generate_request r = greedy_request(random_tokens(1 + rng() % 40, std::uint32_t(i)), 1 + std::int64_t(rng() % 3));
    if (i == 0) {
      r.sampling.temperature = 1e-38f;
    } else if (i == 1) {
      r.sampling.temperature = 1.f;
      r.sampling.repetition_penalty = 1e-38f;
    } else {
      r.sampling = anvil::testing::edge_sampling_params(rng, vocab);
    }
    what.push_back("request " + std::to_string(i) + ": temperature " + std::to_string(double(r.sampling.temperature)) +
                   " repetition " + std::to_string(double(r.sampling.repetition_penalty)));
    done.push_back(eng->async_generate(std::move(r), boost::asio::use_future));
  }
  const std::vector<std::int32_t> prompt = random_tokens(11, 99);
  auto bystander = eng->async_generate(greedy_request(prompt, 4), boost::asio::use_future);
  int ended = 0;
  for (std::size_t i = 0; i < done.size(); ++i) {
    const completion c = done[i].get();
    EXPECT_TRUE(c.finish_reason == "length" || c.finish_reason == "stop") << what[i] << ": " << c.finish_reason;
    ended += c.finish_reason == "length" || c.finish_reason == "stop";
  }
  const completion b = bystander.get();
  EXPECT_EQ(b.finish_reason, "length");
  EXPECT_EQ(b.tokens.size(), 4u);
  std::printf("sampling edges on the GPU engine: %d of %zu requests ended normally\n", ended, done.size());
  EXPECT_TRUE(eng->healthy());
  EXPECT_EQ(eng->stats().requests.finished_error, 0u);
  eng->async_stop(boost::asio::use_future).get();
}

// Structured output on the GPU: the mask reaches the candidates op, so greedy and sampled
// outputs under random schemas (the engine suite's generator) parse and validate, as on the CPU,
// and greedy ones are the CPU engine's tokens.
TEST(GpuEngineStructured, RandomSchemasValidateAndGreedyOutputsMatchTheCpuEngine) {
  REQUIRE_GPU();
  const std::string path = synth_fixture("tiny", synth_mix::f32);
  anvil::testing::schema_gen gen(9090);
  std::vector<boost::json::value> schemas;
  for (int i = 0; i < 48; ++i) schemas.push_back(gen.schema(3));
  std::map<worker_backend, engine_stats> stats;
  const auto run = [&](worker_backend b) {
    engine_config cfg = engine_cfg(b, path);
    cfg.max_model_len = 2048;
    cfg.kv_budget_bytes = cfg.gpu_kv_budget_bytes = 64u << 20;
    auto eng = engine::create(cfg);
    std::vector<std::future<completion>> fs;
    for (std::size_t i = 0; i < schemas.size(); ++i) {
      generate_request r;
      r.prompt_tokens = random_tokens(5, 700 + std::uint32_t(i));
      r.max_tokens = 1500;
      r.sampling.temperature = i % 2 ? 1.f : 0.f;
      r.sampling.seed = i;
      r.constraint = {.what = structured_output::kind::json_schema, .spec = boost::json::serialize(schemas[i]),
                      .field = "response_format"};
      fs.push_back(eng->async_generate(std::move(r), boost::asio::use_future));
    }
    std::vector<completion> out;
    for (auto& f : fs) out.push_back(f.get());
    stats[b] = eng->stats();
    eng->async_stop(boost::asio::use_future).get();
    return out;
  };
  const std::vector<completion> cpu = run(worker_backend::cpu), gpu = run(worker_backend::gpu);
  // Constrained steps are planned ahead, their masks sent once the step before has completed.
  for (const worker_backend b : {worker_backend::cpu, worker_backend::gpu}) {
    EXPECT_GT(stats[b].sched.steps_ahead, stats[b].sched.steps / 2) << stats[b].sched.steps;
  }
  int same = 0, greedy = 0;
  for (std::size_t i = 0; i < schemas.size(); ++i) {
    SCOPED_TRACE(boost::json::serialize(schemas[i]));
    EXPECT_EQ(gpu[i].finish_reason, "stop") << gpu[i].text;
    boost::json::error_code ec;
    const boost::json::value v = boost::json::parse(gpu[i].text, ec);
    ASSERT_FALSE(ec) << gpu[i].text;
    EXPECT_TRUE(anvil::testing::validates(v, schemas[i])) << gpu[i].text;
    if (i % 2 == 0) {
      ++greedy;
      same += gpu[i].tokens == cpu[i].tokens;
    }
  }
  std::printf("  structured greedy outputs equal to the CPU engine's: %d of %d\n", same, greedy);
  EXPECT_GE(same, greedy - 2);  // f32 model: only a near tie could part them
}

}  // namespace

