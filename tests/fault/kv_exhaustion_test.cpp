// KV exhaustion under oversubscription: a pool of a few blocks per sequence, many concurrent
// greedy requests needing several times the pool. Preemption (by recompute) must happen, nothing
// may crash or hang, every request completes, and each output — streamed or not — is exactly the
// one the request gets alone. A request larger than the whole pool is cut to what the pool holds
// instead of being preempted forever.
#include <future>
#include <memory>
#include <random>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include "tests/fault/engine_helpers.h"

namespace {

using namespace anvil;
using namespace anvil::testing;
namespace asio = boost::asio;

struct job {
  std::vector<std::int32_t> prompt;
  std::int64_t max_tokens = 0;
  std::unique_ptr<stream_log> streamed;      // streamed requests
  std::future<stream_event> streamed_done;
  std::future<completion> whole;             // non-streamed requests
};

// Runs `jobs` all at once on `eng`, half streamed and half not; checks every output against the
// request run alone on the reference forward pass (of `m`; null: the tiny model's).
void run_and_check(engine& eng, std::vector<job>& jobs, const model::llm* m = nullptr) {
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    job& j = jobs[i];
    if (i % 2 == 0) {
      j.streamed = std::make_unique<stream_log>();
      j.streamed_done = j.streamed->done_future();
      ASSERT_TRUE(eng.submit(greedy_request(j.prompt, j.max_tokens), j.streamed->handler()));
    } else {
      j.whole = eng.async_generate(greedy_request(j.prompt, j.max_tokens), asio::use_future);
    }
  }
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    job& j = jobs[i];
    const std::vector<std::int32_t> alone =
        m ? model::testing::reference_greedy(*m, j.prompt, j.max_tokens) : reference_greedy(j.prompt, j.max_tokens);
    if (j.streamed) {
      const stream_event last = get_within(j.streamed_done, "a streamed request under KV pressure");
      EXPECT_EQ(last.finish_reason, "length") << i;
      EXPECT_EQ(last.usage.completion_tokens, j.max_tokens) << i;
      EXPECT_EQ(j.streamed->tokens(), alone) << i << ": tokens repeated or lost across a preemption";
    } else {
      const completion c = get_within(j.whole, "a non-streamed request under KV pressure");
      EXPECT_EQ(c.finish_reason, "length") << i;
      EXPECT_EQ(c.tokens, alone) << i;
    }
  }
}

TEST(KvExhaustion, ManyRequestsOnATinyPoolAllCompleteWithTheirSoloOutputs) {
  // 12 blocks of 16 tokens; 16 requests of 3 to 7 blocks each need about seven pools at once.
  engine_config cfg = tiny_engine_config(kv_bytes_for_blocks(12));
  cfg.max_prefill_chunk = 16;
  std::vector<job> jobs(16);  // before the engine: it must stop before they go (a failing test unwinds)
  auto eng = engine::create(cfg);
  std::mt19937 rng(17);
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].prompt = random_prompt(20 + rng() % 41, std::uint32_t(1000 + i));
    jobs[i].max_tokens = 20 + std::int64_t(rng() % 21);
  }
  run_and_check(*eng, jobs);
  const engine_stats s = settled_stats(*eng);
  EXPECT_GT(s.sched.preemptions, 0);
  EXPECT_EQ(s.kv.counts.total, 12);
  EXPECT_EQ(s.kv.counts.in_use, 0);
  EXPECT_EQ(s.kv.counts.free + s.kv.counts.cached, s.kv.counts.total);
  EXPECT_EQ(s.live_requests, 0);
  EXPECT_TRUE(s.healthy);
  stop_within_limit(*eng);
}

