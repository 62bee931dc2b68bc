#include "gpu_worker/worker_shell.h"

#include <chrono>
#include <exception>
#include <string>
#include <utility>

#include <spdlog/logger.h>

#include "gpu_worker/plan_check.h"

namespace anvil::gpu_worker {

worker_shell::worker_shell(boost::asio::any_io_executor ex, std::unique_ptr<worker_device> dev, const memory_plan& mem)
    : strand_actor(std::move(ex), {"gpu", 1024}), dev_(std::move(dev)), mem_(mem) {
  log().info("{}", dev_->describe(mem));
  allocations_.store(dev_->allocations());
}

void worker_shell::execute(step_plan plan, boost::asio::any_completion_handler<worker::execute_signature> handler) {
  ask<step_result>(std::move(handler), [this, p = std::move(plan)]() mutable -> actors::outcome<step_result> { return run(p); });
}

std::string worker_shell::feed(step_plan& plan) const {
  for (seq_step& s : plan.seqs) {
    if (s.feed_from < 0) continue;
    const std::string where = "seq " + std::to_string(s.seq_id) + ": ";
    if (s.tokens.size() != 1) return where + "a fed sequence feeds exactly one token";
    if (!last_valid_ || plan.step != last_step_ + 1) return where + "feeds from a step that did not run just before";
    if (std::size_t(s.feed_from) >= last_drawn_.size() || last_drawn_[std::size_t(s.feed_from)] < 0) {
      return where + "feeds from an output that was not drawn";
    }
    s.tokens[0] = last_drawn_[std::size_t(s.feed_from)];
  }
  return "";
}

actors::outcome<step_result> worker_shell::run(step_plan& plan) {
  std::string why = feed(plan);
  last_valid_ = false;
  if (why.empty()) why = check_plan(plan, mem_);
  for (std::size_t i = 0; why.empty() && i < plan.seqs.size(); ++i) {
    const seq_step& s = plan.seqs[i];
    if (s.start_pos + std::int64_t(s.tokens.size()) > dev_->max_context()) {
      why = "seq " + std::to_string(s.seq_id) + ": past the worker's max_context";
    }
  }
  if (!why.empty()) {
    log().error("step={} rejected: {}", plan.step, why);
    return make_error_code(errc::invalid_argument);
  }
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
  for (const seq_output& out : result.outputs) {
    if (out.top.empty()) log().error("step={} req={}: {}", plan.step, out.seq_id, dev_->unusable(out.seq_id));
  }
  last_valid_ = true;
  last_step_ = plan.step;
  last_drawn_.clear();
  for (const seq_output& out : result.outputs) last_drawn_.push_back(out.top.empty() ? -1 : out.drawn);
  allocations_.store(dev_->allocations(), std::memory_order_relaxed);
  result.execute_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  log().debug("step={} seqs={} ms={:.2f}", plan.step, plan.seqs.size(), result.execute_ms);
  return result;
}

}  // namespace anvil::gpu_worker
