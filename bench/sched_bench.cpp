// The scheduler's planning cost per step, the host-side work between two GPU steps: plan the KV
// batch, apply it in the KV core, build the step plan and absorb the sampled tokens, for N
// running sequences decoding. It must stay far below a GPU decode step (target < 50 us at 256
// sequences; a decode step of an 8B model on an H100 is ~10 ms).
#include <vector>

#include <benchmark/benchmark.h>

#include "kv/kv_core.h"
#include "sched/scheduler_core.h"

namespace {

void BM_sched_decode_step(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  anvil::sched::sched_config cfg;
  cfg.max_num_seqs = n;
  cfg.max_num_batched_tokens = 8192;
  cfg.max_queue = 4 * n;
  cfg.block_size = 16;
  cfg.max_model_len = 4096;
  anvil::sched::scheduler_core core(cfg);
  // Room for every sequence at its longest (200 prompt + 1000 generated tokens): the steady
  // state measured is decoding, not preemption.
  anvil::kv::kv_core kv({n * 1280 / 16 + 64, 16, true});
  std::uint64_t next_id = 1;
  auto submit_one = [&] {
    anvil::sched::request r;
    r.id = next_id++;
    r.prompt.assign(200, std::int32_t(r.id % 1000));
    r.max_tokens = 1000;  // finished requests are replaced, so n stay running
    r.ignore_eos = true;
    (void)core.submit(std::move(r));
  };
  for (std::int64_t i = 0; i < n; ++i) submit_one();
  std::vector<std::int32_t> sampled;
  auto one_step = [&] {
    const auto plan = core.plan_step(kv.apply(core.plan_kv()));
    sampled.clear();
    if (plan) {
      for (const auto& s : plan->seqs) {
        if (s.want_candidates) sampled.push_back(std::int32_t(s.start_pos % 1000));
      }
    }
    for (const auto& e : core.complete_step(sampled)) {
      if (e.finish != anvil::sched::finish_reason::none) submit_one();
    }
  };
  for (int i = 0; i < 10; ++i) one_step();  // through the prefill, into steady decoding
  for (auto _ : state) one_step();
  state.counters["seqs"] = double(n);
}
BENCHMARK(BM_sched_decode_step)->Arg(1)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
