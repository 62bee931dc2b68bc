// scheduler: the scheduler_core inside a strand shell, driving the step loop
//   plan (core) -> KV batch (kv_manager) -> execute (worker) -> sample (sampler) -> update (core)
// Every completion comes back on the scheduler's strand, so the core needs no locks. The loop
// runs while there is work and holds the actor's gate open, so async_stop() waits until every
// accepted request has finished. Events (tokens, finishes) go to the sink after every step, on
// the strand; the engine turns them into text for the request streams.
#pragma once

#include <cstdint>
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

class scheduler : public actors::strand_actor {
 public:
  scheduler(boost::asio::any_io_executor ex, sched_config cfg, kv::kv_manager& kv, gpu_worker::worker& worker,
            sampler::sampler_actor& sampler, event_sink sink, std::size_t mailbox_capacity = 1u << 16);
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
    return ask<sched_stats>(std::forward<Token>(token), [this] { return core_.stats(); });
  }

  // False once a step failed on the worker (a device fault): every request held then failed,
  // and async_submit answers errc::device_fault from then on.
  bool healthy() const noexcept { return healthy_.load(); }

 private:
  actors::outcome<void> submit(request r, const submit_options& opt);
  void kick();
  void step();
  void on_kv(error_code ec, kv::kv_batch_result r);
  void on_executed(error_code ec, gpu_worker::step_result r);
  void on_sampled(error_code ec, std::vector<sampler::sample_outcome> outcomes, std::vector<std::uint64_t> ids);
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
  actors::in_flight loop_;      // held while the step loop runs
  bool looping_ = false;
  std::atomic<bool> healthy_{true};
};

}  // namespace anvil::sched
