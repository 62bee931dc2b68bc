// Fault injection: a TESTING HOOK that makes a worker fail or stall chosen steps the way a broken
// device does, so the engine's fault handling (DESIGN.md, Errors: a device fault fails the
// in-flight requests with an error and marks the engine unhealthy; it never hangs a client) can
// be proved on any machine, through the real engine, for either backend.
//
// fault_injecting_worker decorates any worker (cpu_worker, gpu_worker): steps are counted from 0
// in the order the worker receives them; a step chosen to fail completes with errc::device_fault
// and never runs (a device that died runs nothing); a delayed step starts late. The engine
// installs it when engine_config::test_faults asks for one; `anvil serve` reads the spec from the
// environment variable ANVIL_FAULT_INJECT (gpu_worker/README.md):
//
//   fail_step:N          step N fails; later steps run
//   after_steps:N        steps 0..N-1 run; every step from N on fails (the device is gone)
//   delay_step:N:MS      step N starts MS milliseconds late
//
// several joined by commas ("delay_step:2:300,after_steps:5"). Never on in production.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/any_io_executor.hpp>

#include "gpu_worker/worker.h"

namespace anvil::gpu_worker {

struct fault_injection {
  std::int64_t fail_step = -1;              // this step fails (-1: none)
  std::int64_t fail_from_step = -1;         // this step and every later one fail (-1: none)
  std::int64_t delay_step = -1;             // this step starts late (-1: none)
  std::chrono::milliseconds delay{0};       // by this much

  bool any() const { return fail_step >= 0 || fail_from_step >= 0 || delay_step >= 0; }
  bool fails(std::int64_t step) const {
    return step == fail_step || (fail_from_step >= 0 && step >= fail_from_step);
  }
};

// Parses the spec above; throws std::invalid_argument naming what is wrong. "" gives no faults.
fault_injection parse_fault_injection(std::string_view spec);
// The spec back, for logs ("after_steps:5"); "" when there are no faults.
std::string describe(const fault_injection& f);

class fault_injecting_worker final : public worker {
 public:
  // Wraps `inner` (owned). Replies and timers run on `ex`; like any worker, it must not be
  // destroyed while a step is in flight (the scheduler's stop waits for its loop).
  fault_injecting_worker(std::unique_ptr<worker> inner, fault_injection faults, boost::asio::any_io_executor ex);
  ~fault_injecting_worker() override;

  const memory_plan& plan() const override;
  std::uint64_t device_allocations() const override;
  std::int64_t steps_seen() const;  // steps received so far, failed ones included

 private:
  void do_execute(step_plan plan, boost::asio::any_completion_handler<execute_signature> handler) override;
  void do_masks(step_masks masks) override;

  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace anvil::gpu_worker
