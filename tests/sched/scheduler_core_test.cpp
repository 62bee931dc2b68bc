// scheduler_core without Asio: each step is driven by hand through the real kv_core, with a fake
// "sampler" that picks a token from the sequence id and position.
#include "sched/scheduler_core.h"

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "kv/kv_core.h"
#include "sampler/structured/regex.h"
#include "sampler/structured/token_masks.h"

namespace {

using namespace anvil;
using namespace anvil::sched;

// The fake sampler's choice for a sequence that asked for candidates: with a mask (constrained
// decoding), the allowed token at (position mod their number), else a token from the sequence id
// and the position. Like the real ones, it depends only on the sequence, the position and the mask.
std::int32_t choose(const gpu_worker::seq_step& s, const std::vector<std::uint32_t>& mask) {
  const std::int64_t pos = s.start_pos + std::int64_t(s.tokens.size());
  if (mask.empty()) return std::int32_t((s.seq_id * 7 + std::uint64_t(pos)) % 50 + 1);
  std::vector<std::int32_t> allowed;
  for (std::size_t t = 0; t < mask.size() * 32; ++t) {
    if ((mask[t / 32] >> (t % 32)) & 1u) allowed.push_back(std::int32_t(t));
  }
  EXPECT_FALSE(allowed.empty()) << "seq " << s.seq_id << ": a mask allows nothing";
  return allowed.empty() ? 0 : allowed[std::size_t(pos) % allowed.size()];
}

struct driver {
  scheduler_core core;
  kv::kv_core kv;
  std::vector<gpu_worker::step_plan> plans;
  std::map<std::uint64_t, std::vector<std::int32_t>> generated;
  std::map<std::uint64_t, finish_reason> finished;

  driver(sched_config cfg, std::int64_t n_blocks) : core(cfg), kv(kv::kv_config{n_blocks, cfg.block_size, cfg.prefix_caching}) {}

  static request req(std::uint64_t id, std::size_t prompt_len, std::int64_t max_tokens, std::int32_t priority = 0) {
    request r;
    r.id = id;
    for (std::size_t i = 0; i < prompt_len; ++i) r.prompt.push_back(std::int32_t((id * 31 + i) % 200));
    r.max_tokens = max_tokens;
    r.priority = priority;
    return r;
  }

