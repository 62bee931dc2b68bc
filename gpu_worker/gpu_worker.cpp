// The GPU worker: start-up on the caller's thread (gpu_device's constructor), then steps one at a
// time on a thread of its own through the shell both workers share (worker_shell.h), answered
// through the worker interface. The device side is gpu_device (gpu_device.h).
#include "gpu_worker/gpu_worker.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <boost/asio/use_future.hpp>
#include <spdlog/fmt/fmt.h>

#include "actors/executor_pool.h"
#include "gpu_worker/device_query.h"
#include "gpu_worker/gpu_device.h"
#include "gpu_worker/worker_shell.h"

namespace anvil::gpu_worker {
namespace {

// gpu_device behind the shell's device interface.
class gpu_backend final : public worker_device {
 public:
  gpu_backend(const model::llm& m, const gpu_worker_config& cfg, memory_plan& mem) : dev_(m, cfg, mem) {}

  void execute(const step_plan& plan, step_result& result) override { dev_.execute(plan, result); }
  bool queues_steps() const override { return true; }
  void begin(const step_plan& plan) override { dev_.begin(plan); }
  void finish_begin(const step_plan& plan) override { dev_.finish_begin(plan); }
  void collect(const step_plan& plan, step_result& result) override { dev_.collect(plan, result); }
  bool oldest_ended() const override { return dev_.oldest_ended(); }
  std::uint64_t allocations() const override { return dev_.allocations(); }
  std::int64_t max_context() const override { return dev_.max_context(); }

  std::string describe(const memory_plan& mem) const override {
    return fmt::format(
        "memory plan on {}: {} KV blocks of {} tokens{} ({:.1f} MB {}){}, weights {:.1f} MB{}{}, scratch {:.1f} MB, "
        "step limits {} tokens / {} seqs, {} device allocations, decode graphs for {} batch sizes",
        mem.device, mem.n_blocks, mem.block_size, window_pool_text(mem), double(mem.kv_bytes) / 1e6,
        kernels::kv_dtype_name(mem.kv_cache_dtype), state_pool_text(mem),
        double(mem.weight_bytes) / 1e6, token_weights(mem),
        mem.gemm_dtype == kernels::gemm_dtype::fp8
            ? fmt::format(" + {:.1f} MB of FP8 copies (--gemm-dtype fp8; q/k/v stacked in {} layers)",
                          double(mem.fp8_weight_bytes) / 1e6, mem.fp8_stacked_layers)
            : std::string(),
        double(mem.scratch_bytes) / 1e6, mem.max_batch_tokens, mem.max_seqs, dev_.allocations(), mem.decode_graphs);
  }

  std::string unusable(std::uint64_t) const override {
    return "its logits hold a NaN or +inf, or none is finite; it fails alone";
  }

 private:
  gpu_device dev_;
};

}  // namespace

struct gpu_worker::impl {
  explicit impl(std::chrono::microseconds idle_spin) : pool("gpu", 1, idle_spin) {}
  memory_plan mem;
  actors::executor_pool pool;
  std::unique_ptr<worker_shell> exec;
};

gpu_worker::gpu_worker(const model::llm& model, const gpu_worker_config& config)
    : impl_(std::make_unique<impl>(config.idle_spin)) {
  try {
    auto dev = std::make_unique<gpu_backend>(model, config, impl_->mem);
    impl_->exec = std::make_unique<worker_shell>(impl_->pool.get_executor(), std::move(dev), impl_->mem);
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

void gpu_worker::do_masks(step_masks masks) { impl_->exec->masks(std::move(masks)); }

}  // namespace anvil::gpu_worker
