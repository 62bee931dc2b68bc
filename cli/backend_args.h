// The options `generate` and `serve` share for where steps run, how the KV cache stores its
// elements and how the engine waits: one struct, one registration, one copy into engine_config.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/engine.h"
#include "kernels/gemm_dtype.h"
#include "kernels/kv_quant.h"

namespace anvil::cli {

struct backend_args {
  std::string backend = "auto";       // cpu, gpu or auto
  double gpu_memory_fraction = 0.9;   // GPU: of the device memory free after weights and scratch, for the KV pool
  bool gpu_float_activations = false; // GPU: f32 activations in the quantized GEMVs
  bool no_gpu_graphs = false;         // GPU: no decode graphs
  bool no_gpu_overlap = false;        // GPU: no programmatic dependent launch
  bool no_overlap_steps = false;      // engine_config::overlap_steps off
  std::int64_t idle_spin_us = -1;     // engine_config::idle_spin_us
  std::string kv_cache_dtype = "f16"; // engine_config::kv_cache_dtype: f16, int8 or fp8
  std::string gemm_dtype = "f16";     // engine_config::gemm_dtype: f16 or fp8
  bool f16_weight_copies = false;     // engine_config::f16_weight_copies
  bool no_window_pool = false;        // engine_config::window_pool off
  int tensor_parallel = 1;            // engine_config::tensor_parallel
  CLI::Option* tensor_parallel_opt = nullptr;  // given explicitly: engine_config::tensor_parallel_path
  std::vector<int> devices;           // engine_config::devices
};

inline CLI::Option* add_tensor_parallel_option(CLI::App* cmd, int& n) {
  return cmd
      ->add_option("--tensor-parallel", n,
                   "ranks to split the model over (attention heads, feed-forward width and vocabulary): one GPU each "
                   "(NCCL), or on the CPU backend one thread each; 1 given on the GPU runs one rank through the split's "
                   "path (to compare)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
}

inline void add_kv_cache_dtype_option(CLI::App* cmd, std::string& dtype) {
  cmd->add_option("--kv-cache-dtype", dtype,
                  "the KV cache's elements: f16 (exact), or int8 / fp8 (E4M3) with one scale per token and KV head, "
                  "half the memory and traffic")
      ->capture_default_str()->check(CLI::IsMember({"f16", "int8", "fp8"}));
}

// The parsed --kv-cache-dtype (the option's check admits only the names parse_kv_dtype knows).
inline kernels::kv_dtype kv_cache_dtype_of(const std::string& name) {
  const std::optional<kernels::kv_dtype> t = kernels::parse_kv_dtype(name);
  if (!t) throw std::invalid_argument("--kv-cache-dtype must be f16, int8 or fp8, not '" + name + "'");
  return *t;
}

inline void add_gemm_dtype_option(CLI::App* cmd, std::string& dtype) {
  cmd->add_option("--gemm-dtype", dtype,
                  "GPU: the math of steps of 32+ tokens: f16 (exact up to f16 rounding), or fp8 (E4M3 copies of the "
                  "weights made at start-up, about twice the speed, lossy; NVIDIA compute capability 8.9+)")
      ->capture_default_str()->check(CLI::IsMember({"f16", "fp8"}));
}

inline void add_f16_weight_copies_option(CLI::App* cmd, bool& on) {
  cmd->add_flag("--f16-weight-copies", on,
                "GPU: keep an f16 copy of every quantized weight, made at start-up, for the GEMMs of long steps (prompts, "
                "many streams) instead of dequantizing the weights on each such step: the same results, faster, for two "
                "bytes per weight of device memory (the KV cache gets less); not with --gemm-dtype fp8");
}

// The parsed --gemm-dtype (the option's check admits only the names parse_gemm_dtype knows).
inline kernels::gemm_dtype gemm_dtype_of(const std::string& name) {
  const std::optional<kernels::gemm_dtype> t = kernels::parse_gemm_dtype(name);
  if (!t) throw std::invalid_argument("--gemm-dtype must be f16 or fp8, not '" + name + "'");
  return *t;
}

inline void add_backend_options(CLI::App* cmd, backend_args& a) {
  cmd->add_option("--backend", a.backend, "where steps run: cpu, gpu, or auto (the GPU when there is one)")
      ->capture_default_str()->check(CLI::IsMember({"cpu", "gpu", "auto"}));
  cmd->add_option("--gpu-memory-fraction", a.gpu_memory_fraction,
                  "GPU: fraction of the device memory free after weights and scratch for the KV cache")
      ->capture_default_str()->check(CLI::Range(0.01, 1.0));
  cmd->add_flag("--gpu-float-activations", a.gpu_float_activations,
                "GPU: f32 activations in the quantized GEMVs (as the CPU computes) instead of 8-bit");
  cmd->add_flag("--no-gpu-graphs", a.no_gpu_graphs, "GPU: launch decode steps kernel by kernel instead of replaying graphs");
  cmd->add_flag("--no-gpu-overlap", a.no_gpu_overlap,
                "GPU: start each kernel only when the one before has ended (no programmatic dependent launch)");
  cmd->add_flag("--no-overlap-steps", a.no_overlap_steps,
                "plan each step only after the one before has been sampled, instead of while it runs (the worker "
                "then waits for the hops between the engine's actors)");
  cmd->add_option("--idle-spin-us", a.idle_spin_us,
                  "microseconds an idle engine thread polls for the next message before it sleeps "
                  "(-1: 0, or 5000 on the GPU with --no-overlap-steps)")
      ->capture_default_str()->check(CLI::Range(std::int64_t(-1), std::int64_t(1000000)));
  add_kv_cache_dtype_option(cmd, a.kv_cache_dtype);
  add_gemm_dtype_option(cmd, a.gemm_dtype);
  add_f16_weight_copies_option(cmd, a.f16_weight_copies);
  a.tensor_parallel_opt = add_tensor_parallel_option(cmd, a.tensor_parallel);
  cmd->add_option("--devices", a.devices,
                  "GPU: the devices to run on, by ordinal, one per --tensor-parallel rank (anvil info lists them; default "
                  "0, 1, ...)")
      ->delimiter(',')->check(CLI::NonNegativeNumber);
  cmd->add_flag("--no-window-pool", a.no_window_pool,
                "models with sliding-window layers beside global ones (Gemma 3, gpt-oss): every layer keeps the whole "
                "context, and prefix caching stays on, instead of the sliding layers keeping only their window");
}

inline void apply_backend_args(const backend_args& a, engine_config& cfg) {
  cfg.backend = parse_worker_backend(a.backend).value_or(worker_backend::automatic);
  cfg.gpu_memory_fraction = a.gpu_memory_fraction;
  cfg.gpu_float_activations = a.gpu_float_activations;
  cfg.gpu_graphs = !a.no_gpu_graphs;
  cfg.gpu_overlap_kernels = !a.no_gpu_overlap;
  cfg.idle_spin_us = a.idle_spin_us;
  cfg.overlap_steps = !a.no_overlap_steps;
  cfg.kv_cache_dtype = kv_cache_dtype_of(a.kv_cache_dtype);
  cfg.gemm_dtype = gemm_dtype_of(a.gemm_dtype);
  cfg.f16_weight_copies = a.f16_weight_copies;
  cfg.window_pool = !a.no_window_pool;
  cfg.tensor_parallel = a.tensor_parallel;
  cfg.tensor_parallel_path = a.tensor_parallel_opt != nullptr && a.tensor_parallel_opt->count() > 0;
  cfg.devices = a.devices;
}

}  // namespace anvil::cli