  // One step; returns false when nothing ran.
  bool step() {
    const kv::kv_batch batch = core.plan_kv();
    const kv::kv_batch_result res = kv.apply(batch);
    EXPECT_EQ(kv.check(), "");
    const auto plan = core.plan_step(res);
    record(core.take_events());
    if (!plan) return false;
    plans.push_back(*plan);
    std::vector<std::int32_t> sampled;
    for (const auto& s : plan->seqs) {
      if (s.want_candidates) sampled.push_back(choose(s, s.logits.allowed));
    }
    record(core.complete_step(sampled));
    return true;
  }
  void record(const std::vector<seq_event>& events) {
    for (const seq_event& e : events) {
      if (e.token >= 0) generated[e.id].push_back(e.token);
      if (e.finish != finish_reason::none) finished[e.id] = e.finish;
    }
  }
  void run(int max_steps = 10000) {
    for (int i = 0; i < max_steps && core.has_work(); ++i) step();
    // Let the last releases through.
    if (!core.has_work()) {
      kv.apply(core.plan_kv());
    }
  }
};

sched_config small_config() {
  sched_config c;
  c.max_num_batched_tokens = 32;
  c.max_num_seqs = 4;
  c.max_prefill_chunk = 16;
  c.block_size = 4;
  c.max_model_len = 512;
  return c;
}

TEST(SchedulerCore, ChunkedPrefillNeverStallsRunningDecodes) {
  driver d(small_config(), 200);
  ASSERT_FALSE(d.core.submit(driver::req(1, 3, 40)));
  d.step();  // seq 1 prefills and produces its first token
  ASSERT_FALSE(d.core.submit(driver::req(2, 100, 4)));
  for (int i = 0; i < 6; ++i) d.step();
  for (std::size_t i = 1; i < d.plans.size(); ++i) {
    const auto& p = d.plans[i];
    std::int64_t tokens = 0;
    bool decode_of_1 = false;
    for (const auto& s : p.seqs) {
      tokens += std::int64_t(s.tokens.size());
      EXPECT_LE(std::int64_t(s.tokens.size()), 16) << "a prefill chunk larger than max_prefill_chunk";
      if (s.seq_id == 1) decode_of_1 = s.tokens.size() == 1 && s.want_candidates;
    }
    EXPECT_LE(tokens, 32) << "step " << i << " is over the token budget";
    EXPECT_TRUE(decode_of_1) << "step " << i << " left the running sequence out";
  }
}

TEST(SchedulerCore, RespectsTheSequenceCap) {
  driver d(small_config(), 200);
  for (std::uint64_t id = 1; id <= 10; ++id) ASSERT_FALSE(d.core.submit(driver::req(id, 2, 3)));
  d.step();
  EXPECT_EQ(d.plans[0].seqs.size(), 4u);
  d.run();
  EXPECT_EQ(d.finished.size(), 10u);
  for (const auto& [id, why] : d.finished) EXPECT_EQ(why, finish_reason::length) << id;
  EXPECT_EQ(d.kv.stats().counts.in_use, 0);
}

TEST(SchedulerCore, PreemptsTheNewestWhenKvIsExhaustedAndOutputsAreUnchanged) {
  // Alone, each request gets the same tokens: the fake sampler depends on id and position only.
  std::map<std::uint64_t, std::vector<std::int32_t>> alone;
  for (std::uint64_t id = 1; id <= 3; ++id) {
    driver d(small_config(), 200);
    ASSERT_FALSE(d.core.submit(driver::req(id, 6, 30)));
    d.run();
    alone[id] = d.generated[id];
  }
  driver d(small_config(), 16);  // 64 slots: three sequences of 36 tokens cannot all fit
  for (std::uint64_t id = 1; id <= 3; ++id) ASSERT_FALSE(d.core.submit(driver::req(id, 6, 30)));
  d.run();
  EXPECT_GT(d.core.stats().preemptions, 0);
  for (std::uint64_t id = 1; id <= 3; ++id) EXPECT_EQ(d.generated[id], alone[id]) << id;
  EXPECT_EQ(d.kv.stats().counts.in_use, 0);
  EXPECT_EQ(d.finished.size(), 3u);
}

TEST(SchedulerCore, UnderKvPressureASequenceOnlyYieldsToOnesThatRankAboveIt) {
  // Four requests of equal priority (so by arrival: 1 ranks highest) in pools that cannot hold
  // them all: later ones are preempted and recomputed, the first never is. (Letting a served
  // sequence preempt any other one, as before, recomputes request 1 in 9 of these 19 pools.)
  for (std::int64_t n_blocks = 12; n_blocks <= 30; ++n_blocks) {
    SCOPED_TRACE("pool of " + std::to_string(n_blocks) + " blocks");
    driver d(small_config(), n_blocks);
    for (std::uint64_t id = 1; id <= 4; ++id) ASSERT_FALSE(d.core.submit(driver::req(id, 6, 40)));
    d.run();
    std::map<std::uint64_t, std::int64_t> reached;
    std::set<std::uint64_t> recomputed;
    for (const auto& plan : d.plans) {
      for (const auto& s : plan.seqs) {
        auto [it, fresh] = reached.try_emplace(s.seq_id, 0);
        if (!fresh && s.start_pos < it->second) recomputed.insert(s.seq_id);
        it->second = std::max(it->second, s.start_pos + std::int64_t(s.tokens.size()));
      }
    }
    EXPECT_GT(d.core.stats().preemptions, 0);
    EXPECT_EQ(recomputed.count(1), 0u) << "request 1 ranks above the others and must keep its blocks";
    EXPECT_FALSE(recomputed.empty());
    EXPECT_EQ(d.finished.size(), 4u);
    EXPECT_EQ(d.kv.stats().counts.in_use, 0);
  }
}

TEST(SchedulerCore, LowerPriorityValuesAreAdmittedFirst) {
  sched_config c = small_config();
  c.max_num_seqs = 1;
  driver d(c, 200);
  ASSERT_FALSE(d.core.submit(driver::req(1, 2, 1, 5)));
  ASSERT_FALSE(d.core.submit(driver::req(2, 2, 1, 0)));
  d.step();
  ASSERT_EQ(d.plans[0].seqs.size(), 1u);
  EXPECT_EQ(d.plans[0].seqs[0].seq_id, 2u);
}

TEST(SchedulerCore, CancelReleasesBlocksInTheNextBatch) {
  driver d(small_config(), 200);
  ASSERT_FALSE(d.core.submit(driver::req(1, 10, 100)));
  d.step();
  d.step();
  EXPECT_GT(d.kv.stats().counts.in_use, 0);
  d.core.cancel(1);
  const kv::kv_batch b = d.core.plan_kv();
  ASSERT_FALSE(b.ops.empty());
  bool released = false;
  for (const auto& op : b.ops) released |= op.op == kv::kv_op::kind::release && op.seq_id == 1;
  EXPECT_TRUE(released);
  d.kv.apply(b);
  EXPECT_EQ(d.kv.stats().counts.in_use, 0);
  d.record(d.core.take_events());
  EXPECT_EQ(d.finished[1], finish_reason::cancelled);
  EXPECT_FALSE(d.core.has_work());
}

TEST(SchedulerCore, RefusesWhatItCannotServe) {
  sched_config c = small_config();
  c.max_queue = 2;
  c.max_model_len = 20;
  scheduler_core core(c);
  EXPECT_EQ(core.submit(driver::req(1, 0, 4)), make_error_code(errc::invalid_argument));
  EXPECT_EQ(core.submit(driver::req(0, 5, 4)), make_error_code(errc::invalid_argument));  // 0 marks "ended mid-step"
  EXPECT_EQ(core.submit(driver::req(1, 20, 4)), make_error_code(errc::context_overflow));
  EXPECT_FALSE(core.submit(driver::req(1, 5, 4)));
  EXPECT_EQ(core.submit(driver::req(1, 5, 4)), make_error_code(errc::invalid_argument));  // duplicate id
  EXPECT_FALSE(core.submit(driver::req(2, 5, 4)));
  EXPECT_EQ(core.submit(driver::req(3, 5, 4)), make_error_code(errc::overloaded));
}

TEST(SchedulerCore, EachTokensEventCarriesItsLogprobAndTheAlternativesItsRequestAskedFor) {
  driver d(small_config(), 64);
  request r = driver::req(1, 3, 2);
  r.n_logprobs = 2;
  ASSERT_FALSE(d.core.submit(r));
  EXPECT_EQ(d.core.n_logprobs(1), 2);
  EXPECT_EQ(d.core.n_logprobs(99), 0);
  std::vector<seq_event> events;
  for (int step = 0; step < 10 && d.core.has_work(); ++step) {
    const kv::kv_batch_result res = d.kv.apply(d.core.plan_kv());
    const auto plan = d.core.plan_step(res);
    d.core.take_events();
    if (!plan) continue;
    std::vector<sampled_token> sampled;
    for (const auto& s : plan->seqs) {
      if (!s.want_candidates) continue;
      const std::int32_t t = std::int32_t(10 + step);
      sampled.push_back({t, -0.5f * float(step), {{t, -0.5f * float(step)}, {t + 1, -3.f}}});
    }
    for (seq_event& e : d.core.complete_step(std::span<sampled_token>(sampled))) events.push_back(std::move(e));
  }
  ASSERT_EQ(events.size(), 2u);
  for (const seq_event& e : events) {
    ASSERT_GE(e.token, 0);
    EXPECT_EQ(e.logprob, -0.5f * float(e.token - 10));
    ASSERT_EQ(e.top_logprobs.size(), 2u);
    EXPECT_EQ(e.top_logprobs[0].token, e.token);
    EXPECT_EQ(e.top_logprobs[1].token, e.token + 1);
  }
  EXPECT_EQ(events.back().finish, finish_reason::length);
  EXPECT_EQ(d.core.n_logprobs(1), 0);  // finished: forgotten
}

TEST(SchedulerCore, FinishesOnEndOfGenerationUnlessTold) {
  sched_config c = small_config();
  c.eog_tokens = {1, 2, 3, 4, 5, 6, 7, 8};  // the fake sampler soon picks one of these
  driver d(c, 200);
  request r = driver::req(1, 3, 100);
  ASSERT_FALSE(d.core.submit(r));
  request keep = driver::req(2, 3, 100);
  keep.ignore_eos = true;
  ASSERT_FALSE(d.core.submit(keep));
  d.run();
  EXPECT_EQ(d.finished[1], finish_reason::stop);
  EXPECT_LT(d.generated[1].size(), 100u);
  EXPECT_EQ(d.finished[2], finish_reason::length);
  EXPECT_EQ(d.generated[2].size(), 100u);
}

TEST(SchedulerCore, ARequestThatCanNeverFitFailsInsteadOfWaitingForever) {
  driver d(small_config(), 2);  // 8 slots in all
  ASSERT_FALSE(d.core.submit(driver::req(1, 12, 2)));
  d.run(10);
  EXPECT_EQ(d.finished[1], finish_reason::failed);
  EXPECT_FALSE(d.core.has_work());
}

TEST(SchedulerCore, AfterAFailedStepFailAllEndsEveryHeldRequestAndFreesItsBlocks) {
  sched_config c = small_config();
  c.max_num_seqs = 2;  // two run, two wait
  driver d(c, 200);
  for (std::uint64_t id = 1; id <= 4; ++id) ASSERT_FALSE(d.core.submit(driver::req(id, 6, 50)));
  d.step();
  d.step();
  d.record(d.core.take_events());
  const kv::kv_batch_result res = d.kv.apply(d.core.plan_kv());
  ASSERT_TRUE(d.core.plan_step(res));  // the step the device then fails
  d.record(d.core.take_events());
  const error_code fault = make_error_code(errc::device_fault);
  std::vector<seq_event> events = d.core.fail_step();
  EXPECT_EQ(events.size(), 2u);
  const std::vector<seq_event> rest = d.core.fail_all(fault);
  EXPECT_EQ(rest.size(), 2u);
  events.insert(events.end(), rest.begin(), rest.end());
  for (const seq_event& e : rest) EXPECT_EQ(e.error, fault);
  d.record(events);
  for (std::uint64_t id = 1; id <= 4; ++id) EXPECT_EQ(d.finished[id], finish_reason::failed) << id;
  EXPECT_TRUE(d.core.fail_all(fault).empty());
  d.kv.apply(d.core.plan_kv());  // the next batch releases everything
  EXPECT_EQ(d.kv.stats().counts.in_use, 0);
  EXPECT_EQ(d.kv.check(), "");
  EXPECT_FALSE(d.core.has_work());
}

TEST(SchedulerCore, ASharedPrefixIsComputedOnce) {
  sched_config c = small_config();
  driver d(c, 200);
  request a = driver::req(1, 0, 1), b = driver::req(2, 0, 1);
  for (int i = 0; i < 13; ++i) a.prompt.push_back(i + 1);
  b.prompt = a.prompt;
  b.prompt.back() = 99;
  ASSERT_FALSE(d.core.submit(a));
  d.run();
  ASSERT_FALSE(d.core.submit(b));
  d.run();
  EXPECT_EQ(d.core.stats().cached_prompt_tokens, 12);  // three full blocks of four
}

// With state snapshots (a recurrent model), a prefill stops at the last block boundary before the
// prompt's last token and asks for a snapshot there; a later prompt on the same prefix resumes
// from it (state_copies) instead of recomputing, and the plans carry the copies both ways.
TEST(SchedulerCore, WithStateSnapshotsAPrefillStopsAtItsLastBlockBoundaryAndALaterPromptResumesThere) {
  sched_config c = small_config();
  c.state_snapshots = true;
  driver d(c, 200);
  d.kv = kv::kv_core(kv::kv_config{.n_blocks = 200, .block_size = 4, .prefix_caching = true, .n_state_slots = 6});
  request a = driver::req(1, 0, 2);
  for (int i = 0; i < 23; ++i) a.prompt.push_back(i + 1);  // 23 tokens: chunks of 16, then 4 to the stop at 20, then 3
  ASSERT_FALSE(d.core.submit(a));
  d.run();
  ASSERT_GE(d.plans.size(), 3u);
  EXPECT_EQ(d.plans[0].seqs[0].tokens.size(), 16u);
  EXPECT_EQ(d.plans[0].state_snapshots.size(), 1u) << "a chunk ending on a block boundary";
  EXPECT_EQ(d.plans[1].seqs[0].tokens.size(), 4u) << "the prefill stops at position 20";
  ASSERT_EQ(d.plans[1].state_snapshots.size(), 1u);
  EXPECT_EQ(d.plans[1].state_snapshots[0].src, d.plans[1].seqs[0].state_slot);
  EXPECT_EQ(d.plans[2].seqs[0].start_pos, 20);
  EXPECT_TRUE(d.plans[2].state_snapshots.empty());
  EXPECT_EQ(d.kv.stats().state_snapshots, 2);

  request b = driver::req(2, 0, 2);
  b.prompt = a.prompt;
  b.prompt.push_back(77);
  const std::size_t before = d.plans.size();
  ASSERT_FALSE(d.core.submit(b));
  d.run();
  EXPECT_EQ(d.core.stats().cached_prompt_tokens, 20);
  const gpu_worker::step_plan& first = d.plans[before];
  ASSERT_EQ(first.state_copies.size(), 1u) << "the snapshot into b's slot before its first step";
  EXPECT_EQ(first.state_copies[0].src, d.plans[1].state_snapshots[0].dst);
  EXPECT_EQ(first.state_copies[0].dst, first.seqs[0].state_slot);
  EXPECT_EQ(first.seqs[0].start_pos, 20);
  EXPECT_EQ(first.seqs[0].tokens.size(), 4u) << "20 of 24 cached: the stop is 20 as well, so no new snapshot";
  EXPECT_EQ(d.generated[2].size(), 2u);

  // A prompt sharing only the first 18 tokens: it resumes from the chunk's snapshot at 16.
  request e = driver::req(3, 0, 1);
  e.prompt.assign(a.prompt.begin(), a.prompt.begin() + 18);
  for (int i = 0; i < 9; ++i) e.prompt.push_back(150 + i);
  const std::int64_t cached_before = d.core.stats().cached_prompt_tokens;
  ASSERT_FALSE(d.core.submit(e));
  d.run();
  EXPECT_EQ(d.core.stats().cached_prompt_tokens - cached_before, 16);
  EXPECT_EQ(d.kv.check(), "");
}

// ---- Planning ahead (the overlapped step loop) ----

request drawable(request r) {
  r.logits.draw.on = true;
  return r;
}

// Drives the core as the scheduler actor does with overlap on: a step is planned ahead of the one
// in flight whenever can_plan_ahead(), steps complete in order, the fake worker resolves
// feed_from from the step it ran just before (checking the numbering, as the worker shell does)
// and "draws" the fake sampler's token (choose()), and deferred masks are taken after each
// completion and must be there when their step completes.
struct pipelined_driver : driver {
  std::deque<gpu_worker::step_plan> flying;
  std::optional<std::uint64_t> last_step;
  std::vector<std::int32_t> last_drawn;
  int ahead_plans = 0, fed = 0, wasted = 0, deferred = 0;
  std::map<std::uint64_t, gpu_worker::step_masks> masks;  // take_masks() answers, by step
  std::map<std::uint64_t, std::int64_t> next_pos;  // per sequence: the position its next fed token must have

