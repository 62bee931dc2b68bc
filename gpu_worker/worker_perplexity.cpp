#include "gpu_worker/worker_perplexity.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include <boost/asio/use_future.hpp>
#include <boost/system/system_error.hpp>

namespace anvil::gpu_worker {

double window_nll(worker& w, std::span<const std::int32_t> window, std::int64_t first_scored, std::int64_t batch) {
  const memory_plan& mem = w.plan();
  const auto n = std::int64_t(window.size());
  if (batch < 1 || batch > mem.max_batch_tokens) {
    throw std::invalid_argument("perplexity: chunks of " + std::to_string(batch) + " tokens, the worker takes at most " +
                                std::to_string(mem.max_batch_tokens));
  }
  const std::int64_t blocks = (n + mem.block_size - 1) / mem.block_size;
  if (blocks > mem.n_blocks) {
    throw std::invalid_argument("perplexity: a window of " + std::to_string(n) + " tokens needs " + std::to_string(blocks) +
                                " KV blocks, the worker has " + std::to_string(mem.n_blocks));
  }
  if (mem.n_window_blocks > 0 && blocks > mem.n_window_blocks) {
    throw std::invalid_argument("perplexity: a window of " + std::to_string(n) + " tokens needs " + std::to_string(blocks) +
                                " blocks of the sliding layers' pool, the worker has " + std::to_string(mem.n_window_blocks));
  }
  if (first_scored < 1) throw std::invalid_argument("perplexity: the first token of a window cannot be scored");
  std::vector<std::int32_t> table(static_cast<std::size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);

  double nll = 0;
  std::uint64_t step = 0;
  for (std::int64_t start = 0; start < n; start += batch) {
    const std::int64_t len = std::min(batch, n - start);
    step_plan plan;
    plan.step = ++step;
    seq_step s;
    s.seq_id = 1;
    s.tokens.assign(window.begin() + start, window.begin() + start + len);
    s.start_pos = start;
    s.block_table.assign(table.begin(), table.begin() + (start + len + mem.block_size - 1) / mem.block_size);
    if (mem.n_window_blocks > 0) s.window_table = s.block_table;  // the whole window kept in both pools
    if (mem.n_state_slots > 0) s.state_slot = 0;  // recurrent layers: a window's state, afresh at its start
    // Fed token j (position start + j) predicts the token at start + j + 1.
    s.score_targets.assign(std::size_t(len), -1);
    for (std::int64_t j = 0; j < len; ++j) {
      const std::int64_t next = start + j + 1;
      if (next >= first_scored && next < n) s.score_targets[std::size_t(j)] = window[std::size_t(next)];
    }
    plan.seqs.push_back(std::move(s));
    step_result r;
    try {
      r = w.async_execute(std::move(plan), boost::asio::use_future).get();
    } catch (const boost::system::system_error& e) {
      throw std::runtime_error(std::string("perplexity: a step failed: ") + e.what());
    }
    if (r.scores.size() != 1) throw std::runtime_error("perplexity: the worker returned no scores");
    for (const float lp : r.scores[0].logprobs) nll -= double(lp);
  }
  return nll;
}

model::perplexity_result perplexity(worker& w, std::span<const std::int32_t> tokens, const model::perplexity_options& opt,
                                    std::int64_t n_ctx_train, const model::ppl_progress_fn& progress) {
  const model::perplexity_options o = model::resolve_perplexity_options(opt, n_ctx_train);
  const std::vector<model::ppl_window> windows = model::perplexity_windows(std::int64_t(tokens.size()), o.ctx, o.stride);
  return model::score_windows(
      tokens, windows,
      [&](std::span<const std::int32_t> win, std::int64_t first_scored) { return window_nll(w, win, first_scored, o.batch); },
      progress);
}

}  // namespace anvil::gpu_worker
