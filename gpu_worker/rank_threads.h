// rank_threads: the threads of a tensor-parallel worker's ranks 1..N-1 (rank 0 runs on the
// worker's own thread): run(fn) calls fn(r) for every rank at once, each rank always on the same
// thread (a GPU rank's device stays current there), and returns when every call has.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace anvil::gpu_worker {

class rank_threads {
 public:
  explicit rank_threads(int n) {
    for (int r = 1; r < n; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  rank_threads(const rank_threads&) = delete;
  rank_threads& operator=(const rank_threads&) = delete;
  ~rank_threads() {
    {
      const std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // fn must not throw (each rank catches its own failure).
  void run(const std::function<void(int)>& fn) {
    {
      const std::lock_guard lock(mu_);
      job_ = &fn;
      pending_ = int(threads_.size());
      ++epoch_;
    }
    cv_.notify_all();
    fn(0);
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void loop(int r) {
    std::uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* job = nullptr;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || epoch_ != seen; });
        if (stop_) return;
        seen = epoch_;
        job = job_;
      }
      (*job)(r);
      const std::lock_guard lock(mu_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_;
  const std::function<void(int)>* job_ = nullptr;
  std::uint64_t epoch_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace anvil::gpu_worker
