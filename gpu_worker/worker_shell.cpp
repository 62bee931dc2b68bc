#include "gpu_worker/worker_shell.h"

#include <algorithm>
#include <exception>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include <boost/asio/post.hpp>
#include <spdlog/logger.h>

#include "gpu_worker/plan_check.h"

namespace anvil::gpu_worker {

void worker_device::begin(const step_plan&) { throw std::logic_error("worker_device::begin: this device does not queue steps"); }
void worker_device::collect(const step_plan&, step_result&) {
  throw std::logic_error("worker_device::collect: this device does not queue steps");
}
void worker_device::finish_begin(const step_plan&) {
  throw std::logic_error("worker_device::finish_begin: this device does not queue steps");
}

bool defers_masks(const step_plan& plan) {
  return std::any_of(plan.seqs.begin(), plan.seqs.end(), [](const seq_step& s) { return s.mask_deferred; });
}

std::string apply_masks(step_plan& plan, step_masks& masks, std::int64_t n_vocab) {
  std::size_t deferred = 0;
  for (const seq_step& s : plan.seqs) deferred += s.mask_deferred ? 1 : 0;
  std::string why;
  if (masks.step != plan.step) {
    why = "masks for step " + std::to_string(masks.step);
  } else if (masks.allowed.size() != deferred) {
    why = std::to_string(masks.allowed.size()) + " masks for " + std::to_string(deferred) + " sequences waiting for one";
  }
  for (std::size_t i = 0; why.empty() && i < masks.allowed.size(); ++i) {
    if (!masks.allowed[i].empty() && std::int64_t(masks.allowed[i].size()) != (n_vocab + 31) / 32) {
      why = "mask " + std::to_string(i) + " does not cover the vocabulary";
    }
  }
  std::size_t k = 0;
  for (seq_step& s : plan.seqs) {
    if (!s.mask_deferred) continue;
    s.mask_deferred = false;
    if (why.empty()) s.logits.allowed = std::move(masks.allowed[k++]);
  }
  return why;
}


worker_shell::worker_shell(boost::asio::any_io_executor ex, std::unique_ptr<worker_device> dev, const memory_plan& mem)
    : strand_actor(std::move(ex), {"gpu", 1024}), dev_(std::move(dev)), mem_(mem) {
  log().info("{}", dev_->describe(mem));
  allocations_.store(dev_->allocations());
}

void worker_shell::execute(step_plan plan, boost::asio::any_completion_handler<worker::execute_signature> handler) {
  ask_later<step_result>(std::move(handler), [this, p = std::move(plan)](actors::reply<step_result> r) mutable {
    if (dev_->queues_steps()) return start(std::move(p), std::move(r));
    if (held_) {  // its masks did not come before this plan: it cannot run
      log().error("step={} failed: the next plan came before its masks", held_->plan.step);
      held_step h = std::move(*held_);
      held_.reset();
      last_valid_ = false;
      h.reply.fail(make_error_code(errc::invalid_argument));
    }
    if (defers_masks(p)) {
      held_.emplace(held_step{.plan = std::move(p), .reply = std::move(r)});
      return;
    }
    run_and_answer(p, std::move(r));
  });
}

void worker_shell::masks(step_masks m) {
  const std::uint64_t step = m.step;
  const error_code refused = tell_urgent([this, m = std::move(m)]() mutable { on_masks(std::move(m)); });
  if (refused) log().error("masks for step {} refused: {}", step, refused.message());
}

void worker_shell::run_and_answer(step_plan& plan, actors::reply<step_result> r) {
  actors::outcome<step_result> o = run(plan);
  if (o) {
    r(error_code{}, std::move(*o));
  } else {
    r.fail(o.error());
  }
}

void worker_shell::on_masks(step_masks m) {
  if (held_ && held_->plan.step == m.step) {
    held_step h = std::move(*held_);
    held_.reset();
    if (const std::string why = apply_masks(h.plan, m, mem_.n_vocab); !why.empty()) {
      log().error("step={} rejected: {}", h.plan.step, why);
      last_valid_ = false;
      return h.reply.fail(make_error_code(errc::invalid_argument));
    }
    return run_and_answer(h.plan, std::move(h.reply));
  }
  for (queued_step& q : queued_) {
    if (!q.awaiting_masks || q.plan.step != m.step) continue;
    const std::string why = apply_masks(q.plan, m, mem_.n_vocab);
    if (!why.empty()) log().error("step={} rejected: {}", q.plan.step, why);
    return finish_waiting(q, why.empty() ? error_code{} : make_error_code(errc::invalid_argument));
  }
  // A step refused before it began, or one failed for want of these masks: nothing waits.
  log().warn("masks for step {}, which waits for none: dropped", m.step);
}

void worker_shell::finish_waiting(queued_step& q, error_code late) {
  q.awaiting_masks = false;
  q.late_error = late;
  try {
    dev_->finish_begin(q.plan);
  } catch (const std::exception& e) {
    log().error("step={} failed: {}", q.plan.step, e.what());
    q.error = make_error_code(errc::device_fault);  // not finished on the device: never collected
  }
  if (!polling_) {
    polling_ = true;
    boost::asio::post(get_executor(), [this] { poll(); });
  }
}

std::string worker_shell::feed(step_plan& plan) const {
  for (seq_step& s : plan.seqs) {
    if (s.feed_from < 0) continue;
    const std::string where = "seq " + std::to_string(s.seq_id) + ": ";
    if (s.tokens.size() != 1) return where + "a fed sequence feeds exactly one token";
    if (!last_valid_ || plan.step != last_step_ + 1) return where + "feeds from a step that did not run just before";
    if (dev_->queues_steps()) continue;  // the device takes the token itself
    if (std::size_t(s.feed_from) >= last_drawn_.size() || last_drawn_[std::size_t(s.feed_from)] < 0) {
      return where + "feeds from an output that was not drawn";
    }
    s.tokens[0] = last_drawn_[std::size_t(s.feed_from)];
  }
  return "";
}

std::string worker_shell::refuse(const step_plan& plan) const {
  std::string why = check_plan(plan, mem_);
  for (std::size_t i = 0; why.empty() && i < plan.seqs.size(); ++i) {
    const seq_step& s = plan.seqs[i];
    if (s.start_pos + std::int64_t(s.tokens.size()) > dev_->max_context()) {
      why = "seq " + std::to_string(s.seq_id) + ": past the worker's max_context";
    }
  }
  return why;
}

void worker_shell::answer(step_result& result, const step_plan& plan, std::chrono::steady_clock::time_point t0) {
  for (const seq_output& out : result.outputs) {
    if (out.top.empty()) log().error("step={} req={}: {}", plan.step, out.seq_id, dev_->unusable(out.seq_id));
  }
  allocations_.store(dev_->allocations(), std::memory_order_relaxed);
  result.execute_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  log().debug("step={} seqs={} ms={:.2f}", plan.step, plan.seqs.size(), result.execute_ms);
}

bool worker_shell::admit(step_plan& plan) {
  std::string why = feed(plan);
  last_valid_ = false;  // until this step has run (or begun) without failing
  if (why.empty()) why = refuse(plan);
  if (why.empty()) return true;
  log().error("step={} rejected: {}", plan.step, why);
  return false;
}

actors::outcome<step_result> worker_shell::run(step_plan& plan) {
  if (!admit(plan)) return make_error_code(errc::invalid_argument);
  const auto t0 = std::chrono::steady_clock::now();
  step_result result;
  result.step = plan.step;
  try {
    dev_->execute(plan, result);
  } catch (const std::exception& e) {
    // A device error (or logits the candidates op refuses): this step fails, the process lives.
    log().error("step={} failed: {}", plan.step, e.what());
    return make_error_code(errc::device_fault);
  }
  last_valid_ = true;
  last_step_ = plan.step;
  last_drawn_.clear();
  for (const seq_output& out : result.outputs) last_drawn_.push_back(out.top.empty() ? -1 : out.drawn);
  answer(result, plan, t0);
  return result;
}

// A device that queues steps: begin this one now, behind whatever still runs; answers come from
// poll() (or from here, when a third step must wait for the oldest to be collected).
void worker_shell::start(step_plan plan, actors::reply<step_result> reply) {
  const auto t0 = std::chrono::steady_clock::now();
  // Steps are answered in the order they came, a refused or failed one too (the scheduler
  // completes its steps in order): behind the steps still queued, or at once.
  const auto fail = [&](error_code ec) {
    if (queued_.empty()) return reply.fail(ec);
    queued_.push_back({.plan = std::move(plan), .reply = std::move(reply), .t0 = t0, .error = ec, .awaiting_masks = false, .late_error = {}});
  };
  if (!queued_.empty() && queued_.back().awaiting_masks) {  // they did not come before this plan
    log().error("step={} failed: the next plan came before its masks", queued_.back().plan.step);
    for (seq_step& s : queued_.back().plan.seqs) s.mask_deferred = false;  // it ends without them
    finish_waiting(queued_.back(), make_error_code(errc::invalid_argument));
  }
  if (!admit(plan)) return fail(make_error_code(errc::invalid_argument));
  while (queued_.size() >= 2) collect_oldest().send();  // the step being started holds the shell open
  try {
    dev_->begin(plan);
  } catch (const std::exception& e) {
    log().error("step={} failed: {}", plan.step, e.what());
    return fail(make_error_code(errc::device_fault));
  }
  last_valid_ = true;
  last_step_ = plan.step;
  if (queued_.empty()) oldest_since_ = t0;
  const bool deferred = defers_masks(plan);  // begun up to its logits
  queued_.push_back({.plan = std::move(plan), .reply = std::move(reply), .t0 = t0, .error = {}, .awaiting_masks = deferred, .late_error = {}});
  if (!polling_) {
    polling_ = true;
    boost::asio::post(get_executor(), [this] { poll(); });
  }
}

// Collects the oldest queued step; the caller answers it (its reply keeps the shell alive).
worker_shell::collected worker_shell::collect_oldest() {
  queued_step q = std::move(queued_.front());
  queued_.pop_front();
  if (q.error) return {std::move(q.reply), q.error};  // refused, or failed to begin: not on the device
  oldest_since_ = std::chrono::steady_clock::now();  // the next one runs on the device from about now
  step_result result;
  result.step = q.plan.step;
  try {
    dev_->collect(q.plan, result);
  } catch (const std::exception& e) {
    log().error("step={} failed: {}", q.plan.step, e.what());
    return {std::move(q.reply), make_error_code(errc::device_fault)};
  }
  if (result.device_busy_us > 0) recent_busy_us_[busy_at_++ % std::size(recent_busy_us_)] = result.device_busy_us;
  answer(result, q.plan, q.t0);
  if (q.late_error) return {std::move(q.reply), q.late_error};
  return {std::move(q.reply), std::move(result)};
}

void worker_shell::collected::send() {
  if (result) {
    reply(error_code{}, std::move(*result));
  } else {
    reply.fail(result.error());
  }
}

// One step answered per call, and answering is the last thing it does: while a step is queued its
// reply holds the actor open, so the poll posted before the answer finds the shell alive.
void worker_shell::poll() {
  polling_ = false;
  if (queued_.empty()) return;
  if (!queued_.front().error && queued_.front().awaiting_masks) return;  // polled again once they come
  if (queued_.front().error || dev_->oldest_ended()) {
    collected c = collect_oldest();
    if (!queued_.empty()) {
      polling_ = true;
      boost::asio::post(get_executor(), [this] { poll(); });
    }
    return c.send();
  }
  // Far from its end (by the shortest device time of the last few steps), sleep most of the way
  // instead of polling: a step that arrives meanwhile is begun on waking, still ahead of the
  // device. Near it, yield.
  const double since_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - oldest_since_).count();
  const double left_us = *std::min_element(std::begin(recent_busy_us_), std::end(recent_busy_us_)) - since_us;
  if (left_us > 300) {
    std::this_thread::sleep_for(std::chrono::microseconds(std::int64_t(std::min(left_us - 200, 1000.0))));
  } else {
    std::this_thread::yield();
  }
  polling_ = true;
  boost::asio::post(get_executor(), [this] { poll(); });
}

}  // namespace anvil::gpu_worker
