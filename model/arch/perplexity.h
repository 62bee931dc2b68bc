// Perplexity of a token sequence by sliding windows, the way Hugging Face documents it for
// fixed-length models (and tools/train/make_goldens.py computes it, so the two agree):
//
//   windows start at 0, stride, 2*stride, ...; window [b, e) with e = min(b + ctx, n);
//   each window runs from position 0 on its own (no KV cache carried over);
//   it scores the tokens i in [max(prev_e, b + 1), e), prev_e being the previous window's end
//   (0 before the first), by -log softmax(logits[i - 1])[tokens[i]], log-softmax in double;
//   the last window is the first that reaches e = n.
//
// With stride < ctx every token but the first is scored exactly once, with at least ctx - stride
// tokens of context (all it has within the first window); with stride = ctx windows do not
// overlap and the first token of each is not scored. The window plan is a pure function; the
// scoring takes any function that returns a window's logits, and perplexity() binds it to the
// CPU forward pass.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kernels/kv_quant.h"
#include "model/arch/llm.h"

namespace anvil::model {

struct ppl_window {
  std::int64_t begin = 0;  // first token fed
  std::int64_t end = 0;    // one past the last token fed
  std::int64_t first_scored = 0;  // tokens [first_scored, end) are scored (may be empty)
};

// The windows for n tokens. Throws std::invalid_argument unless n >= 2 and 0 < stride <= ctx.
std::vector<ppl_window> perplexity_windows(std::int64_t n_tokens, std::int64_t ctx, std::int64_t stride);

struct perplexity_result {
  double nll_sum = 0;          // sum of -log p over the scored tokens
  std::int64_t n_scored = 0;   // tokens scored
  std::int64_t n_windows = 0;
  std::vector<double> window_nll;  // nll of each window's scored tokens, in order
  double mean_nll() const { return n_scored ? nll_sum / double(n_scored) : 0.0; }
  double perplexity() const { return std::exp(mean_nll()); }
};

// -log softmax(logits)[target], in double.
double token_nll(std::span<const float> logits, std::int32_t target);

// Logits [tokens.size(), n_vocab] for a window fed from position 0.
using window_logits_fn = std::function<void(std::span<const std::int32_t> tokens, std::vector<float>& logits)>;
// Called after each window: (windows done, windows in all).
using ppl_progress_fn = std::function<void(std::int64_t, std::int64_t)>;

perplexity_result score_windows(std::span<const std::int32_t> tokens, std::span<const ppl_window> windows,
                                std::int64_t n_vocab, const window_logits_fn& logits_of,
                                const ppl_progress_fn& progress = {});

// The same with a function that scores a window itself: the sum of -log p(window[i] | window[..i])
// over i in [first_scored, window.size()), first_scored >= 1 relative to the window's start (a
// worker computes these log-probabilities on the device; gpu_worker/worker_perplexity.h).
using window_nll_fn = std::function<double(std::span<const std::int32_t> window, std::int64_t first_scored)>;
perplexity_result score_windows(std::span<const std::int32_t> tokens, std::span<const ppl_window> windows,
                                const window_nll_fn& nll_of, const ppl_progress_fn& progress = {});

struct perplexity_options {
  std::int64_t ctx = 0;     // window length; 0: the model's context length
  std::int64_t stride = 0;  // 0: ctx / 2
  std::int64_t batch = 0;   // tokens per forward step (a window runs in chunks); 0: the whole window
  kernels::kv_dtype kv_cache_dtype = kernels::kv_dtype::f16;  // the KV cache's elements (kernels/kv_quant.h)
};

// The options with their defaults filled in for a model trained on n_ctx_train positions: ctx,
// stride and batch all positive. Throws std::invalid_argument for ctx beyond n_ctx_train, or a
// negative stride or batch.
perplexity_options resolve_perplexity_options(const perplexity_options& opt, std::int64_t n_ctx_train);

// The model's perplexity over `tokens` with the CPU forward pass. Throws std::invalid_argument
// for fewer than two tokens, ctx larger than the model's context length, or a bad stride/batch.
perplexity_result perplexity(const llm& m, std::span<const std::int32_t> tokens, const perplexity_options& opt,
                             const ppl_progress_fn& progress = {});

}  // namespace anvil::model
