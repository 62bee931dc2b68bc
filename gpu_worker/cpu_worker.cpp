#include "gpu_worker/cpu_worker.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <spdlog/fmt/fmt.h>

#include "actors/executor_pool.h"
#include "gpu_worker/counting_resource.h"
#include "gpu_worker/host_group.h"
#include "gpu_worker/kv_plan.h"
#include "gpu_worker/rank_threads.h"
#include "gpu_worker/worker_shell.h"
#include "kernels/candidates.h"
#include "kernels/token_logprob.h"
#include "model/arch/cpu_forward.h"
#include "model/arch/tensor_parallel.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace anvil::gpu_worker {
namespace {

// The calling thread's OpenMP team as one of n ranks: the cores shared among the ranks.
void set_rank_threads(int n) {
#ifdef _OPENMP
  // Never more than the thread's team already is (OMP_NUM_THREADS=1 under TSan stays 1).
  if (n > 1) omp_set_num_threads(std::max(1, std::min(omp_get_max_threads(), omp_get_num_procs() / n)));
#else
  (void)n;
#endif
}

// The device of the CPU worker: the reference forward pass, its KV arena and logits buffer. With
// tensor_parallel N > 1, N ranks (model/arch/tensor_parallel.h), each with its shard of the
// model, its slice of every KV block and its own forward pass, run every step together, joined by
// a host_group; the step's logits are rank 0's (the gathered whole).
class cpu_device final : public worker_device {
 public:
  cpu_device(const model::llm& m, const cpu_worker_config& cfg, memory_plan& mem)
      : mem_(mem), arena_(cfg.arena_upstream ? cfg.arena_upstream : std::pmr::new_delete_resource()) {
    const int n = std::max(cfg.tensor_parallel, 1);
    if (std::string why = model::tp_refusal(m, n); !why.empty()) {
      throw std::invalid_argument("--tensor-parallel " + std::to_string(n) + ": " + why);
    }
    for (int r = 0; r < n; ++r) {
      ranks_.push_back(std::make_unique<rank>(&arena_));
      if (n > 1) ranks_.back()->shard.emplace(m, r, n);
    }
    // The pools hold as many blocks (and state slots) as the whole model's KV in the budget; each
    // rank keeps its KV heads' part of every block (ranks that share a KV head each keep a copy).
    const bool window_pool = cfg.window_pool && window_pool_fits(m.hp);
    using storage = model::kv_cache_storage;
    const std::size_t per_slot = storage::bytes_per_state_slot(m.hp);
    mem.n_state_slots = plan_state_slots(cfg.kv_budget_bytes, per_slot, cfg.max_seqs);
    if (m.hp.has_recurrent() && mem.n_state_slots < 1) {
      throw std::invalid_argument("cpu worker: the KV budget holds no recurrent-state slot of " +
                                  std::to_string(per_slot) + " bytes");
    }
    const kv_pools pools = plan_kv_pools(
        cfg.kv_budget_bytes - std::size_t(mem.n_state_slots) * per_slot,
        storage::bytes_per_block(m.hp, cfg.block_size, cfg.kv_cache_dtype, window_pool, false),
        window_pool ? storage::bytes_per_block(m.hp, cfg.block_size, cfg.kv_cache_dtype, true, true) : 0,
        window_pool ? m.hp.sliding_window : 0, cfg.block_size, cfg.max_seqs, cfg.max_batch_tokens);
    mem.device = n > 1 ? "cpu x" + std::to_string(n) : "cpu";
    mem.block_size = cfg.block_size;
    mem.n_blocks = pools.n_blocks;
    mem.n_window_blocks = pools.n_window_blocks;
    mem.window = pools.window;
    mem.max_batch_tokens = cfg.max_batch_tokens;
    mem.max_seqs = m.hp.has_recurrent() ? std::min(cfg.max_seqs, mem.n_state_slots) : cfg.max_seqs;
    mem.n_vocab = m.hp.n_vocab;
    mem.weight_bytes = m.weight_bytes();
    mem.token_weight_bytes = m.token_weight_bytes();
    if (mem.n_blocks < 1 || (window_pool && mem.n_window_blocks < 1) || cfg.max_batch_tokens < 1 || cfg.max_seqs < 1) {
      throw std::invalid_argument("cpu worker: the KV budget holds no block, or the step limits are zero");
    }
    // Every arena allocation happens here, before the first step.
    if (n > 1) group_ = std::make_unique<host_group>(n);
    for (int r = 0; r < n; ++r) {
      rank& rk = *ranks_[std::size_t(r)];
      const model::tp_link tp = n > 1 ? model::tp_link{.comm = &group_->rank(r), .vocab = rk.shard->vocab(), .max_logit_rows = cfg.max_seqs}
                                      : model::tp_link{};
      const model::hparams& hp = rk.model(m).hp;
      rk.cache = std::make_unique<storage>(hp, mem.n_blocks, mem.block_size, cfg.kv_cache_dtype, &arena_,
                                           mem.n_window_blocks, mem.n_state_slots);
      rk.fwd = std::make_unique<model::cpu_forward>(rk.model(m), cfg.max_batch_tokens, &arena_, tp);
      rk.logits.reserve(std::size_t(cfg.max_seqs * m.hp.n_vocab));
      const std::size_t state = std::size_t(mem.n_state_slots) * storage::bytes_per_state_slot(hp);
      mem.state_bytes += state;
      mem.kv_bytes += rk.cache->bytes() - state;
      mem.scratch_bytes += rk.logits.capacity() * sizeof(float);
    }
    mem.kv_cache_dtype = cfg.kv_cache_dtype;
    if (n > 1) threads_ = std::make_unique<rank_threads>(n);
  }

