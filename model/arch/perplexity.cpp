#include "model/arch/perplexity.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "model/arch/cpu_forward.h"

namespace anvil::model {

std::vector<ppl_window> perplexity_windows(std::int64_t n_tokens, std::int64_t ctx, std::int64_t stride) {
  if (n_tokens < 2) throw std::invalid_argument("perplexity needs at least two tokens, got " + std::to_string(n_tokens));
  if (ctx < 2) throw std::invalid_argument("perplexity: the window must hold at least two tokens");
  if (stride <= 0 || stride > ctx) {
    throw std::invalid_argument("perplexity: stride " + std::to_string(stride) + " must be in [1, " + std::to_string(ctx) + "]");
  }
  std::vector<ppl_window> windows;
  std::int64_t prev_end = 0;
  for (std::int64_t begin = 0;; begin += stride) {
    const std::int64_t end = std::min(begin + ctx, n_tokens);
    windows.push_back({begin, end, std::max(prev_end, begin + 1)});
    prev_end = end;
    if (end == n_tokens) break;
  }
  return windows;
}

double token_nll(std::span<const float> logits, std::int32_t target) {
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float l : logits) sum += std::exp(double(l) - max);
  return std::log(sum) + max - double(logits[std::size_t(target)]);
}

perplexity_result score_windows(std::span<const std::int32_t> tokens, std::span<const ppl_window> windows,
                                const window_nll_fn& nll_of, const ppl_progress_fn& progress) {
  perplexity_result r;
  for (const ppl_window& w : windows) {
    double nll = 0;
    if (w.first_scored < w.end) {
      nll = nll_of(tokens.subspan(std::size_t(w.begin), std::size_t(w.end - w.begin)), w.first_scored - w.begin);
      r.n_scored += w.end - w.first_scored;
    }
    r.window_nll.push_back(nll);
    r.nll_sum += nll;
    ++r.n_windows;
    if (progress) progress(r.n_windows, std::int64_t(windows.size()));
  }
  return r;
}

perplexity_result score_windows(std::span<const std::int32_t> tokens, std::span<const ppl_window> windows,
                                std::int64_t n_vocab, const window_logits_fn& logits_of, const ppl_progress_fn& progress) {
  std::vector<float> logits;
  const auto nll_of = [&](std::span<const std::int32_t> win, std::int64_t first_scored) {
    logits_of(win, logits);
    double nll = 0;
    for (std::int64_t i = first_scored; i < std::int64_t(win.size()); ++i) {
      const std::int64_t row = i - 1;  // the logits that predict token i
      nll += token_nll(std::span(logits).subspan(std::size_t(row * n_vocab), std::size_t(n_vocab)), win[std::size_t(i)]);
    }
    return nll;
  };
  return score_windows(tokens, windows, nll_of, progress);
}

perplexity_options resolve_perplexity_options(const perplexity_options& opt, std::int64_t n_ctx_train) {
  perplexity_options r;
  r.ctx = opt.ctx > 0 ? opt.ctx : n_ctx_train;
  if (r.ctx > n_ctx_train) {
    throw std::invalid_argument("perplexity: a window of " + std::to_string(r.ctx) + " tokens is longer than the model's context (" +
                                std::to_string(n_ctx_train) + ")");
  }
  if (opt.stride < 0 || opt.batch < 0) throw std::invalid_argument("perplexity: stride and batch must not be negative");
  r.stride = opt.stride > 0 ? opt.stride : std::max<std::int64_t>(r.ctx / 2, 1);
  r.batch = opt.batch > 0 ? std::min(opt.batch, r.ctx) : r.ctx;
  r.kv_cache_dtype = opt.kv_cache_dtype;
  return r;
}

perplexity_result perplexity(const llm& m, std::span<const std::int32_t> tokens, const perplexity_options& opt,
                             const ppl_progress_fn& progress) {
  const perplexity_options o = resolve_perplexity_options(opt, m.hp.n_ctx_train);
  const std::int64_t ctx = o.ctx, stride = o.stride, batch = o.batch;
  const std::vector<ppl_window> windows = perplexity_windows(std::int64_t(tokens.size()), ctx, stride);

  // One sequence's KV cache for a whole window, in blocks of 16 placed in order.
  constexpr std::int64_t block = 16;
  const std::int64_t n_blocks = (ctx + block - 1) / block;
  // A model with recurrent layers keeps the window's state in one slot: each window starts it afresh.
  const std::int32_t slot = m.hp.has_recurrent() ? 0 : -1;
  kv_cache_storage cache(m.hp, n_blocks, block, o.kv_cache_dtype, std::pmr::get_default_resource(), 0, slot + 1);
  std::vector<std::int32_t> table(static_cast<std::size_t>(n_blocks));
  std::iota(table.begin(), table.end(), 0);
  cpu_forward fwd(m, batch);
  std::vector<float> chunk_logits;
  const auto window_logits = [&](std::span<const std::int32_t> win, std::vector<float>& logits) {
    logits.resize(win.size() * std::size_t(m.hp.n_vocab));
    for (std::size_t start = 0; start < win.size(); start += std::size_t(batch)) {
      const std::size_t n = std::min(win.size() - start, std::size_t(batch));
      const forward_seq step{.tokens = win.subspan(start, n),
                             .start_pos = std::int64_t(start),
                             .block_table = table,
                             .all_logits = true,
                             .state_slot = slot};
      fwd.run(std::span(&step, 1), cache, chunk_logits);
      std::copy(chunk_logits.begin(), chunk_logits.end(), logits.begin() + std::ptrdiff_t(start * std::size_t(m.hp.n_vocab)));
    }
  };
  return score_windows(tokens, windows, m.hp.n_vocab, window_logits, progress);
}

}  // namespace anvil::model