TEST(KvExhaustion, SharedPrefixesSurvivePreemptionAndEviction) {
  // Twelve requests share a three-block prefix; ten blocks in all, prefix caching on: shared,
  // cached and evicted blocks churn while sequences are preempted and recompute.
  engine_config cfg = tiny_engine_config(kv_bytes_for_blocks(10));
  cfg.max_prefill_chunk = 16;
  std::vector<job> jobs(12);  // before the engine: it must stop before they go (a failing test unwinds)
  auto eng = engine::create(cfg);
  const std::vector<std::int32_t> prefix = random_prompt(48, 5);
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].prompt = prefix;
    const auto tail = random_prompt(3 + i, std::uint32_t(2000 + i));
    jobs[i].prompt.insert(jobs[i].prompt.end(), tail.begin(), tail.end());
    jobs[i].max_tokens = 30;
  }
  run_and_check(*eng, jobs);
  const engine_stats s = settled_stats(*eng);
  EXPECT_GT(s.sched.preemptions, 0);
  EXPECT_GT(s.sched.cached_prompt_tokens, 0);
  EXPECT_EQ(s.kv.counts.in_use, 0);
  EXPECT_EQ(s.kv.counts.free + s.kv.counts.cached, s.kv.counts.total);
  stop_within_limit(*eng);
}

TEST(KvExhaustion, OneSequencePerPoolStillServesEveryone) {
  // Three blocks: each request (24 + 20 tokens) needs all of them, so they take turns.
  engine_config cfg = tiny_engine_config(kv_bytes_for_blocks(3));
  cfg.max_prefill_chunk = 16;
  std::vector<job> jobs(6);  // before the engine: it must stop before they go (a failing test unwinds)
  auto eng = engine::create(cfg);
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].prompt = random_prompt(24, std::uint32_t(3000 + i));
    jobs[i].max_tokens = 20;
  }
  run_and_check(*eng, jobs);
  const engine_stats s = settled_stats(*eng);
  EXPECT_GT(s.sched.preemptions, 0);
  EXPECT_EQ(s.kv.counts.in_use, 0);
  stop_within_limit(*eng);
}

TEST(KvExhaustion, BothPoolsOfASlidingWindowModelUnderPressureGiveEveryRequestItsSoloOutput) {
  // tiny-gemma3: five sliding layers (window 16) to one global. A window pool of 12 blocks (4
  // sequences' windows at a time) beside a main pool of 60 (960 positions); 16 requests of 40 to
  // 100 positions need several of each at once, so preemption comes from either pool.
  const std::string path = model::testing::synth_fixture("tiny-gemma3", model::synth_mix::f32);
  const model::llm m = model::load_llm(model::gguf_file::open(path));
  using storage = model::kv_cache_storage;
  const std::size_t window_block = storage::bytes_per_block(m.hp, 16, kernels::kv_dtype::f16, true, true);
  const std::size_t main_block = storage::bytes_per_block(m.hp, 16, kernels::kv_dtype::f16, true, false);
  engine_config cfg = tiny_engine_config(2 * 12 * window_block);
  cfg.model_path = path;
  cfg.max_prefill_chunk = 16;
  std::vector<job> jobs(16);  // before the engine: it must stop before they go (a failing test unwinds)
  auto eng = engine::create(cfg);
  std::mt19937 rng(23);
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].prompt = random_prompt(20 + rng() % 41, std::uint32_t(4000 + i));
    jobs[i].max_tokens = 20 + std::int64_t(rng() % 41);
  }
  run_and_check(*eng, jobs, &m);
  const engine_stats s = settled_stats(*eng);
  EXPECT_GT(s.sched.preemptions, 0);
  EXPECT_EQ(s.kv.window_counts.total, 12);
  EXPECT_EQ(s.kv.counts.total, std::int64_t(12 * window_block / main_block));
  EXPECT_EQ(s.kv.counts.in_use, 0);
  EXPECT_EQ(s.kv.window_counts.in_use, 0);
  EXPECT_EQ(s.kv.window_counts.free, s.kv.window_counts.total);
  EXPECT_EQ(s.live_requests, 0);
  EXPECT_TRUE(s.healthy);
  stop_within_limit(*eng);
}