  std::uint64_t allocations() const override { return arena_.allocations(); }
  // The reference pass has no context limit of its own: the KV pool bounds it.
  std::int64_t max_context() const override { return std::numeric_limits<std::int64_t>::max(); }

  std::string describe(const memory_plan& mem) const override {
    return fmt::format("memory plan: {} KV blocks of {} tokens{} ({:.1f} MB, {}){}, weights {:.1f} MB{}, step limits {} tokens / {} seqs{}",
                       mem.n_blocks, mem.block_size, window_pool_text(mem), double(mem.kv_bytes) / 1e6,
                       kernels::kv_dtype_name(mem.kv_cache_dtype), state_pool_text(mem), double(mem.weight_bytes) / 1e6, token_weights(mem),
                       mem.max_batch_tokens, mem.max_seqs,
                       ranks_.size() > 1 ? fmt::format(", split over {} ranks (tensor parallel)", ranks_.size()) : "");
  }

  std::string unusable(std::uint64_t seq_id) const override {
    for (const auto& [id, why] : unusable_) {
      if (id == seq_id) return why + "; the request fails alone";
    }
    return "no candidates; the request fails alone";
  }

  void execute(const step_plan& plan, step_result& result) override {
    unusable_.clear();
    batch_.clear();
    for (const seq_step& s : plan.seqs) {
      batch_.push_back({.tokens = s.tokens,
                        .start_pos = s.start_pos,
                        .block_table = s.block_table,
                        .all_logits = !s.score_targets.empty(),
                        .window_table = s.window_table,
                        .state_slot = s.state_slot});
    }
    if (ranks_.size() == 1) {
      ranks_[0]->run(plan, batch_);
    } else {
      run_ranks(plan);
    }
    const std::pmr::vector<float>& logits = ranks_[0]->logits;  // every rank's gathered: rank 0's
    const auto V = std::size_t(mem_.n_vocab);
    std::size_t row = 0;  // the first logits row of sequence i: all its fed tokens when scored, else its last
    for (std::size_t i = 0; i < plan.seqs.size(); ++i) {
      const seq_step& s = plan.seqs[i];
      const std::size_t rows = s.score_targets.empty() ? 1 : s.tokens.size();
      if (!s.score_targets.empty()) {
        seq_scores sc{s.seq_id, std::vector<float>(s.tokens.size(), 0.f)};
        for (std::size_t j = 0; j < rows; ++j) {
          if (s.score_targets[j] < 0) continue;
          sc.logprobs[j] = kernels::token_logprob_ref(std::span<const float>(logits.data() + (row + j) * V, V),
                                                      s.score_targets[j]);
        }
        result.scores.push_back(std::move(sc));
      }
      if (s.want_candidates) {
        const std::span<const float> last(logits.data() + (row + rows - 1) * V, V);
        if (std::string why = kernels::unusable_logits(last); !why.empty()) {
          unusable_.emplace_back(s.seq_id, std::move(why));  // the shell logs it
          seq_output none;  // no candidates (step.h)
          none.seq_id = s.seq_id;
          result.outputs.push_back(std::move(none));
        } else {
          seq_output out = kernels::candidates_ref(last, s.logits, s.start_pos + std::int64_t(s.tokens.size()));
          out.seq_id = s.seq_id;
          result.outputs.push_back(std::move(out));
        }
      }
      row += rows;
    }
  }

