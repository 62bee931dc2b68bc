// kv_core::apply per scheduler step, as the scheduler calls it: 256 running sequences decoding
// one token each — one batch of 256 reserves (a new block every block_size steps), one batch of
// 256 commits (each carrying the sequence's whole token list, as kv_messages.h asks; a block
// fills and is hashed every block_size steps). Timed around apply() only (manual time): building
// the batches is the scheduler's cost. The limit it is measured against is the step itself: a
// decode step of a small model takes milliseconds, and this bookkeeping should be a small
// fraction of one (the "budget_pct" counter assumes a 10 ms step).
#include <chrono>
#include <cstdint>
#include <vector>

#include <benchmark/benchmark.h>

#include "kv/kv_core.h"

namespace {

using namespace anvil::kv;
using clock_type = std::chrono::steady_clock;

constexpr std::int64_t n_seqs = 256, block_size = 16, decode_len = 1024;

struct decode_run {
  std::int64_t prompt_len;
  kv_core core;
  kv_batch reserves, commits;
  std::int64_t steps = 0;

  explicit decode_run(std::int64_t prompt)
      : prompt_len(prompt), core(kv_config{n_seqs * ((prompt + decode_len) / block_size + 2), block_size, true}) {
    restart();
  }

  // Every sequence starts over with a distinct prompt whose KV is computed.
  void restart() {
    for (const kv_op& op : reserves.ops) core.release(op.seq_id);
    reserves.ops.clear();
    commits.ops.clear();
    for (std::int64_t s = 0; s < n_seqs; ++s) {
      kv_op r, c;
      r.op = kv_op::kind::reserve;
      c.op = kv_op::kind::commit;
      r.seq_id = c.seq_id = static_cast<std::uint64_t>(s + 1);
      for (std::int64_t i = 0; i < prompt_len; ++i) c.tokens.push_back(static_cast<std::int32_t>(s * 100000 + i));
      r.n_tokens = prompt_len;
      core.begin(r.seq_id, c.tokens);
      (void)core.reserve(r.seq_id, prompt_len);
      core.commit(c.seq_id, c.tokens);
      reserves.ops.push_back(r);
      commits.ops.push_back(std::move(c));
    }
    steps = 0;
  }

  // The scheduler's side of one decode step: one more token per sequence.
  void advance() {
    if (++steps > decode_len) restart();
    for (std::size_t s = 0; s < reserves.ops.size(); ++s) {
      ++reserves.ops[s].n_tokens;
      commits.ops[s].tokens.push_back(static_cast<std::int32_t>(steps));
    }
  }
};

template <class Fn>
double timed(Fn&& fn) {
  const auto t0 = clock_type::now();
  fn();
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

void report(benchmark::State& state, double seconds_total) {
  const double per_step = seconds_total / static_cast<double>(state.iterations());
  state.counters["ns_per_seq"] = per_step * 1e9 / n_seqs;
  state.counters["budget_pct"] = per_step / 10e-3 * 100;
}

void BM_apply_256_reserves(benchmark::State& state) {
  decode_run run(state.range(0));
  double total = 0;
  for (auto _ : state) {
    run.advance();
    kv_batch_result r;
    const double t = timed([&] { r = run.core.apply(run.reserves); });
    benchmark::DoNotOptimize(r);
    run.core.apply(run.commits);
    state.SetIterationTime(t);
    total += t;
  }
  report(state, total);
}

void BM_apply_256_commits(benchmark::State& state) {
  decode_run run(state.range(0));
  double total = 0;
  for (auto _ : state) {
    run.advance();
    run.core.apply(run.reserves);
    kv_batch_result r;
    const double t = timed([&] { r = run.core.apply(run.commits); });
    benchmark::DoNotOptimize(r);
    state.SetIterationTime(t);
    total += t;
  }
  report(state, total);
}

BENCHMARK(BM_apply_256_reserves)->Arg(128)->Arg(2048)->UseManualTime();
BENCHMARK(BM_apply_256_commits)->Arg(128)->Arg(2048)->UseManualTime();

}  // namespace

BENCHMARK_MAIN();
