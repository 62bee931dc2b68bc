// abortable_barrier: N threads meet, phase after phase; abort() releases every thread waiting (or
// arriving later) with `false` instead of leaving it to wait for one that will not come, until
// reset(). What the CPU ranks' collectives (host_group.h) and the GPU ranks' start-up
// (gpu_worker.cpp) wait on.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace anvil::gpu_worker {

class abortable_barrier {
 public:
  explicit abortable_barrier(int n) : n_(n) {}
  abortable_barrier(const abortable_barrier&) = delete;
  abortable_barrier& operator=(const abortable_barrier&) = delete;

  // Waits until all n have arrived (true), or the barrier is aborted first (false). What a thread
  // wrote before arriving is visible to every thread after a true return.
  [[nodiscard]] bool arrive_and_wait() {
    std::unique_lock lock(mu_);
    if (aborted_) return false;
    const std::uint64_t phase = phase_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++phase_;
      cv_.notify_all();
      return true;
    }
    cv_.wait(lock, [&] { return phase_ != phase || aborted_; });
    return phase_ != phase;
  }
  void abort() {
    const std::lock_guard lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }
  // Ready to meet again: call only while no thread waits.
  void reset() {
    const std::lock_guard lock(mu_);
    aborted_ = false;
    arrived_ = 0;
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::uint64_t phase_ = 0;
  bool aborted_ = false;
};

}  // namespace anvil::gpu_worker
