// What the GPU suites (gpu_worker_test, shipped_model_gpu_test) share: the no-GPU failure, a
// small engine configuration for either backend, and greedy generation of many prompts at once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <future>
#include <string>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "gpu_worker/gpu_worker.h"
#include "tests/engine/requests.h"
#include "tests/model/reference_greedy.h"

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

// `got` against `want`, greedy continuations of `prompts` of n tokens each, where rounding differs
// between the two runs: equal, except that rounding may flip a near tie. After a flip the texts
// are different conditions and are no longer compared; a flip must be a near tie in the
// reference's logits (under 0.05 — on tensor cores prefill attention multiplies q and the softmax
// weights in f16 as well: a prompt's first token was seen to flip at a gap of 0.044). `what` names
// the two runs in the messages ("cpu / gpu"). Returns how many prompts are identical.
inline int expect_equal_up_to_near_ties(const model::llm& m, const std::vector<std::vector<std::int32_t>>& prompts,
                                        const std::vector<std::vector<std::int32_t>>& want,
                                        const std::vector<std::vector<std::int32_t>>& got, std::int64_t n,
                                        kernels::kv_dtype kv, const char* what) {
  int identical = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    if (want[i].size() != std::size_t(n) || got[i].size() != std::size_t(n)) {
      ADD_FAILURE() << "prompt " << i << ": " << want[i].size() << " and " << got[i].size() << " tokens, not " << n;
      continue;
    }
    const auto diff = std::mismatch(want[i].begin(), want[i].end(), got[i].begin());
    if (diff.first == want[i].end()) {
      ++identical;
      continue;
    }
    const std::size_t at = std::size_t(diff.first - want[i].begin());
    std::vector<std::int32_t> ctx = prompts[i];
    ctx.insert(ctx.end(), want[i].begin(), diff.first);
    const std::vector<float> l = model::testing::reference_logits(m, ctx, kv);
    const float gap = l[std::size_t(*diff.first)] - l[std::size_t(*diff.second)];
    std::printf("prompt %zu: diverges at token %zu (%s %d / %d, reference gap %.4f)\n", i, at, what, *diff.first,
                *diff.second, gap);
    EXPECT_LT(gap, 5e-2f) << "prompt " << i << " diverges at token " << at << " without a near tie";
  }
  return identical;
}

}  // namespace anvil::testing
