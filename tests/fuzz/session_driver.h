// What the line- and HTTP-session fuzz targets share: one engine on the micro model (CPU worker,
// a 64-token context, so every request ends within milliseconds), and the connection's strand
// played by a queue the target drains on its own thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include "engine/engine.h"

namespace anvil::fuzz {

// Created on first use and never destroyed: the fuzz process keeps one engine for all inputs.
const std::shared_ptr<engine>& micro_engine();

class strand_queue {
 public:
  void post(std::function<void()> fn);
  // Runs posted work on this thread until done() holds; aborts (a hang) after `limit`.
  void run_until(const std::function<bool()>& done, std::chrono::seconds limit = std::chrono::seconds(20));
  // Runs what is queued now, without waiting.
  void run_ready();
  // Waits until the engine has no live request, then runs what they posted: after this no
  // engine event of this input's requests can reach the session any more.
  void settle(engine& eng);

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
};

}  // namespace anvil::fuzz
