// The actor shell both workers share (cpu_worker.cpp, gpu_worker.cpp): a strand actor that runs
// one step at a time on the worker's own thread around a device — the CPU reference forward pass
// or gpu_device. It checks each plan (check_plan, then the device's max_context), times the step,
// turns any exception out of the device into errc::device_fault (the process lives), logs each
// sequence the step left without candidates, and publishes the device's allocation count for
// device_allocations(). The device does the work and owns the memory; the shell only sequences.
// A plan's feed_from tokens: for a device that runs steps one at a time the shell resolves them
// from what the step before drew (seq_output::drawn); a device that queues steps (the GPU) takes
// them on the device, and the shell begins a step as soon as it arrives, even while the one
// before still runs, then collects and answers steps in order as they end (polling the device
// from the strand, asleep while the step in hand has far to go).
// A plan with deferred masks (seq_step::mask_deferred) waits for its step_masks: a device that
// queues steps begins it up to its logits at once and finishes it when they come; for one that
// does not, the shell holds the plan until then. The masks must come before the next plan: one
// that comes first fails the waiting step (errc::invalid_argument), which runs without them.

#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>

#include "actors/strand_actor.h"
#include "gpu_worker/worker.h"

namespace anvil::gpu_worker {

// What the shell needs of a device. Every call but the constructor's comes from the worker's
// thread, one at a time.
class worker_device {
 public:
  virtual ~worker_device() = default;
  // Runs one checked plan and fills result.outputs / result.scores; throws for a failed step.
  virtual void execute(const step_plan& plan, step_result& result) = 0;
  // Device (arena) allocations since construction.
  virtual std::uint64_t allocations() const = 0;
  // Positions one sequence may reach; a plan past it is refused before it runs.
  virtual std::int64_t max_context() const = 0;
  // The start-up line describing the memory plan (logged at info).
  virtual std::string describe(const memory_plan& mem) const = 0;
  // Why the last step gave sequence `seq_id` no candidates, and what follows ("...; it fails alone").
  virtual std::string unusable(std::uint64_t seq_id) const = 0;

  // Devices that queue work (the GPU) take a step in two halves, so that the next one is queued
  // while one runs: begin() enqueues a checked plan (its feed_from tokens taken on the device from
  // the step begun just before), collect() waits for the oldest step begun and not collected and
  // fills its result; at most two are begun and not collected. Others run execute() alone.
  virtual bool queues_steps() const { return false; }
  virtual void begin(const step_plan& plan);
  virtual void collect(const step_plan& plan, step_result& result);
  // Whether the oldest step begun and not collected has ended (never blocks).
  virtual bool oldest_ended() const { return true; }
  // A plan with deferred masks: begin() enqueues it up to its logits, and finish_begin() the rest
  // once the shell has put the masks in the plan. Nothing else is begun in between; a step that
  // fails to finish is not collected.
  virtual void finish_begin(const step_plan& plan);
};

// Whether a plan waits for a step_masks (any seq_step::mask_deferred).
bool defers_masks(const step_plan& plan);
// Puts the masks into `plan` (each deferred sequence's logits.allowed, in plan order) and clears
// mask_deferred; "" or why they do not fit it (then the deferred sequences get no mask).
std::string apply_masks(step_plan& plan, step_masks& masks, std::int64_t n_vocab);

class worker_shell : public actors::strand_actor {
 public:
  // `dev` was built against `mem` (which it filled); both outlive nothing of the shell's.
  worker_shell(boost::asio::any_io_executor ex, std::unique_ptr<worker_device> dev, const memory_plan& mem);

  std::uint64_t allocations() const { return allocations_.load(std::memory_order_relaxed); }

  void execute(step_plan plan, boost::asio::any_completion_handler<worker::execute_signature> handler);
  // The masks of the step waiting for them (worker::send_masks); taken even while a stop drains,
  // since that step holds the shell open.
  void masks(step_masks m);

 private:
  // A step begun on a device that queues steps, waiting to be collected and answered.
  struct queued_step {
    step_plan plan;
    actors::reply<step_result> reply;
    std::chrono::steady_clock::time_point t0;  // when it was begun
    error_code error;                          // set: refused or failed to begin, answered with it in turn
    bool awaiting_masks = false;               // begun up to its logits: finish_begin() once they come
    error_code late_error;                     // on the device, but answered with this once collected
  };
  // A step waiting for its masks on a device that does not queue steps: not run yet.
  struct held_step {
    step_plan plan;
    actors::reply<step_result> reply;
  };

  // Feeds `plan` (feed()) and checks it (refuse()); false, logged, when the worker refuses it.
  bool admit(step_plan& plan);
  actors::outcome<step_result> run(step_plan& plan);
  void run_and_answer(step_plan& plan, actors::reply<step_result> r);  // a device that does not queue steps
  // "" or why the worker refuses `plan` (check_plan, the device's context limit).
  std::string refuse(const step_plan& plan) const;
  void start(step_plan plan, actors::reply<step_result> reply);  // a device that queues steps
  void on_masks(step_masks m);
  // Finishes the queued step q waiting for its masks once they are in its plan; `late`: answer it
  // with this error all the same (its masks were malformed, or never came).
  void finish_waiting(queued_step& q, error_code late);
  struct collected {
    actors::reply<step_result> reply;
    actors::outcome<step_result> result;
    void send();  // answers the reply with the result
  };
  collected collect_oldest();
  void poll();           // answers the steps that have ended; again later while any is queued
  void answer(step_result& result, const step_plan& plan, std::chrono::steady_clock::time_point t0);
  // Replaces each feed_from's placeholder by the token drawn for that output in the step before;
  // "" or why the plan cannot be fed (not numbered right after the last step that ran to the end,
  // or an output that was not drawn).
  std::string feed(step_plan& plan) const;

  std::unique_ptr<worker_device> dev_;
  // The last step: its number, and each output's drawn token (-1: none); valid once a step ran
  // to the end, not after a failed one.
  bool last_valid_ = false;
  std::uint64_t last_step_ = 0;
  std::vector<std::int32_t> last_drawn_;
  // A device that queues steps: the steps begun and not answered (oldest first), whether a poll
  // is posted, when the oldest became the oldest (its start on the device, near enough), and the
  // device times of the last steps collected (how long the poll may sleep).
  std::deque<queued_step> queued_;
  std::optional<held_step> held_;  // a device that does not queue steps
  bool polling_ = false;
  std::chrono::steady_clock::time_point oldest_since_;
  double recent_busy_us_[8] = {};
  std::size_t busy_at_ = 0;
  const memory_plan& mem_;
  std::atomic<std::uint64_t> allocations_{0};
};

}  // namespace anvil::gpu_worker
