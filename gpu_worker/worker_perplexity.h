// Perplexity through a worker (model/arch/perplexity.h has the window plan and the definition): each
// window runs from position 0 as one sequence, in chunks of at most `batch` tokens, in KV blocks
// 0, 1, 2, ... of the worker's pool, and the worker returns the log-probability of every scored
// token (step_plan score_targets) instead of logits. The same code scores on the CPU worker and
// on the GPU worker, so `anvil perplexity --backend gpu` is checked against the CPU.
#pragma once

#include <cstdint>
#include <span>

#include "gpu_worker/worker.h"
#include "model/arch/perplexity.h"

namespace anvil::gpu_worker {

// The sum of -log p(window[i] | window[..i]) for i in [first_scored, window.size()). The worker
// must be idle (nothing else runs on its KV pool) and hold ceil(window.size() / block_size)
// blocks; batch <= its max_batch_tokens. Throws std::invalid_argument when it cannot, and
// std::runtime_error when a step fails.
double window_nll(worker& w, std::span<const std::int32_t> window, std::int64_t first_scored, std::int64_t batch);

// model::perplexity with the windows scored by `w` (opt resolved against n_ctx_train).
model::perplexity_result perplexity(worker& w, std::span<const std::int32_t> tokens, const model::perplexity_options& opt,
                                    std::int64_t n_ctx_train, const model::ppl_progress_fn& progress = {});

}  // namespace anvil::gpu_worker
