// scheduler_core: continuous (iteration-level) batching, as plain synchronous C++ (no Asio).
//
// Every step goes through three calls, each a pure function of the core's state and its input:
//   plan_kv()       -> the KV manager's batch: releases, then a reserve for each running sequence
//                      (priority order; may preempt the lowest-priority ones), then admissions;
//   plan_step(kv)   -> the worker's step plan from the KV answers (preempted sequences go back to
//                      waiting and will recompute; a chunk of each prompt, one token per decode);
//   complete_step(sampled tokens) -> events: tokens appended, sequences finished.
// Planning ahead (the overlapped step loop, sched/scheduler.h): while one step runs on the worker,
// plan_kv(ahead = true) and plan_step() plan the next as if the running step's sequences had got
// their tokens: a sequence that samples in it feeds the token the worker draws (seq_step::
// feed_from), which stays on the device; one that will end by length then is left out; one that
// ends by an end-of-generation token costs one wasted token, never a wrong one (its event never
// leaves complete_step). A constrained sequence's mask depends on that token, so it is deferred
// (seq_step::mask_deferred): once the step before has completed, take_masks() gives the masks of
// the states it led to, for the worker, which runs the forward pass meanwhile. A step is planned
// ahead only when can_plan_ahead(): one step in flight, every sequence sampling in it drawn on the
// worker (logit_params::draw) and without penalties (their counts would miss the token in flight),
// and the last attempt did not come back empty or short of room (then the next plan waits for the
// step, and may preempt). Steps complete in order.
// Under the token budget and the sequence cap, decodes are never starved by long prompts:
// running sequences are served first and a prompt is fed at most max_prefill_chunk tokens a step.
// Ordering is FCFS within a priority (lower value first). Sequences are plain integers and token
// lists; KV blocks are the KV manager's, tensors the worker's.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "actors/error.h"
#include "messages/step.h"
#include "messages/kv_messages.h"
#include "sampler/sampler_core.h"
#include "sampler/structured/token_masks.h"

namespace anvil::sched {

struct sched_config {
  std::int64_t max_num_batched_tokens = 512;  // tokens one step may feed (the worker's limit)
  std::int64_t max_num_seqs = 64;             // sequences one step may hold
  std::int64_t max_queue = 1024;              // waiting requests; beyond it submit answers overloaded
  std::int64_t max_model_len = 4096;          // prompt + generated tokens of one sequence
  std::int64_t max_prefill_chunk = 256;       // prompt tokens one sequence feeds per step at most
  std::int64_t block_size = 16;               // the KV manager's, to know when blocks fill
  bool prefix_caching = true;                 // commit full blocks so later prompts can reuse them
  // The model keeps a recurrent state (kv_config::n_state_slots) and prefix caching is on: a
  // prefill stops at the last block boundary before the prompt's last token, and that reserve asks
  // for a snapshot of the state there (kv_op::snapshot), so a later prompt sharing the prefix can
  // resume from it; so does each prefill chunk that ends on a block boundary. The last partial
  // block and token follow in the next step.
  bool state_snapshots = false;
  std::vector<std::int32_t> eog_tokens;       // end-of-generation token ids
};

struct request {
  std::uint64_t id = 0;
  std::vector<std::int32_t> prompt;           // not empty
  std::int64_t max_tokens = 16;               // tokens to generate at most (>= 1)
  std::int32_t priority = 0;                  // lower runs first; FCFS among equals
  bool ignore_eos = false;                    // keep going past end-of-generation tokens
  std::vector<std::int32_t> stop_token_ids;   // generating one of these ends the request ("stop"), ignore_eos or not
  std::int64_t min_tokens = 0;                // end-of-generation and stop tokens are suppressed until this many are out
  // Constrained decoding (structured output): each step's candidates come from the tokens the
  // automaton allows next (logit_params::allowed); the request ends when its output is complete.
  // Shared and immutable but for its lazily filled mask cache (thread-safe).
  std::shared_ptr<const sampler::structured::token_masks> constraint{};
  std::int32_t n_logprobs = 0;                // alternatives the sampler reports with each token, [0, 20]
  gpu_worker::logit_params logits;            // the worker's logit processing (counts are filled per step)
};

enum class finish_reason { none, stop, length, cancelled, failed };

struct seq_event {
  std::uint64_t id = 0;
  std::int32_t token = -1;                    // the token appended this step, -1 for none
  finish_reason finish = finish_reason::none; // set on the sequence's last event
  error_code error;                           // with finish_reason::failed: why
  float logprob = 0.f;                        // of token, under the processed distribution
  std::vector<sampler::token_logprob> top_logprobs;  // the request's n_logprobs alternatives, with token
  std::int64_t cached_tokens = 0;             // admission events (no token, no finish): prompt tokens the
                                              // prefix cache held
};

// The sampler's answer for one sequence that asked for candidates: its token and what to report
// with it (token -1: the sampler failed this entry, and the sequence has been failed or cancelled).
struct sampled_token {
  std::int32_t token = -1;
  float logprob = 0.f;
  std::vector<sampler::token_logprob> top_logprobs;
};

struct sched_stats {
  std::int64_t waiting = 0;
  std::int64_t running = 0;
  std::int64_t steps = 0;
  std::int64_t preemptions = 0;               // sequences sent back to recompute
  std::int64_t prompt_tokens = 0;             // admitted prompt tokens
  std::int64_t cached_prompt_tokens = 0;      // of those, found in the prefix cache
  std::int64_t generated_tokens = 0;
  std::int64_t steps_ahead = 0;               // of the steps, those planned while the one before ran
  // The device's clock (step_result::device_idle_us / device_busy_us, GPU worker), filled by the
  // scheduler actor: steps whose idle gap was measured while the step loop ran without a break,
  // the device's idle time before them in all, and the busy time of every timed step.
  std::int64_t timed_gaps = 0;
  double device_idle_us = 0;
  std::int64_t timed_steps = 0;
  double device_busy_us = 0;
};

class scheduler_core {
 public:
  explicit scheduler_core(sched_config cfg);

