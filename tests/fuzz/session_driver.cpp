#include "tests/fuzz/session_driver.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tests/fuzz/gguf_image.h"

namespace anvil::fuzz {

const std::shared_ptr<engine>& micro_engine() {
  static const auto* eng = [] {
    const auto path = std::filesystem::temp_directory_path() / ("anvil_fuzz_micro_" + std::to_string(::getpid()) + ".gguf");
    const bytes b = micro_model().serialise();
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    engine_config cfg;
    cfg.model_path = path.string();
    cfg.backend = worker_backend::cpu;
    cfg.kv_budget_bytes = 1u << 20;
    cfg.max_model_len = 64;
    cfg.max_seqs = 8;
    cfg.max_queue = 64;
    cfg.threads = 1;
    auto* e = new std::shared_ptr<engine>(engine::create(cfg));
    std::filesystem::remove(path);  // the engine holds its mapping
    return e;
  }();
  return *eng;
}

void strand_queue::post(std::function<void()> fn) {
  {
    std::lock_guard lock(m_);
    q_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

void strand_queue::run_until(const std::function<bool()>& done, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    std::unique_lock lock(m_);
    if (!cv_.wait_until(lock, deadline, [&] { return !q_.empty(); })) {
      std::fprintf(stderr, "fuzz: the session did not finish within %lld s\n", static_cast<long long>(limit.count()));
      std::abort();
    }
    auto fn = std::move(q_.front());
    q_.pop_front();
    lock.unlock();
    fn();
  }
}

void strand_queue::run_ready() {
  for (;;) {
    std::unique_lock lock(m_);
    if (q_.empty()) return;
    auto fn = std::move(q_.front());
    q_.pop_front();
    lock.unlock();
    fn();
  }
}

void strand_queue::settle(engine& eng) {
  // The engine ends a request (live.erase, then its last event) and counts live requests on one
  // strand, so once the count is 0 every event has been posted here.
  run_until([&] { return eng.stats().live_requests == 0; });
  run_ready();
}

}  // namespace anvil::fuzz
