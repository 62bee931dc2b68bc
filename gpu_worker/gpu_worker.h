// gpu_worker: the worker interface on the GPU (HIP, or CUDA through kernels/gpu_runtime.h), for
// llama / qwen2 / qwen3. It owns the device and ALL device memory (DESIGN.md, the one rule): at
// start-up it uploads every weight into one allocation, then plans activation scratch, logits,
// candidate records, GEMM/attention workspaces and per-step upload buffers for the step limits,
// and gives the KV pool (f16, or 8 bits: kv_cache_dtype) a fraction of the memory still free. A
// handful of allocations, all before ready; device_allocations() never moves afterwards. Steps
// run on a thread of its own, one at a time; a device error fails that step with
// errc::device_fault and never aborts the process.
//
// This header has no device types: the engine includes it in every build. Without a GPU backend,
// create() throws and available() is false.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu_worker/worker.h"
#include "kernels/gemm_dtype.h"
#include "kernels/kv_quant.h"
#include "model/arch/llm.h"
#include "model/arch/tensor_parallel.h"

namespace anvil::gpu_worker {

class communicator;  // communicator.h (device types)

struct gpu_worker_config {
  std::int64_t block_size = 16;             // tokens per KV block
  double memory_fraction = 0.9;             // of the device memory free after weights and scratch, for the KV pool
  std::size_t kv_budget_bytes = 0;          // a cap on the KV pool; 0: none
  std::int64_t max_batch_tokens = 512;      // tokens one step may feed
  std::int64_t max_seqs = 64;               // sequences one step may hold
  std::int64_t max_context = 4096;          // positions one sequence may reach (sizes block tables and workspaces)
  kernels::kv_dtype kv_cache_dtype = kernels::kv_dtype::f16;  // the KV cache's elements (kernels/kv_quant.h)
  // The math of steps of many tokens (kernels/gemm_dtype.h). fp8: an E4M3 copy of every layer
  // weight and of the output head is made at start-up (counted in the memory plan), and start-up
  // fails on a device without FP8 tensor cores or cuBLASLt.
  kernels::gemm_dtype gemm_dtype = kernels::gemm_dtype::f16;
  // gemm_dtype fp8: each layer's q, k and v in one stacked copy with one scale (one GEMM where
  // there were three). Off only to measure what the stacking itself changes (gpu_worker_test).
  bool fp8_stack_qkv = true;
  // An f16 copy of every quantized (or f32) layer weight and of the output head, made at start-up
  // (counted in the memory plan): the vendor GEMMs of long steps multiply it instead of
  // dequantizing the weight on every step. The same f16 values, so the same tokens; it costs two
  // bytes per weight of device memory (the KV pool gets less). Not with gemm_dtype fp8, and only
  // where the build has the vendor BLAS.
  bool f16_weight_copies = false;
  std::int64_t max_logit_pairs = 1 << 18;   // logit-bias + penalty-count pairs uploaded per candidates launch
  int device = 0;                           // device ordinal
  // GEMVs (steps of up to 8 tokens) of quantized weights multiply f32 activations with the
  // decoded weights, as the CPU path does, instead of rounding the activations to 8 bits: the
  // same tokens as the CPU path where 8-bit rounding would flip a near tie, for some speed.
  bool float_activations = false;
  // Decode steps (every sequence feeds one token) of up to this many sequences replay a graph
  // captured at start-up, one per batch size, instead of launching ~15 kernels per layer; 0: none.
  std::int64_t graph_max_batch = 64;
  // NVIDIA sm_90+: each kernel of a step may start while the one before it finishes, and a
  // quantized GEMV loads its first weights meanwhile (programmatic dependent launch,
  // kernels/gpu_runtime.h). Off:
  // every kernel waits for the one before to end. The setting is process-wide (the last worker
  // constructed sets it).
  bool overlap_kernels = true;
  // How long the worker's thread polls for the next step before it sleeps (actors/executor_pool.h).
  std::chrono::microseconds idle_spin{0};
  // Called while weights upload: (bytes done, bytes in all).
  std::function<void(std::size_t, std::size_t)> progress;
  // The sliding-window layers' KV in a pool of their own where the model has them beside global
  // layers (kv_plan.h): the memory plan says so with n_window_blocks > 0.
  bool window_pool = false;
  // Tensor parallelism (model/arch/tensor_parallel.h): the model split over this many GPUs, one
  // rank each, on `devices` (empty: 0 .. N-1; else N ordinals); `device` is then unused. Each rank
  // plans its own device's memory (the KV pool from the least any rank has free) and runs every
  // step; the candidates come from rank 0. 1: the whole model on `device`.
  int tensor_parallel = 1;
  std::vector<int> devices;
  // Tests: one rank through the tensor-parallel path (communicator and all) with tensor_parallel 1.
  bool through_communicator = false;
  // Set by the worker for each rank's device: its collectives, its vocabulary slice, the
  // agreement on the KV budget (each rank's in, the ranks' least out), and the wait for every
  // rank to have allocated all it needs (before the first collective).
  communicator* comm = nullptr;
  model::vocab_slice vocab{};
  std::function<std::size_t(std::size_t)> agree_kv_budget;
  std::function<void()> ranks_allocated;
};

// Why the GPU kernels cannot run a model of these hyper-parameters (empty: they can). The worker
// refuses such a model at start-up; the engine's automatic backend takes the CPU for it.
inline std::string gpu_unsupported(const model::hparams& hp) {
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {
    const std::int64_t hd = hp.layer_head_dim(l);
    if (hd != 64 && hd != 128 && hd != 256 && hd != 512) {
      return "attention kernels need heads of 64, 128, 256 or 512 dims, layer " + std::to_string(l) + " has " +
             std::to_string(hd);
    }
  }
  return {};
}

class gpu_worker final : public worker {
 public:
  // `model` must outlive the worker. Throws std::runtime_error when there is no device, a weight
  // type the kernels do not decode, or too little memory for the weights, scratch and one block.
  gpu_worker(const model::llm& model, const gpu_worker_config& config);
  ~gpu_worker() override;  // drains the step in flight, then frees everything

  // True when this build has a GPU backend and the runtime sees a device.
  static bool available();

  const memory_plan& plan() const override;
  std::uint64_t device_allocations() const override;

 private:
  void do_execute(step_plan plan, boost::asio::any_completion_handler<execute_signature> handler) override;
  void do_masks(step_masks masks) override;

  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace anvil::gpu_worker
