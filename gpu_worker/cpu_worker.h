// cpu_worker: the worker interface on the CPU reference forward pass. It plans its memory at
// start-up exactly as the GPU worker will — the KV pool from a byte budget, scratch for the step
// limits, a logits buffer for max_seqs rows — and allocates it all, from its arena, before the
// first step. device_allocations() counts the arena's allocations (counting_resource.h): it stays
// flat afterwards (a scoring step wanting more logit rows than max_seqs grows the logits buffer,
// and the count says so). Steps run on a thread of its own.
#pragma once

#include <cstdint>
#include <memory>
#include <memory_resource>

#include "gpu_worker/worker.h"
#include "kernels/kv_quant.h"
#include "model/arch/llm.h"

namespace anvil::gpu_worker {

struct cpu_worker_config {
  std::int64_t block_size = 16;             // tokens per KV block
  std::size_t kv_budget_bytes = 64u << 20;  // memory for the KV pool
  std::int64_t max_batch_tokens = 512;      // tokens one step may feed
  std::int64_t max_seqs = 64;               // sequences one step may hold
  kernels::kv_dtype kv_cache_dtype = kernels::kv_dtype::f16;  // the KV cache's elements (kernels/kv_quant.h)
  // Where the arena's memory comes from (not owned; null: the heap). Tests pass a counting one.
  std::pmr::memory_resource* arena_upstream = nullptr;
  // The sliding-window layers' KV in a pool of their own where the model has them beside global
  // layers (kv_plan.h): the memory plan says so with n_window_blocks > 0.
  bool window_pool = false;
  // Ranks the model is split over (model/arch/tensor_parallel.h), each with its shard, its slice of
  // the KV budget and a thread of its own; 1: the whole model on the worker's thread.
  int tensor_parallel = 1;
};

class cpu_worker final : public worker {
 public:
  // `model` must outlive the worker. Throws std::invalid_argument when the budget holds no block.
  cpu_worker(const model::llm& model, const cpu_worker_config& config);
  ~cpu_worker() override;  // drains the step in flight

  const memory_plan& plan() const override;
  std::uint64_t device_allocations() const override;

 private:
  void do_execute(step_plan plan, boost::asio::any_completion_handler<execute_signature> handler) override;
  void do_masks(step_masks masks) override;

  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace anvil::gpu_worker
