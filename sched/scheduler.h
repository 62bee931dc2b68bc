// scheduler: the scheduler_core inside a strand shell, driving the step loop
//   plan (core) -> KV batch (kv_manager) -> execute (worker) -> sample (sampler) -> update (core)
// Every completion comes back on the scheduler's strand, so the core needs no locks. The loop
// runs while there is work and holds the actor's gate open, so async_stop() waits until every
// accepted request has finished. Events (tokens, finishes) go to the sink after every step, on
// the strand; the engine turns them into text for the request streams.
//
// Overlapped steps (sched_options::overlap): as soon as step N is on its way to the worker, the
// scheduler plans step N+1 ahead of it (scheduler_core::can_plan_ahead) and sends it too, so the
// worker has it queued when N ends and the GPU does not wait for the hops between the actors; N+1
// feeds the tokens the worker drew in N, which never leave the device first; a constrained
// sequence's mask in N+1 follows once N has completed (send_masks), while N+1's forward pass runs.
// Without it (or when the core cannot plan ahead) a step is planned once the one before has been
// sampled.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include <boost/asio/bind_executor.hpp>

#include "actors/strand_actor.h"
#include "gpu_worker/worker.h"
#include "kv/kv_manager.h"
#include "sampler/sampler.h"
#include "sched/scheduler_core.h"

namespace anvil::sched {

// What the request streams hear after each step: the core's events as they are.
using step_event = seq_event;
using event_sink = std::function<void(std::vector<step_event>)>;

struct submit_options {
  sampler::sampling_params sampling;   // top_k/top_p/min_p/temperature/seed for the sampler
  std::int32_t n_logprobs = 0;         // alternatives to report per token, [0, 20]
};

struct sched_options {
  bool overlap = true;                 // plan a step ahead of the one in flight where the core can
  std::size_t mailbox_capacity = 1u << 16;
};

class scheduler : public actors::strand_actor {
 public:
  scheduler(boost::asio::any_io_executor ex, sched_config cfg, kv::kv_manager& kv, gpu_worker::worker& worker,
            sampler::sampler_actor& sampler, event_sink sink, sched_options opt = {});
  ~scheduler();

  // Queues a request; completes with its admission error (invalid_argument, context_overflow,
  // overloaded, device_fault once unhealthy) or success. Tokens then arrive through the sink.
  template <class Token>
  auto async_submit(request r, submit_options opt, Token&& token) {
    return ask<void>(std::forward<Token>(token), [this, r = std::move(r), opt]() mutable -> actors::outcome<void> {
      return submit(std::move(r), opt);
    });
  }

  // Cancels a request: its blocks are free within one step; the sink gets a cancelled event.
  // Taken even when the mailbox is full or a stop is draining (tell_urgent): errc::stopped only
  // once the scheduler has stopped, when nothing it held is left to cancel.
  error_code cancel(std::uint64_t id) {
    return tell_urgent([this, id] {
      core_.cancel(id);
      kick();
    });
  }

  template <class Token>
  auto async_stats(Token&& token) {
    return ask<sched_stats>(std::forward<Token>(token), [this] { return stats(); });
  }

  // False once a step failed on the worker (a device fault): every request held then failed,
  // and async_submit answers errc::device_fault from then on.
  bool healthy() const noexcept { return healthy_.load(); }

 private:
  actors::outcome<void> submit(request r, const submit_options& opt);
  // Starts the next plan when one may start: serially with nothing in flight, ahead with one
  // step in flight; ends the loop when nothing is in flight and no work is left.
  void kick();
  void plan(bool ahead);
  void on_kv(error_code ec, kv::kv_batch_result r);
  // A step sent to the worker, until it is completed in the core. Answers for two steps in flight
  // may come back in either order (the sampler's replies leave through a pool of threads), so
  // they are kept here and applied in the order the steps were sent (drain).
  struct step_done {
    std::uint64_t step = 0;
    error_code error;                          // the step or its sampling failed
    bool sampled_ok = false;                   // sampled holds its answer
    std::vector<sched::sampled_token> sampled;  // one per output, in the step's output order
  };
  step_done& done(std::uint64_t step);  // the entry of a step in flight (a logic_error if none)
  void on_executed(std::uint64_t step, error_code ec, gpu_worker::step_result r);
  // outcomes[i] answers ids[i]; index[i] is its output's place in the step (whose n_outputs outputs
  // include those of requests that ended before they could be sampled).
  void on_sampled(std::uint64_t step, error_code ec, std::vector<sampler::sample_outcome> outcomes,
                  std::vector<std::uint64_t> ids, std::vector<std::size_t> index, std::size_t n_outputs);
  // Completes (or fails) the oldest steps whose answers are in, in order; then kick().
  void drain();
  // The deferred masks of the oldest step in flight, to the worker, once its step before has
  // completed (scheduler_core::take_masks): before any later plan, as the worker needs.
  void send_masks();
  sched_stats stats() const;
  // Adds a step's device timing to device_time_; the idle gap only when the loop ran without a
  // break since the step before (a gap spent waiting for requests is not the step loop's).
  void note_timing(const gpu_worker::step_result& r);
  void emit(std::vector<seq_event> events);  // to the sink; finished requests' sampler state is closed
  void idle();
  // A step, KV batch or sampling failed: the scheduler turns unhealthy and fails every request
  // it holds with `ec`, so none waits for a device that cannot answer; later submits are refused.
  void fail_everything(error_code ec, bool step_in_flight);

  template <class F>
  auto on_strand(F&& f) {
    return boost::asio::bind_executor(get_executor(), std::forward<F>(f));
  }

  scheduler_core core_;
  kv::kv_manager& kv_;
  gpu_worker::worker& worker_;
  sampler::sampler_actor& sampler_;
  event_sink sink_;
  sched_options opt_;
  actors::in_flight loop_;      // held while the step loop runs
  bool looping_ = false;
  bool planning_ = false;       // a KV batch is out: one plan at a time
  std::deque<step_done> done_;  // steps sent to the worker and not yet completed, oldest first
  bool unbroken_ = false;       // a step completed and the loop has not gone idle since
  sched_stats device_time_;     // the device timing fields only
  std::atomic<bool> healthy_{true};
};

}  // namespace anvil::sched
