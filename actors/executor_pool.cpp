#include "actors/executor_pool.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <spdlog/logger.h>

#include "actors/log.h"

namespace anvil::actors {

namespace asio = boost::asio;

struct executor_pool::impl {
  std::string name;
  asio::io_context ctx;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;
  std::vector<std::thread> threads;

  std::chrono::microseconds idle_spin;

  impl(std::string n, std::size_t count, std::chrono::microseconds spin)
      : name(std::move(n)), ctx(static_cast<int>(count)), guard(asio::make_work_guard(ctx)), idle_spin(spin) {}

  // Runs handlers; after the last ready one, polls for more for up to idle_spin before blocking.
  // Returns when the context stops (stop(), or out of work after join()).
  void run_spinning() {
    using clock = std::chrono::steady_clock;
    auto last_work = clock::now();
    for (;;) {
      if (ctx.poll() > 0) {
        last_work = clock::now();
      } else if (ctx.stopped()) {
        return;
      } else if (clock::now() - last_work < idle_spin) {
        std::this_thread::yield();
      } else {
        if (ctx.run_one() == 0 && ctx.stopped()) return;
        last_work = clock::now();
      }
    }
  }

  void run_thread(std::size_t index) {
    // Linux limits thread names to 15 characters.
    const std::string thread_name = (name + "-" + std::to_string(index)).substr(0, 15);
    pthread_setname_np(pthread_self(), thread_name.c_str());
    for (;;) {
      try {
        if (idle_spin.count() > 0) {
          run_spinning();
        } else {
          ctx.run();
        }
        return;
      } catch (const std::exception& e) {
        log::get("actors")->error("{}: handler threw, thread goes on: {}", thread_name, e.what());
      } catch (...) {
        log::get("actors")->error("{}: handler threw a non-exception, thread goes on", thread_name);
      }
    }
  }
};

executor_pool::executor_pool(std::string name, std::size_t threads, std::chrono::microseconds idle_spin) {
  const std::size_t n = threads == 0 ? 1 : threads;
  impl_ = std::make_unique<impl>(std::move(name), n, std::max(idle_spin, std::chrono::microseconds(0)));
  impl_->threads.reserve(n);
  for (std::size_t i = 0; i < n; ++i) impl_->threads.emplace_back([this, i] { impl_->run_thread(i); });
}

executor_pool::~executor_pool() { join(); }

asio::any_io_executor executor_pool::get_executor() const { return impl_->ctx.get_executor(); }
std::size_t executor_pool::size() const noexcept { return impl_->threads.size(); }
bool executor_pool::running_in_this_thread() const noexcept { return impl_->ctx.get_executor().running_in_this_thread(); }
const std::string& executor_pool::name() const noexcept { return impl_->name; }

void executor_pool::join() {
  impl_->guard.reset();
  for (auto& t : impl_->threads) {
    if (t.joinable()) t.join();
  }
}

void executor_pool::stop() {
  impl_->ctx.stop();
  join();
}

}  // namespace anvil::actors