  // errc::invalid_argument (id 0, empty prompt, duplicate id, max_tokens < 1), errc::context_overflow
  // (the prompt leaves no room to generate), errc::overloaded (the queue is full).
  error_code submit(request r);
  // Cancels a waiting or running request: its blocks are released in the next KV batch and a
  // cancelled event is queued (take_events). Unknown ids are ignored.
  void cancel(std::uint64_t id);
  // Fails one waiting or running request with `why` (finish_reason::failed), as cancel() ends it:
  // e.g. its sampling failed this step. The others go on. Unknown ids are ignored.
  void fail(std::uint64_t id, error_code why);
  // Requests held, blocks to release, or events to take (a request cancelled before it was
  // admitted leaves only its event): the loop runs one more KV batch while any is left.
  bool has_work() const { return !seqs_.empty() || !pending_release_.empty() || !events_.empty(); }

  // ahead: plan the step after the one in flight (requires can_plan_ahead()); no preemption.
  kv::kv_batch plan_kv(bool ahead = false);
  std::optional<gpu_worker::step_plan> plan_step(kv::kv_batch_result kv);  // consumes the tables
  bool can_plan_ahead() const;
  std::size_t steps_in_flight() const { return in_flight_.size(); }
  // Whether `id` is still held (waiting or running).
  bool live(std::uint64_t id) const { return seqs_.count(id) != 0; }
  // Completes the oldest step in flight. `sampled`: one entry per sequence that asked for
  // candidates, in plan order; each appended token's event carries its logprob and alternatives.
  std::vector<seq_event> complete_step(std::span<sampled_token> sampled);
  std::vector<seq_event> complete_step(std::span<const std::int32_t> tokens);  // tokens alone
  // The masks the oldest step in flight waits for (seq_step::mask_deferred), once: a step planned
  // ahead is the oldest when the step before it has completed (or failed), and each automaton has
  // taken that step's token then. nullopt when it waits for none or they were taken. The worker
  // must have them before the next plan (scheduler.h sends them at once).
  std::optional<gpu_worker::step_masks> take_masks();
  // The oldest step in flight failed on the worker: its sequences finish with finish_reason::failed
  // and `why`.
  std::vector<seq_event> fail_step(error_code why = make_error_code(errc::device_fault));
  // The alternatives a request asked to have reported with each token (0 for unknown ids).
  std::int32_t n_logprobs(std::uint64_t id) const;
  // Every sequence still held (running, then waiting, each in queue order) finishes with
  // finish_reason::failed and `why`: after a device fault nothing the device holds can be trusted.
  // Their blocks are released in the next KV batch; steps in flight still complete (empty).
  std::vector<seq_event> fail_all(error_code why);
  // Events that happened outside a step: admissions, cancellations (taken after the KV batch
  // that released their blocks, so a cancelled request's blocks are free when it hears of it).
  std::vector<seq_event> take_events();

