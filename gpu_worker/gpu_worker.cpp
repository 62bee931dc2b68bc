// The GPU worker: start-up on the caller's thread (gpu_device's constructor), then steps one at a
// time on a thread of its own through the shell both workers share (worker_shell.h), answered
// through the worker interface. The device side is gpu_device (gpu_device.h); with
// tensor_parallel N, N of them, one per GPU (tp_gpu_backend).
#include "gpu_worker/gpu_worker.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/logger.h>
#include <spdlog/fmt/ranges.h>

#include "actors/executor_pool.h"
#include "actors/log.h"
#include "gpu_worker/abortable_barrier.h"
#include "gpu_worker/communicator.h"
#include "gpu_worker/device_query.h"
#include "gpu_worker/gpu_device.h"
#include "gpu_worker/rank_threads.h"
#include "gpu_worker/worker_shell.h"

namespace anvil::gpu_worker {
namespace {

// The memory plan's start-up line.
std::string describe_plan(const memory_plan& mem, std::uint64_t allocations, int ranks) {
  return fmt::format(
      "memory plan on {}: {} KV blocks of {} tokens{} ({:.1f} MB {}){}, weights {:.1f} MB{}{}{}, scratch {:.1f} MB, "
      "step limits {} tokens / {} seqs, {} device allocations, decode graphs for {} batch sizes{}",
      mem.device, mem.n_blocks, mem.block_size, window_pool_text(mem), double(mem.kv_bytes) / 1e6,
      kernels::kv_dtype_name(mem.kv_cache_dtype), state_pool_text(mem), double(mem.weight_bytes) / 1e6, token_weights(mem),
      mem.gemm_dtype == kernels::gemm_dtype::fp8
          ? fmt::format(" + {:.1f} MB of FP8 copies (--gemm-dtype fp8; q/k/v stacked in {} layers)",
                        double(mem.fp8_weight_bytes) / 1e6, mem.fp8_stacked_layers)
          : std::string(),
      mem.f16_weight_bytes > 0
          ? fmt::format(" + {:.1f} MB of f16 copies (--f16-weight-copies)", double(mem.f16_weight_bytes) / 1e6)
          : std::string(),
      double(mem.scratch_bytes) / 1e6, mem.max_batch_tokens, mem.max_seqs, allocations, mem.decode_graphs,
      ranks > 1 ? fmt::format(", split over {} GPUs (tensor parallel; figures are their sums)", ranks) : "");
}

constexpr const char* unusable_text = "its logits hold a NaN or +inf, or none is finite; it fails alone";

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
  std::string describe(const memory_plan& mem) const override { return describe_plan(mem, dev_.allocations(), 1); }
  std::string unusable(std::uint64_t) const override { return unusable_text; }

 private:
  gpu_device dev_;
};

// The ranks' start-up meeting points: every rank's KV budget in, the least of them out to each (so
// the ranks plan the same blocks), and later the wait for every rank to have allocated. A rank
// that fails to start calls abort(), and the others' calls throw instead of waiting for it.
class rank_meeting {
 public:
  explicit rank_meeting(int n) : barrier_(n) {}
  std::size_t agree(std::size_t budget) {
    {
      const std::lock_guard lock(mu_);
      least_ = std::min(least_, budget);
    }
    arrive();
    const std::lock_guard lock(mu_);
    return least_;
  }
  void arrive() {
    if (!barrier_.arrive_and_wait()) throw std::runtime_error("gpu worker: another rank failed to start");
  }
  void abort() { barrier_.abort(); }

