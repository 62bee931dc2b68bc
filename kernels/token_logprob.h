// Scoring: the log-probability of a given token under a row of raw logits,
//   logprob = logits[target] - log sum_t exp(logits[t]),
// what perplexity and prompt log-probabilities need (messages/step.h score_targets). No logit
// processing: the model's own distribution. The reference accumulates in double around the row's
// maximum; the kernel in float around the maximum, one block per row (agreement ~1e-6 relative
// to the normaliser for real vocabularies).
#pragma once

#include <cstdint>
#include <span>

namespace anvil::kernels {

// logits[target] - logsumexp(logits), in double, rounded to float. target must lie in the row.
float token_logprob_ref(std::span<const float> logits, std::int32_t target);

struct token_logprob_params {
  const float* logits = nullptr;        // [rows, vocab]
  std::int64_t vocab = 0;
  std::int64_t rows = 0;
  const std::int32_t* targets = nullptr;  // [rows], each in [0, vocab)
  float* out = nullptr;                 // [rows]
};

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// One block per row. hipErrorInvalidValue (nothing launched) for negative sizes or rows > 2^31.
// A target outside the row gives NaN for that row.
hipError_t launch_token_logprob(const token_logprob_params& p, hipStream_t stream);
}  // namespace anvil::kernels
#endif
