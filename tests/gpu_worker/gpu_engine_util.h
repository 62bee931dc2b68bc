// What the GPU suites (gpu_worker_test, shipped_model_gpu_test) share: the no-GPU failure, a
// small engine configuration for either backend, and greedy generation of many prompts at once.
#pragma once

#include <cstdint>
#include <future>
#include <string>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "gpu_worker/gpu_worker.h"
#include "tests/engine/requests.h"

// The gpu-labelled suites run on a machine with a GPU; without one they fail, never pass silently.
#define REQUIRE_GPU() \
  if (!anvil::gpu_worker::gpu_worker::available()) GTEST_FAIL() << "no GPU: the gpu-labelled suites need one"

namespace anvil::testing {

inline engine_config engine_cfg(worker_backend backend, const std::string& path) {
  engine_config c;
  c.model_path = path;
  c.backend = backend;
  c.kv_budget_bytes = 16u << 20;
  c.gpu_kv_budget_bytes = 16u << 20;
  c.max_batch_tokens = 256;
  c.max_seqs = 16;
  c.max_prefill_chunk = 64;
  c.max_model_len = 512;
  return c;
}

// Greedy continuations of all prompts, submitted at once (they run as one batch).
inline std::vector<std::vector<std::int32_t>> generate_all(engine& eng, const std::vector<std::vector<std::int32_t>>& prompts,
                                                           std::int64_t n) {
  std::vector<std::future<completion>> fs;
  for (const auto& p : prompts) fs.push_back(eng.async_generate(greedy_request(p, n), boost::asio::use_future));
  std::vector<std::vector<std::int32_t>> out;
  for (auto& f : fs) out.push_back(f.get().tokens);
  return out;
}

}  // namespace anvil::testing