TEST(KvExhaustion, ARecurrentModelUnderPressureGivesEveryRequestItsSoloOutput) {
  // tiny-qwen35: three gated DeltaNet layers (a state slot per sequence) to one attention layer.
  // A budget of eight slots' bytes: half of it for four slots (so four sequences at once), the
  // rest a main pool of 14 blocks (224 positions); 16 requests of 40 to 100 positions: preempted
  // sequences start their state afresh when they recompute.
  const std::string path = model::testing::synth_fixture("tiny-qwen35", model::synth_mix::f32);
  const model::llm m = model::load_llm(model::gguf_file::open(path));
  using storage = model::kv_cache_storage;
  const std::size_t per_slot = storage::bytes_per_state_slot(m.hp), block = storage::bytes_per_block(m.hp, 16);
  engine_config cfg = tiny_engine_config(8 * per_slot);
  ASSERT_EQ(4 * per_slot / block, 14u);
  cfg.model_path = path;
  cfg.max_seqs = 4;
  cfg.max_prefill_chunk = 16;
  std::vector<job> jobs(16);  // before the engine: it must stop before they go (a failing test unwinds)
  auto eng = engine::create(cfg);
  std::mt19937 rng(29);
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].prompt = random_prompt(20 + rng() % 41, std::uint32_t(5000 + i));
    jobs[i].max_tokens = 20 + std::int64_t(rng() % 41);
  }
  run_and_check(*eng, jobs, &m);
  const engine_stats s = settled_stats(*eng);
  EXPECT_GT(s.sched.preemptions, 0);
  EXPECT_EQ(s.kv.state_counts.total, 4);
  EXPECT_EQ(s.kv.state_counts.in_use, 0);
  EXPECT_EQ(s.kv.counts.total, 14);
  EXPECT_EQ(s.kv.counts.in_use, 0);
  EXPECT_EQ(s.live_requests, 0);
  EXPECT_TRUE(s.healthy);
  stop_within_limit(*eng);
}

TEST(KvExhaustion, AWindowPoolTooSmallForOneSequenceIsRefusedAtStartUp) {
  const std::string path = model::testing::synth_fixture("tiny-gemma3", model::synth_mix::f32);
  const model::hparams hp = model::read_hparams(model::gguf_file::open(path));
  // A 2-block window pool: one sequence needs ceil((16 - 1 + 64) / 16) + 2 = 7 blocks at the default
  // chunk here.
  engine_config cfg = tiny_engine_config(2 * 2 * model::kv_cache_storage::bytes_per_block(hp, 16, kernels::kv_dtype::f16, true, true));
  cfg.model_path = path;
  try {
    (void)engine::create(cfg);
    ADD_FAILURE() << "a window pool of 2 blocks was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("--no-window-pool"), std::string::npos) << e.what();
  }
  cfg.window_pool = false;  // every layer in one pool: runs
  auto eng = engine::create(cfg);
  stop_within_limit(*eng);
}

TEST(KvExhaustion, ARequestLargerThanThePoolIsCutToItInsteadOfRecomputingForever) {
  // Four blocks hold 64 positions; the context the engine offers is what its pool holds.
  engine_config cfg = tiny_engine_config(kv_bytes_for_blocks(4));
  auto eng = engine::create(cfg);
  EXPECT_EQ(eng->max_model_len(), 64);
  const auto prompt = random_prompt(30, 7);
  auto f = eng->async_generate(greedy_request(prompt, 100), asio::use_future);
  const completion c = get_within(f, "a request larger than the KV pool");
  EXPECT_EQ(c.finish_reason, "length");
  EXPECT_EQ(c.tokens, reference_greedy(prompt, 64 - 30));
  auto too_long = eng->submit(greedy_request(random_prompt(64, 8), 4), nullptr);
  ASSERT_FALSE(too_long);
  EXPECT_EQ(too_long.error(), make_error_code(errc::context_overflow));
  EXPECT_NE(eng->explain(greedy_request(random_prompt(64, 8), 4)).find("the context holds 64"), std::string::npos);
  stop_within_limit(*eng);
}

}  // namespace