 private:
  // One rank: its shard (none when the model is whole), KV cache, forward pass and logits.
  struct rank {
    std::optional<model::llm_shard> shard;
    std::unique_ptr<model::kv_cache_storage> cache;
    std::unique_ptr<model::cpu_forward> fwd;
    std::pmr::vector<float> logits;
    explicit rank(std::pmr::memory_resource* arena) : logits(arena) {}
    const model::llm& model(const model::llm& whole) const { return shard ? shard->model() : whole; }
    // The step on this rank: copies first, the forward pass, then the snapshots it ended.
    void run(const step_plan& plan, const std::vector<model::forward_seq>& batch) {
      for (const block_copy& c : plan.copies) cache->copy_block(c.src, c.dst, c.window);
      for (const state_copy& c : plan.state_copies) cache->copy_state(c.src, c.dst);
      fwd->run(batch, *cache, logits);  // a scoring step may grow logits (counted as a scratch growth)
      for (const state_copy& c : plan.state_snapshots) cache->copy_state(c.src, c.dst);
    }
  };

  // Every rank's part of the step at once. A rank that fails abandons the group's collectives, so
  // the others fail too instead of waiting; the step throws the first rank's own error.
  void run_ranks(const step_plan& plan) {
    group_->reset();
    std::vector<std::exception_ptr> errors(ranks_.size());
    const std::function<void(int)> job = [&](int r) {
      set_rank_threads(int(ranks_.size()));  // each rank's thread: its share of the cores
      try {
        ranks_[std::size_t(r)]->run(plan, batch_);
      } catch (...) {
        errors[std::size_t(r)] = std::current_exception();
        group_->abort();
      }
    };
    threads_->run(job);
    std::exception_ptr first;
    for (const std::exception_ptr& e : errors) {
      if (!e) continue;
      try {
        std::rethrow_exception(e);
      } catch (const collective_aborted&) {
        if (!first) first = e;
        continue;
      } catch (...) {
        throw;  // a rank's own failure
      }
    }
    if (first) std::rethrow_exception(first);
  }

  const memory_plan& mem_;
  counting_resource arena_;  // declared first: destroyed after every buffer allocated from it
  std::vector<std::unique_ptr<rank>> ranks_;
  std::unique_ptr<host_group> group_;      // tensor parallel: the ranks' collectives
  std::unique_ptr<rank_threads> threads_;  // tensor parallel: ranks 1..N-1
  std::vector<model::forward_seq> batch_;
  std::vector<std::pair<std::uint64_t, std::string>> unusable_;  // the last step's sequences without candidates
};

}  // namespace

struct cpu_worker::impl {
  memory_plan mem;
  actors::executor_pool pool{"gpu", 1};
  std::unique_ptr<worker_shell> exec;
};

cpu_worker::cpu_worker(const model::llm& model, const cpu_worker_config& config) : impl_(std::make_unique<impl>()) {
  auto dev = std::make_unique<cpu_device>(model, config, impl_->mem);
  impl_->exec = std::make_unique<worker_shell>(impl_->pool.get_executor(), std::move(dev), impl_->mem);
}

cpu_worker::~cpu_worker() {
  impl_->exec->async_stop(boost::asio::use_future).get();
  impl_->exec.reset();
  impl_->pool.join();
}

const memory_plan& cpu_worker::plan() const { return impl_->mem; }
std::uint64_t cpu_worker::device_allocations() const { return impl_->exec->allocations(); }

void cpu_worker::do_execute(step_plan plan, boost::asio::any_completion_handler<execute_signature> handler) {
  impl_->exec->execute(std::move(plan), std::move(handler));
}

void cpu_worker::do_masks(step_masks masks) { impl_->exec->masks(std::move(masks)); }

}  // namespace anvil::gpu_worker