 private:
  abortable_barrier barrier_;
  std::mutex mu_;
  std::size_t least_ = SIZE_MAX;
};

// The model split over N GPUs (model/arch/tensor_parallel.h): a gpu_device per rank on its own
// device with the rank's shard, joined by the device group's collectives (communicator.h), started
// together (their warm-up steps run collectives) and stepped together, each rank from a thread of
// its own (rank 0 the shell's). Every rank merges the ranks' gathered candidates of their vocabulary
// slices into the same records (kernels/candidates_merge.h); the step's answer is rank 0's.
class tp_gpu_backend final : public worker_device {
 public:
  tp_gpu_backend(const model::llm& m, const gpu_worker_config& cfg, memory_plan& mem) {
    const int n = std::max(cfg.tensor_parallel, 1);
    std::vector<int> devices = cfg.devices;
    if (devices.empty()) {
      for (int r = 0; r < n; ++r) devices.push_back(n == 1 ? cfg.device : r);
    }
    if (int(devices.size()) != n) {
      throw std::runtime_error("gpu worker: --tensor-parallel " + std::to_string(n) + " takes " + std::to_string(n) +
                               " devices; --devices names " + std::to_string(devices.size()));
    }
    for (std::size_t i = 0; i < devices.size(); ++i) {
      if (std::count(devices.begin(), devices.end(), devices[i]) > 1) {
        throw std::runtime_error("gpu worker: device " + std::to_string(devices[i]) + " is named twice in --devices");
      }
    }
    if (std::string why = model::tp_refusal(m, n); !why.empty()) {
      throw std::runtime_error("gpu worker: --tensor-parallel " + std::to_string(n) + ": " + why);
    }
    for (int r = 0; r < n; ++r) shards_.emplace_back(m, r, n);
    comms_ = make_device_group(devices);
    log::get("gpu")->info("tensor parallel over {} GPUs ({}): {}", n, fmt::join(devices, ","), comms_[0]->describe());
    rank_meeting meeting(n);
    std::vector<memory_plan> plans(static_cast<std::size_t>(n));
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
    std::atomic<int> first_failed{-1};  // the others' failures follow from its
    devs_.resize(static_cast<std::size_t>(n));
    {
      std::vector<std::thread> start;
      for (int r = 0; r < n; ++r) {
        start.emplace_back([&, r] {
          const auto i = std::size_t(r);
          try {
            gpu_worker_config c = cfg;
            c.device = devices[i];
            c.comm = comms_[i].get();
            c.vocab = shards_[i].vocab();
            c.agree_kv_budget = [&meeting](std::size_t b) { return meeting.agree(b); };
            c.ranks_allocated = [&meeting] { meeting.arrive(); };
            if (r != 0) c.progress = {};
            devs_[i] = std::make_unique<gpu_device>(shards_[i].model(), c, plans[i]);
          } catch (...) {
            // The others may wait at a meeting, or on their devices in the warm-up's collectives
            // for this rank's part: both end with an error instead of hanging.
            errors[i] = std::current_exception();
            if (int none = -1; first_failed.compare_exchange_strong(none, r)) {
              meeting.abort();
              break_group();
            }
          }
        });
      }
      for (std::thread& t : start) t.join();
    }
    if (first_failed >= 0) std::rethrow_exception(errors[std::size_t(first_failed.load())]);
    mem = plans[0];
    for (std::size_t r = 1; r < plans.size(); ++r) {
      mem.weight_bytes += plans[r].weight_bytes;
      mem.fp8_weight_bytes += plans[r].fp8_weight_bytes;
      mem.f16_weight_bytes += plans[r].f16_weight_bytes;
      mem.kv_bytes += plans[r].kv_bytes;
      mem.state_bytes += plans[r].state_bytes;
      mem.scratch_bytes += plans[r].scratch_bytes;
    }
    mem.token_weight_bytes = m.token_weight_bytes();  // what a token reads over all the ranks
    mem.device = fmt::format("{} x {} (devices {})", plans[0].device, n, fmt::join(devices, ","));
    threads_ = std::make_unique<rank_threads>(n);
  }

  void execute(const step_plan& plan, step_result& result) override {
    begin(plan);
    collect(plan, result);
  }
  bool queues_steps() const override { return true; }
  void begin(const step_plan& plan) override {
    on_ranks([&](gpu_device& d, std::size_t) { d.begin(plan); });
  }
  void finish_begin(const step_plan& plan) override {
    on_ranks([&](gpu_device& d, std::size_t) { d.finish_begin(plan); });
  }
  void collect(const step_plan& plan, step_result& result) override {
    std::vector<step_result> others(devs_.size());
    on_ranks([&](gpu_device& d, std::size_t r) { d.collect(plan, r == 0 ? result : others[r]); });
  }
  bool oldest_ended() const override {
    return std::all_of(devs_.begin(), devs_.end(), [](const auto& d) { return d->oldest_ended(); });
  }
  std::uint64_t allocations() const override {
    std::uint64_t n = 0;
    for (const auto& d : devs_) n += d->allocations();
    return n;
  }
  std::int64_t max_context() const override { return devs_[0]->max_context(); }
  std::string describe(const memory_plan& mem) const override { return describe_plan(mem, allocations(), int(devs_.size())); }
  std::string unusable(std::uint64_t) const override { return unusable_text; }

 private:
  // f(rank's device, rank) on every rank at once, each on its own thread; then the first rank's
  // failure, if any, is the step's. A rank that fails aborts every rank's collectives at once, so
  // that the others, whose steps wait on the device for its part, end with an error instead of
  // hanging; the group is broken from then on and every later call fails at once (the engine
  // fails the requests in flight, as after any device fault).
  void on_ranks(const std::function<void(gpu_device&, std::size_t)>& f) {
    if (broken_) throw device_failure("a rank of the tensor-parallel group failed before; the group is down");
    std::vector<std::exception_ptr> errors(devs_.size());
    threads_->run([&](int r) {
      const auto i = std::size_t(r);
      try {
        f(*devs_[i], i);
      } catch (...) {
        errors[i] = std::current_exception();
        break_group();
      }
    });
    for (const std::exception_ptr& e : errors) {
      if (e) std::rethrow_exception(e);
    }
  }

  // Every rank's collectives under way and to come end with an error (once): what any rank's
  // failure, at start-up or in a step, does to the group.
  void break_group() {
    if (!broken_.exchange(true)) {
      for (const auto& c : comms_) c->abort();
    }
  }

  std::vector<model::llm_shard> shards_;
  std::vector<std::unique_ptr<communicator>> comms_;
  std::vector<std::unique_ptr<gpu_device>> devs_;
  std::unique_ptr<rank_threads> threads_;
  std::atomic<bool> broken_{false};
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
    std::unique_ptr<worker_device> dev;
    if (config.tensor_parallel > 1 || config.through_communicator) {
      dev = std::make_unique<tp_gpu_backend>(model, config, impl_->mem);
    } else {
      dev = std::make_unique<gpu_backend>(model, config, impl_->mem);
    }
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
