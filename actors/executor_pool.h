// executor_pool: a named set of threads running one io_context, on which actors' strands run.
// The engine keeps one pool for the CPU-side actors; the GPU worker gets a pool of one thread of
// its own. An exception escaping a handler is logged and the thread goes on running: a server
// must not die of one bad message.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include <boost/asio/any_io_executor.hpp>

namespace anvil::actors {

class executor_pool {
 public:
  // Starts `threads` (at least 1) threads named "<name>-<i>".
  executor_pool(std::string name, std::size_t threads);
  ~executor_pool();  // join()
  executor_pool(const executor_pool&) = delete;
  executor_pool& operator=(const executor_pool&) = delete;

  boost::asio::any_io_executor get_executor() const;
  std::size_t size() const noexcept;
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
