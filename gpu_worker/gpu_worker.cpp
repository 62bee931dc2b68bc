// The GPU worker's actor shell: start-up on the caller's thread (gpu_device's constructor), then
// steps one at a time on a thread of its own, answered through the worker interface. The device
// side is gpu_device (gpu_device.{h,cpp}).
#include "gpu_worker/gpu_worker.h"

#include <atomic>
#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>

#include <boost/asio/use_future.hpp>
#include <spdlog/logger.h>

#include "actors/executor_pool.h"
#include "actors/strand_actor.h"
#include "gpu_worker/device_query.h"
#include "gpu_worker/gpu_device.h"
#include "gpu_worker/plan_check.h"

namespace anvil::gpu_worker {
namespace {

class gpu_executor : public actors::strand_actor {
 public:
  gpu_executor(boost::asio::any_io_executor ex, const model::llm& m, const gpu_worker_config& cfg, memory_plan& mem)
      : strand_actor(std::move(ex), {"gpu", 1024}), dev_(m, cfg, mem), mem_(mem) {
    log().info("memory plan on {}: {} KV blocks of {} tokens ({:.1f} MB f16), weights {:.1f} MB, scratch {:.1f} MB, "
               "step limits {} tokens / {} seqs, {} device allocations, decode graphs for {} batch sizes",
               mem.device, mem.n_blocks, mem.block_size, double(mem.kv_bytes) / 1e6, double(mem.weight_bytes) / 1e6,
               double(mem.scratch_bytes) / 1e6, mem.max_batch_tokens, mem.max_seqs, dev_.allocations(), mem.decode_graphs);
    allocations_.store(dev_.allocations());
  }

  std::uint64_t allocations() const { return allocations_.load(std::memory_order_relaxed); }

  void execute(step_plan plan, boost::asio::any_completion_handler<worker::execute_signature> handler) {
    ask<step_result>(std::move(handler), [this, p = std::move(plan)]() -> actors::outcome<step_result> { return run(p); });
  }

 private:
  actors::outcome<step_result> run(const step_plan& plan) {
    std::string why = check_plan(plan, mem_);
    for (std::size_t i = 0; why.empty() && i < plan.seqs.size(); ++i) {
      const seq_step& s = plan.seqs[i];
      if (s.start_pos + std::int64_t(s.tokens.size()) > dev_.max_context()) {
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
      dev_.execute(plan, result);
    } catch (const std::exception& e) {
      // A device error (or logits the candidates op refuses): this step fails, the process lives.
      log().error("step={} failed: {}", plan.step, e.what());
      return make_error_code(errc::device_fault);
    }
    for (const seq_output& out : result.outputs) {
      if (out.top.empty()) log().error("step={} req={}: its logits hold a NaN or +inf, or none is finite; it fails alone", plan.step, out.seq_id);
    }
    allocations_.store(dev_.allocations(), std::memory_order_relaxed);
    result.execute_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    log().debug("step={} seqs={} ms={:.2f}", plan.step, plan.seqs.size(), result.execute_ms);
    return result;
  }

  gpu_device dev_;
  memory_plan& mem_;
  std::atomic<std::uint64_t> allocations_{0};
};

}  // namespace

struct gpu_worker::impl {
  explicit impl(std::chrono::microseconds idle_spin) : pool("gpu", 1, idle_spin) {}
  memory_plan mem;
  actors::executor_pool pool;
  std::unique_ptr<gpu_executor> exec;
};

gpu_worker::gpu_worker(const model::llm& model, const gpu_worker_config& config)
    : impl_(std::make_unique<impl>(config.idle_spin)) {
  try {
    impl_->exec = std::make_unique<gpu_executor>(impl_->pool.get_executor(), model, config, impl_->mem);
  } catch (...) {
    impl_->pool.join();
    throw;
  }
}

gpu_worker::~gpu_worker() {
  impl_->exec->async_stop(boost::asio::use_future).get();
  impl_->exec.reset();
  impl_->pool.join();
}

bool gpu_worker::available() { return !query_devices().devices.empty(); }

const memory_plan& gpu_worker::plan() const { return impl_->mem; }
std::uint64_t gpu_worker::device_allocations() const { return impl_->exec->allocations(); }

void gpu_worker::do_execute(step_plan plan, boost::asio::any_completion_handler<execute_signature> handler) {
  impl_->exec->execute(std::move(plan), std::move(handler));
}

}  // namespace anvil::gpu_worker