  using driver::driver;

  bool plan(bool ahead) {
    const kv::kv_batch batch = core.plan_kv(ahead);
    const kv::kv_batch_result res = kv.apply(batch);
    EXPECT_EQ(kv.check(), "");
    const auto p = core.plan_step(res);
    record(core.take_events());
    if (!p) return false;
    ahead_plans += ahead;
    for (const gpu_worker::seq_step& st : p->seqs) {
      if (!st.mask_deferred) continue;
      ++deferred;
      EXPECT_TRUE(ahead && st.feed_from >= 0 && st.logits.allowed.empty()) << "seq " << st.seq_id;
    }
    EXPECT_FALSE(core.take_masks()) << "a step planned ahead gets its masks once the step before has completed";
    flying.push_back(*p);
    plans.push_back(*p);
    return true;
  }
  // The masks of the step now oldest, as the scheduler actor sends them after each completion.
  void take_masks() {
    std::optional<gpu_worker::step_masks> m = core.take_masks();
    if (!m) return;
    EXPECT_FALSE(core.take_masks()) << "given once";
    ASSERT_FALSE(flying.empty());
    EXPECT_EQ(m->step, flying.front().step);
    std::size_t j = 0;
    for (const gpu_worker::seq_step& st : flying.front().seqs) {
      if (!st.mask_deferred) continue;
      ASSERT_LT(j, m->allowed.size());
      // A sequence that ended since its step was planned gets none (its output is discarded).
      EXPECT_EQ(m->allowed[j++].empty(), finished.count(st.seq_id) != 0) << "seq " << st.seq_id;
    }
    EXPECT_EQ(j, m->allowed.size());
    masks[m->step] = std::move(*m);
  }
  void complete_oldest() {
    gpu_worker::step_plan p = std::move(flying.front());
    flying.pop_front();
    if (last_step) {
      EXPECT_EQ(p.step, *last_step + 1);
    }
    std::vector<std::int32_t> draws;
    std::size_t deferred_seen = 0;
    for (gpu_worker::seq_step& s : p.seqs) {
      if (s.feed_from >= 0) {
        EXPECT_EQ(s.tokens, std::vector<std::int32_t>{-1});
        EXPECT_LT(std::size_t(s.feed_from), last_drawn.size());
        s.tokens[0] = last_drawn.at(std::size_t(s.feed_from));
        ++fed;
      }
      if (s.mask_deferred) {  // the worker waits for them: they must have come
        EXPECT_TRUE(masks.count(p.step) && deferred_seen < masks[p.step].allowed.size()) << "step " << p.step;
        if (masks.count(p.step) && deferred_seen < masks[p.step].allowed.size()) {
          s.logits.allowed = masks[p.step].allowed[deferred_seen];
        }
        ++deferred_seen;
      }
      if (s.want_candidates) draws.push_back(choose(s, s.logits.allowed));
    }
    last_step = p.step;
    last_drawn = draws;
    const std::vector<seq_event> events = core.complete_step(draws);
    for (const seq_event& e : events) {
      if (e.token >= 0) {
        EXPECT_EQ(finished.count(e.id), 0u) << "a token after the end of " << e.id;
      }
    }
    record(events);
    wasted += int(draws.size()) - int(std::count_if(events.begin(), events.end(), [](const seq_event& e) { return e.token >= 0; }));
    take_masks();
  }
  void run(int max_rounds = 10000) {
    for (int i = 0; i < max_rounds && (core.has_work() || !flying.empty()); ++i) {
      if (flying.empty() && !plan(false)) continue;
      if (flying.size() == 1 && core.can_plan_ahead()) plan(true);
      complete_oldest();
    }
    EXPECT_TRUE(flying.empty());
    kv.apply(core.plan_kv());  // the last releases
  }
};

// The same requests planned serially and ahead: the same tokens and ends.
void run_both(driver& serial, pipelined_driver& ahead, const std::vector<request>& rs) {
  for (const request& r : rs) {
    ASSERT_FALSE(serial.core.submit(r));
    ASSERT_FALSE(ahead.core.submit(r));
  }
  serial.run();
  ahead.run();
  EXPECT_EQ(ahead.generated, serial.generated);
  EXPECT_EQ(ahead.finished, serial.finished);
}

sched_config eog_config() {
  sched_config c = small_config();
  c.eog_tokens = {13};  // the fake token at some positions: those requests end early
  return c;
}

TEST(SchedulerCoreAhead, PlansAheadAndGivesTheTokensOfSerialPlanning) {
  driver serial(eog_config(), 200);
  pipelined_driver ahead(eog_config(), 200);
  std::vector<request> rs;
  for (std::uint64_t id = 1; id <= 10; ++id) rs.push_back(drawable(driver::req(id, 3 + id * 5 % 23, 4 + std::int64_t(id * 3 % 17))));
  run_both(serial, ahead, rs);
  EXPECT_EQ(ahead.finished.size(), 10u);
  EXPECT_GT(std::count_if(ahead.finished.begin(), ahead.finished.end(),
                          [](const auto& f) { return f.second == finish_reason::stop; }), 0)
      << "no request met the end-of-generation token: the test would not see wasted steps";
  EXPECT_GT(ahead.ahead_plans, 0);
  EXPECT_GT(ahead.fed, 0);
  EXPECT_EQ(ahead.kv.stats().counts.in_use, 0);
  EXPECT_EQ(ahead.kv.check(), "");
  EXPECT_FALSE(ahead.core.has_work());
  // A request ending by length never feeds its last token (prompt + max_tokens - 1); one ending
  // by an end-of-generation token may cost one wasted token.
  for (const auto& plan : ahead.plans) {
    for (const auto& s : plan.seqs) {
      if (ahead.finished[s.seq_id] != finish_reason::length) continue;
      const std::int64_t last = std::int64_t(3 + s.seq_id * 5 % 23) + std::int64_t(4 + s.seq_id * 3 % 17) - 1;
      EXPECT_LT(s.start_pos + std::int64_t(s.tokens.size()) - 1, last) << s.seq_id;
    }
  }
  EXPECT_GT(ahead.wasted, 0);
}

TEST(SchedulerCoreAhead, ACancelWhileTwoStepsAreInFlightEndsTheRequestOnceAndFreesItsBlocks) {
  pipelined_driver d(small_config(), 200);
  ASSERT_FALSE(d.core.submit(drawable(driver::req(1, 5, 50))));
  ASSERT_FALSE(d.core.submit(drawable(driver::req(2, 5, 50))));
  ASSERT_TRUE(d.plan(false));
  d.complete_oldest();  // both prefilled, one token each
  ASSERT_TRUE(d.plan(false));
  ASSERT_TRUE(d.core.can_plan_ahead());
  ASSERT_TRUE(d.plan(true));
  ASSERT_EQ(d.core.steps_in_flight(), 2u);
  EXPECT_EQ(d.flying.back().seqs[0].feed_from, 0);
  d.core.cancel(1);
  d.record(d.core.take_events());
  EXPECT_EQ(d.finished[1], finish_reason::cancelled);
  const std::size_t tokens_of_1 = d.generated[1].size();
  d.run();
  EXPECT_EQ(d.generated[1].size(), tokens_of_1) << "a token of the cancelled request came through";
  EXPECT_EQ(d.finished[2], finish_reason::length);
  EXPECT_EQ(d.generated[2].size(), 50u);
  EXPECT_EQ(d.kv.stats().counts.in_use, 0);
  EXPECT_EQ(d.kv.check(), "");
}

TEST(SchedulerCoreAhead, PenaltiesOrNoWorkerDrawKeepStepsSerial) {
  request with_penalty = drawable(driver::req(1, 4, 6));
  with_penalty.logits.presence_penalty = 0.5f;
  for (const request& r : {with_penalty, driver::req(2, 4, 6)}) {
    pipelined_driver d(small_config(), 200);
    ASSERT_FALSE(d.core.submit(r));
    ASSERT_TRUE(d.plan(false));
    EXPECT_FALSE(d.core.can_plan_ahead()) << r.id;
    d.run();
    EXPECT_EQ(d.ahead_plans, 0) << r.id;
    EXPECT_EQ(d.generated[r.id].size(), 6u) << r.id;
  }
}

// A request cancelled before it was ever admitted holds no blocks: only its event is left, and
// the loop must run once more to deliver it (it once went idle with the event untaken).
TEST(SchedulerCoreAhead, ARequestCancelledBeforeAdmissionKeepsTheLoopGoingUntilItsEventIsTaken) {
  pipelined_driver d(small_config(), 200);
  ASSERT_FALSE(d.core.submit(drawable(driver::req(1, 5, 3))));
  d.core.cancel(1);  // never admitted: no blocks to release, only the event
  EXPECT_TRUE(d.core.has_work()) << "the cancel's event is not taken yet";
  d.run();
  EXPECT_EQ(d.finished[1], finish_reason::cancelled);
  EXPECT_FALSE(d.core.has_work());
  EXPECT_TRUE(d.plans.empty());
}

// A request that finds no room in a plan made ahead of a step is not "too large to ever fit" when
// the running set is empty by the time the plan comes back: the step in flight may have ended the
// last running sequence meanwhile, whose blocks are only released by the next batch. (Seen as a
// context_overflow for a request that fits, under load.)
TEST(SchedulerCoreAhead, NoRoomAheadWhileTheLastRunningSequenceEndsIsNotANeverFit) {
  pipelined_driver d(small_config(), 3);  // 12 positions: one request of 6 + 4 at a time
  ASSERT_FALSE(d.core.submit(drawable(driver::req(1, 6, 4))));
  ASSERT_FALSE(d.core.submit(drawable(driver::req(2, 6, 4))));
  for (int i = 0; i < 3; ++i) {  // prefill and two decode steps, one at a time: 3 tokens of 4
    ASSERT_TRUE(d.plan(false));
    d.complete_oldest();
  }
  ASSERT_EQ(d.generated[1].size(), 3u);
  ASSERT_TRUE(d.plan(false));  // request 1's last token, in flight
  ASSERT_TRUE(d.core.can_plan_ahead());
  const kv::kv_batch batch = d.core.plan_kv(true);    // request 2 asks for room: none yet
  const kv::kv_batch_result res = d.kv.apply(batch);
  d.complete_oldest();                                // meanwhile request 1 ends by length
  EXPECT_FALSE(d.core.plan_step(res));
  d.record(d.core.take_events());
  EXPECT_EQ(d.finished.count(2), 0u) << "request 2 fits once request 1's blocks are released";
  d.run();
  EXPECT_EQ(d.finished[1], finish_reason::length);
  EXPECT_EQ(d.finished[2], finish_reason::length);
  EXPECT_EQ(d.generated[2].size(), 4u);
  EXPECT_EQ(d.kv.check(), "");
}

TEST(SchedulerCoreAhead, NoRoomAheadWaitsForASerialPlanThatMayPreempt) {
  // A pool too small for three long sequences: ahead plans cannot preempt, so the core falls back
  // to serial plans, which do; every request still gets the tokens it gets alone.
  std::map<std::uint64_t, std::vector<std::int32_t>> alone;
  for (std::uint64_t id = 1; id <= 3; ++id) {
    driver d(small_config(), 200);
    ASSERT_FALSE(d.core.submit(drawable(driver::req(id, 6, 30))));
    d.run();
    alone[id] = d.generated[id];
  }
  pipelined_driver d(small_config(), 16);
  for (std::uint64_t id = 1; id <= 3; ++id) ASSERT_FALSE(d.core.submit(drawable(driver::req(id, 6, 30))));
  d.run();
  EXPECT_GT(d.core.stats().preemptions, 0);
  EXPECT_GT(d.ahead_plans, 0);
  for (std::uint64_t id = 1; id <= 3; ++id) EXPECT_EQ(d.generated[id], alone[id]) << id;
  EXPECT_EQ(d.kv.stats().counts.in_use, 0);
  EXPECT_EQ(d.kv.check(), "");
}

// Constrained decoding planned ahead: a step planned while the one before runs defers each
// constrained sequence's mask (it depends on the token drawn there), take_masks() gives it once
// that step has completed, and the outputs are those of serial planning, each in the language.
std::shared_ptr<const sampler::structured::token_masks> tiny_constraint(const std::string& pattern) {
  std::vector<std::string> bytes(64);
  const char* pieces[] = {"a", "b", "c", "d", "ab", "ca", "bd", "abc", "cd"};
  for (std::size_t i = 0; i < std::size(pieces); ++i) bytes[i + 1] = pieces[i];
  auto trie = std::make_shared<const sampler::structured::vocab_trie>(std::move(bytes), std::vector<std::int32_t>{});
  return std::make_shared<const sampler::structured::token_masks>(sampler::structured::compile_regex(pattern), trie);
}

std::string text_of(const std::vector<std::int32_t>& tokens) {
  const char* pieces[] = {"", "a", "b", "c", "d", "ab", "ca", "bd", "abc", "cd"};
  std::string out;
  for (std::int32_t t : tokens) out += t >= 0 && t < 10 ? pieces[t] : "?";
  return out;
}

TEST(SchedulerCoreAhead, ConstrainedSequencesArePlannedAheadWithTheirMasksDeferred) {
  const std::string pattern = "[abc]{3,11}d";
  const auto constraint = tiny_constraint(pattern);
  driver serial(small_config(), 200);
  pipelined_driver ahead(small_config(), 200);
  std::vector<request> rs;
  for (std::uint64_t id = 1; id <= 6; ++id) {
    rs.push_back(drawable(driver::req(id, 2 + id, 40)));
    if (id != 6) rs.back().constraint = constraint;  // and one unconstrained neighbour
  }
  run_both(serial, ahead, rs);
  const sampler::structured::dfa d = sampler::structured::compile_regex(pattern);
  for (std::uint64_t id = 1; id <= 5; ++id) {
    EXPECT_EQ(ahead.finished[id], finish_reason::stop) << id;
    EXPECT_TRUE(d.matches(text_of(ahead.generated[id]))) << id << ": " << text_of(ahead.generated[id]);
  }
  EXPECT_GT(ahead.deferred, 20);
  EXPECT_EQ(ahead.masks.size(), std::size_t(std::count_if(ahead.plans.begin(), ahead.plans.end(), [](const auto& p) {
              return std::any_of(p.seqs.begin(), p.seqs.end(), [](const auto& s) { return s.mask_deferred; });
            })));
  EXPECT_EQ(ahead.kv.stats().counts.in_use, 0);
  EXPECT_FALSE(ahead.core.has_work());
}

TEST(SchedulerCoreAhead, ASequenceEndedWhileItsMaskWasDeferredGetsNone) {
  const auto constraint = tiny_constraint("[abc]{20}d");
  pipelined_driver d(small_config(), 200);
  for (std::uint64_t id = 1; id <= 2; ++id) {
    request r = drawable(driver::req(id, 5, 30));
    r.constraint = constraint;
    ASSERT_FALSE(d.core.submit(r));
  }
  ASSERT_TRUE(d.plan(false));
  d.complete_oldest();  // both prefilled, one token each
  ASSERT_TRUE(d.plan(false));
  ASSERT_TRUE(d.core.can_plan_ahead()) << "constrained sequences are planned ahead too";
  ASSERT_TRUE(d.plan(true));
  ASSERT_TRUE(d.flying.back().seqs[0].mask_deferred);
  d.core.cancel(1);
  d.record(d.core.take_events());
  d.complete_oldest();  // takes the masks: none for 1 (checked there), one for 2
  ASSERT_EQ(d.masks.size(), 1u);
  const gpu_worker::step_masks& m = d.masks.begin()->second;
  ASSERT_EQ(m.allowed.size(), 2u);
  EXPECT_TRUE(m.allowed[0].empty());
  EXPECT_EQ(m.allowed[1].size(), 2u);  // 64 tokens
  d.run();
  EXPECT_EQ(d.finished[1], finish_reason::cancelled);
  EXPECT_EQ(d.finished[2], finish_reason::stop);
  EXPECT_EQ(text_of(d.generated[2]).size(), 21u) << text_of(d.generated[2]);
  EXPECT_EQ(d.kv.stats().counts.in_use, 0);
}

}  // namespace
