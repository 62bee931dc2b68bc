// executor_pool: a named set of threads running one io_context, on which actors' strands run.
// The engine keeps one pool for the CPU-side actors; the GPU worker gets a pool of one thread of
// its own. An exception escaping a handler is logged and the thread goes on running: a server
// must not die of one bad message.
//
// Idle spin: a thread that runs out of handlers may poll for new ones for a while before it
// sleeps. A GPU decode step ends in a chain of hops between actors on these pools (worker →
// scheduler → sampler → scheduler → KV manager → scheduler → worker), and a thread woken from a
// sleep as long as a step takes tens of microseconds per hop: about 0.1 ms per token, 4% of an
// 8B model's decode step on an H200 (bench/GPU_NOTES.md). Spinning costs a busy core per thread
// while work keeps coming.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include <boost/asio/any_io_executor.hpp>

namespace anvil::actors {

class executor_pool {
 public:
  // Starts `threads` (at least 1) threads named "<name>-<i>"; each polls for up to `idle_spin`
  // after its last handler before it blocks (0: blocks at once).
  executor_pool(std::string name, std::size_t threads, std::chrono::microseconds idle_spin = {});
  ~executor_pool();  // join()
  executor_pool(const executor_pool&) = delete;
  executor_pool& operator=(const executor_pool&) = delete;

  boost::asio::any_io_executor get_executor() const;
  std::size_t size() const noexcept;
  // True on one of the pool's own threads (where joining the pool would wait for itself).
  bool running_in_this_thread() const noexcept;
  const std::string& name() const noexcept;

  // Lets the pool run out of work (every queued handler runs), then joins the threads.
  void join();
  // Abandons queued work: threads return after their current handler. Then join().
  void stop();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace anvil::actors
