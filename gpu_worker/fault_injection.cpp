#include "gpu_worker/fault_injection.h"

#include <atomic>
#include <charconv>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/logger.h>

#include "actors/log.h"
#include "actors/strand_actor.h"

namespace anvil::gpu_worker {
namespace {

std::int64_t number(std::string_view s, std::string_view item) {
  std::int64_t v = -1;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0) {
    throw std::invalid_argument("fault injection: '" + std::string(item) + "' needs a non-negative number, not '" +
                                std::string(s) + "'");
  }
  return v;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (std::size_t at; (at = s.find(sep)) != std::string_view::npos; s.remove_prefix(at + 1)) out.push_back(s.substr(0, at));
  out.push_back(s);
  return out;
}

}  // namespace

fault_injection parse_fault_injection(std::string_view spec) {
  fault_injection f;
  if (spec.empty()) return f;
  for (std::string_view item : split(spec, ',')) {
    const std::vector<std::string_view> p = split(item, ':');
    if (p[0] == "fail_step" && p.size() == 2) {
      f.fail_step = number(p[1], item);
    } else if (p[0] == "after_steps" && p.size() == 2) {
      f.fail_from_step = number(p[1], item);
    } else if (p[0] == "delay_step" && p.size() == 3) {
      f.delay_step = number(p[1], item);
      f.delay = std::chrono::milliseconds(number(p[2], item));
    } else {
      throw std::invalid_argument("fault injection: unknown item '" + std::string(item) +
                                  "' (fail_step:N, after_steps:N or delay_step:N:MS, joined by commas)");
    }
  }
  return f;
}

std::string describe(const fault_injection& f) {
  std::string out;
  const auto add = [&out](std::string s) { out += (out.empty() ? "" : ",") + s; };
  if (f.fail_step >= 0) add("fail_step:" + std::to_string(f.fail_step));
  if (f.fail_from_step >= 0) add("after_steps:" + std::to_string(f.fail_from_step));
  if (f.delay_step >= 0) add("delay_step:" + std::to_string(f.delay_step) + ":" + std::to_string(f.delay.count()));
  return out;
}

// Steps go to the inner worker one at a time, in order: a delayed or failed step must not let the
// next one overtake it, since a real worker answers in order (and a step may feed the tokens the
// step before drew, gpu_worker::seq_step::feed_from).
struct fault_injecting_worker::impl {
  struct pending {
    step_plan plan;
    boost::asio::any_completion_handler<execute_signature> handler;
  };
  std::unique_ptr<worker> inner;
  fault_injection faults;
  boost::asio::any_io_executor ex;
  std::atomic<std::int64_t> next{0};
  std::shared_ptr<spdlog::logger> log = log::get("gpu");
  std::mutex mu;
  std::deque<pending> queue;  // mu
  bool busy = false;          // mu: a step is with the inner worker, or delayed, or being answered

  void start(pending p);
  void done();  // the active step was answered: start the next one
};

void fault_injecting_worker::impl::done() {
  std::unique_lock lock(mu);
  if (queue.empty()) {
    busy = false;
    return;
  }
  pending p = std::move(queue.front());
  queue.pop_front();
  lock.unlock();
  start(std::move(p));
}

void fault_injecting_worker::impl::start(pending p) {
  const std::int64_t n = next++;
  // The answer runs where the handler wants it (the scheduler's strand). The next step starts
  // first: the answer may end the caller's use of this worker (it may be destroyed as soon as the
  // handler has run), and the next step's own answer still comes after this one, through the same
  // executor.
  const auto answered = [this](boost::asio::any_completion_handler<execute_signature> h) {
    auto where = boost::asio::get_associated_executor(h, ex);
    return boost::asio::bind_executor(where, [this, h = std::move(h)](error_code ec, step_result r) mutable {
      done();
      std::move(h)(ec, std::move(r));
    });
  };
  if (faults.fails(n)) {
    log->error("step={} fails: injected device fault (worker step {})", p.plan.step, n);
    // Answered like any actor reply: posted, never inline, on the handler's executor.
    actors::reply<step_result>(answered(std::move(p.handler)), ex, {})(make_error_code(errc::device_fault), step_result{});
    return;
  }
  if (n == faults.delay_step && faults.delay.count() > 0) {
    log->warn("step={} delayed by {} ms: injected (worker step {})", p.plan.step, faults.delay.count(), n);
    auto timer = std::make_shared<boost::asio::steady_timer>(ex, faults.delay);
    timer->async_wait([this, timer, answered, p = std::move(p)](boost::system::error_code) mutable {
      inner->async_execute(std::move(p.plan), answered(std::move(p.handler)));
    });
    return;
  }
  inner->async_execute(std::move(p.plan), answered(std::move(p.handler)));
}

fault_injecting_worker::fault_injecting_worker(std::unique_ptr<worker> inner, fault_injection faults,
                                               boost::asio::any_io_executor ex)
    : impl_(std::make_unique<impl>()) {
  impl_->inner = std::move(inner);
  impl_->faults = faults;
  impl_->ex = std::move(ex);
  impl_->log->warn("fault injection is on ({}): chosen steps will fail or stall on purpose", describe(faults));
}

fault_injecting_worker::~fault_injecting_worker() = default;

const memory_plan& fault_injecting_worker::plan() const { return impl_->inner->plan(); }
std::uint64_t fault_injecting_worker::device_allocations() const { return impl_->inner->device_allocations(); }
std::int64_t fault_injecting_worker::steps_seen() const { return impl_->next.load(); }

void fault_injecting_worker::do_execute(step_plan plan, boost::asio::any_completion_handler<execute_signature> handler) {
  impl& m = *impl_;
  {
    std::lock_guard lock(m.mu);
    if (m.busy) {
      m.queue.push_back({std::move(plan), std::move(handler)});
      return;
    }
    m.busy = true;
  }
  m.start({std::move(plan), std::move(handler)});
}

}  // namespace anvil::gpu_worker
