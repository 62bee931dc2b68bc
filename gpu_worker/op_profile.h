// Where a step's device time goes, op by op: a diagnostic of the GPU worker, on when the process
// starts with ANVIL_OP_PROFILE=1 (bench/README.md). Each step records an event on the stream
// before each op (mark()); when the step is collected, the time from one mark to the next is
// added to the first mark's op, summed over layers and steps, apart for decode-only steps and
// steps with prompt tokens; beside it, the worker thread's time from one mark to the next (an op
// whose host time exceeds its device time leaves the device idle: the step is enqueued too
// slowly). The table goes to the log every report_every steps and when the worker stops.
//
// What it costs: steps run eagerly (no decode graphs) and every mark stops the next kernel from
// starting under the one before (programmatic dependent launch), so a profiled step is slower
// than an unprofiled one; the shares, not the sums, are what it is for. Off (the default), it
// holds no events and every call returns at once.
//
// The events are created at start-up (create()); nothing is allocated on the device.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/gpu_runtime.h"

namespace anvil::gpu_worker {

class op_profile {
 public:
  static constexpr std::uint64_t report_every = 500;

  op_profile() = default;
  op_profile(const op_profile&) = delete;
  op_profile& operator=(const op_profile&) = delete;
  ~op_profile();

  // Whether the environment asks for it (ANVIL_OP_PROFILE set to anything but "" or "0").
  static bool requested();
  // Start-up: events for n_slots steps in flight of up to max_marks marks each.
  void create(std::size_t n_slots, std::size_t max_marks);
  bool on() const { return !slots_.empty(); }

  // A step begun in `slot`: its marks start over; decode: no prompt tokens in it.
  void start(std::size_t slot, bool decode, std::int64_t tokens);
  // The time from here to the next mark (or to end()) is `op`'s (a string literal).
  void mark(const char* op, hipStream_t stream);
  // The step's last command is enqueued (the closing mark).
  void end(hipStream_t stream);
  // After the slot's step ended on the device: its times into the sums (and the log, every
  // report_every steps).
  void finish(std::size_t slot);
  // The table of the sums so far (empty when off or nothing was profiled).
  std::string report() const;

 private:
  struct slot_marks {
    std::vector<hipEvent_t> events;
    std::vector<std::chrono::steady_clock::time_point> host;  // when each mark was enqueued
    std::vector<const char*> ops;  // per mark but the last
    std::size_t used = 0;
    bool decode = false, overflow = false;
    std::int64_t tokens = 0;
  };
  struct op_sum {
    double ms = 0;
    double host_ms = 0;  // the worker's thread, enqueuing the op
    std::uint64_t marks = 0;
  };
  struct kind_sum {
    std::uint64_t steps = 0;
    std::int64_t tokens = 0;
    double ms = 0;
    std::map<std::string, op_sum> ops;
  };
  std::vector<slot_marks> slots_;
  slot_marks* current_ = nullptr;  // the step being enqueued, between start() and end()
  kind_sum decode_, mixed_;
  std::uint64_t finished_ = 0;
};

}  // namespace anvil::gpu_worker