  const sched_stats& stats() const { return stats_; }
  const sched_config& config() const { return cfg_; }

 private:
  enum class where { waiting, running };
  struct seq_state {
    request req;
    std::vector<std::int32_t> tokens;  // prompt + generated
    // (token, occurrences in tokens), ascending, kept as tokens grow and only when the request
    // has penalties: the step's logit_params::token_counts without a pass over the history.
    std::map<std::int32_t, std::int32_t> counts;
    std::int64_t n_prompt = 0;
    std::int64_t n_computed = 0;       // tokens whose KV is in the cache
    std::int64_t n_generated = 0;
    std::int32_t constraint_state = 0;  // with req.constraint: the automaton's state after the output so far
    std::uint64_t arrival = 0;
    where at = where::waiting;
    bool kv_live = false;              // begun in the KV manager: must be released
  };
  // One op of the last plan_kv batch, as the scheduler meant it.
  struct planned_op {
    enum class kind { commit, release, reserve_running, begin, reserve_admit };
    kind what;
    std::uint64_t id;
    std::int64_t n_tokens;             // reserve: positions held after the step
    std::int64_t start = 0;            // reserve_running: the first position fed
    std::int32_t feed_from = -1;       // reserve_running ahead: the output of the step in flight it feeds
  };
  struct scheduled {
    std::uint64_t id;                  // 0: ended while the step was in flight
    std::int64_t n_new;
    bool samples;
    bool mask_deferred = false;        // its mask comes with take_masks()
  };
  // A step on the worker.
  struct flying_step {
    std::uint64_t step = 0;
    std::vector<scheduled> seqs;       // plan order
    bool masks_owed = false;           // take_masks() has not given its deferred masks yet
  };
  // A sequence's part of the step in flight, seen when planning the next one.
  struct in_flight_part {
    std::int64_t n_new = 0;
    std::int32_t out_index = -1;       // its output's index when it samples, else -1
  };
  using queue_key = std::tuple<std::int32_t, std::uint64_t, std::uint64_t>;  // priority, arrival, id

  queue_key key(const seq_state& s) const { return {s.req.priority, s.arrival, s.req.id}; }
  void to_waiting(seq_state& s, bool release_kv);
  void finish(std::uint64_t id, finish_reason why, std::int32_t token, std::vector<seq_event>& out,
              error_code error = {});
  gpu_worker::seq_step make_step(const seq_state& s, std::int64_t start, std::int64_t n_new,
                                 std::vector<std::int32_t> table, std::int32_t feed_from) const;
  void suppress_ends(const seq_state& s, bool one_in_flight, gpu_worker::logit_params& l) const;
  bool snapshot_stop(std::int64_t computed, std::int64_t known, std::int64_t& n_new) const;
  std::optional<finish_reason> finished(const seq_state& s) const;
  // Whether the worker's draw can stand for the sampler's token in a step planned ahead.
  static bool device_drawable(const request& r);
  static bool has_penalties(const request& r);

  sched_config cfg_;
  std::unordered_map<std::uint64_t, seq_state> seqs_;
  std::set<queue_key> waiting_;
  std::set<queue_key> running_;
  std::vector<std::uint64_t> pending_release_;
  std::vector<kv::kv_op> pending_commits_;
  std::vector<planned_op> planned_;
  bool planning_ahead_ = false;                 // the last plan_kv was ahead of a step in flight
  bool ahead_blocked_ = false;                  // until the next complete: plan serially
  std::deque<flying_step> in_flight_;           // steps on the worker, oldest first (at most two)
  std::uint64_t next_step_ = 0;                 // the number of the next plan
  std::vector<seq_event> events_;
  std::uint64_t next_arrival_ = 0;
  sched_stats stats_;
};

}  // namespace anvil::sched
