#include "gpu_worker/fault_injection.h"

#include <atomic>
#include <charconv>
#include <deque>
#include <mutex>
#include <optional>
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
// A step's deferred masks (step_masks) follow its plan to the inner worker: held with the plan
// while it waits here, passed on at once when the plan is there, dropped with a failed step.
struct fault_injecting_worker::impl {
  struct pending {
    step_plan plan;
    boost::asio::any_completion_handler<execute_signature> handler;
    std::optional<step_masks> masks{};  // came while the plan waited here
  };
  std::unique_ptr<worker> inner;
  fault_injection faults;
  boost::asio::any_io_executor ex;
  std::atomic<std::int64_t> next{0};
  std::shared_ptr<spdlog::logger> log = log::get("gpu");
  // Recursive: forward() holds it while the inner worker takes a plan, and a worker that answers
  // inline (a test's) runs done() and start() for the next step within that call.
  std::recursive_mutex mu;
  std::deque<pending> queue;  // mu
  bool busy = false;          // mu: a step is with the inner worker, or delayed, or being answered
  // mu: the active step (the last one started): its number, whether its plan is with the inner
  // worker yet (a delayed one is not), and masks that came before it was.
  std::optional<std::uint64_t> active;
  bool active_forwarded = false;
  std::optional<step_masks> active_masks;

  void start(pending p);
  // The active step's plan to the inner worker, then its masks.
  template <class Handler>
  void forward(step_plan plan, Handler handler, std::optional<step_masks> masks);
  void done();  // the active step was answered: start the next one
  void masks(step_masks m);
};

void fault_injecting_worker::impl::masks(step_masks m) {
  std::unique_lock lock(mu);
  if (active == m.step) {
    if (!active_forwarded) {
      active_masks = std::move(m);
      return;
    }
    lock.unlock();
    return inner->send_masks(std::move(m));
  }
  for (pending& p : queue) {
    if (p.plan.step == m.step) {
      p.masks = std::move(m);
      return;
    }
  }
  // A failed step's (it never ran) or an unknown one's: nothing waits for them.
}

template <class Handler>
void fault_injecting_worker::impl::forward(step_plan plan, Handler handler, std::optional<step_masks> m) {
  const std::uint64_t step = plan.step;
  {
    // Under the lock, so that masks() cannot pass this plan's masks on before the plan.
    std::lock_guard lock(mu);
    inner->async_execute(std::move(plan), std::move(handler));
    if (active == step) {
      active_forwarded = true;
      if (active_masks) m = std::exchange(active_masks, std::nullopt);
    }
  }
  if (m) inner->send_masks(std::move(*m));
}

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
  {
    std::lock_guard lock(mu);
    active = p.plan.step;
    active_forwarded = false;
    active_masks.reset();
  }
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
      forward(std::move(p.plan), answered(std::move(p.handler)), std::move(p.masks));
    });
    return;
  }
  forward(std::move(p.plan), answered(std::move(p.handler)), std::move(p.masks));
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

void fault_injecting_worker::do_masks(step_masks masks) { impl_->masks(std::move(masks)); }

}  // namespace anvil::gpu_worker
