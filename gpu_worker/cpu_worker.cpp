#include "gpu_worker/cpu_worker.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <spdlog/fmt/fmt.h>

#include "actors/executor_pool.h"
#include "gpu_worker/counting_resource.h"
#include "gpu_worker/kv_plan.h"
#include "gpu_worker/worker_shell.h"
#include "kernels/candidates.h"
#include "kernels/token_logprob.h"
#include "model/arch/cpu_forward.h"

namespace anvil::gpu_worker {
namespace {

// The device of the CPU worker: the reference forward pass, its KV arena and logits buffer.
class cpu_device final : public worker_device {
 public:
  cpu_device(const model::llm& m, const cpu_worker_config& cfg, memory_plan& mem)
      : mem_(mem), arena_(cfg.arena_upstream ? cfg.arena_upstream : std::pmr::new_delete_resource()), logits_(&arena_) {
    const bool window_pool = cfg.window_pool && window_pool_fits(m.hp);
    using storage = model::kv_cache_storage;
    const std::size_t per_slot = storage::bytes_per_state_slot(m.hp);
    mem.n_state_slots = plan_state_slots(cfg.kv_budget_bytes, per_slot, cfg.max_seqs);
    mem.state_bytes = std::size_t(mem.n_state_slots) * per_slot;
    if (m.hp.has_recurrent() && mem.n_state_slots < 1) {
      throw std::invalid_argument("cpu worker: the KV budget holds no recurrent-state slot of " +
                                  std::to_string(per_slot) + " bytes");
    }
    const kv_pools pools = plan_kv_pools(
        cfg.kv_budget_bytes - mem.state_bytes, storage::bytes_per_block(m.hp, cfg.block_size, cfg.kv_cache_dtype, window_pool, false),
        window_pool ? storage::bytes_per_block(m.hp, cfg.block_size, cfg.kv_cache_dtype, true, true) : 0,
        window_pool ? m.hp.sliding_window : 0, cfg.block_size, cfg.max_seqs, cfg.max_batch_tokens);
    mem.device = "cpu";
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
    cache_ = std::make_unique<model::kv_cache_storage>(m.hp, mem.n_blocks, mem.block_size, cfg.kv_cache_dtype, &arena_,
                                                       mem.n_window_blocks, mem.n_state_slots);
    fwd_ = std::make_unique<model::cpu_forward>(m, cfg.max_batch_tokens, &arena_);
    logits_.reserve(std::size_t(cfg.max_seqs * m.hp.n_vocab));
    mem.kv_bytes = cache_->bytes() - mem.state_bytes;
    mem.kv_cache_dtype = cfg.kv_cache_dtype;
    mem.scratch_bytes = logits_.capacity() * sizeof(float);
  }

  std::uint64_t allocations() const override { return arena_.allocations(); }
  // The reference pass has no context limit of its own: the KV pool bounds it.
  std::int64_t max_context() const override { return std::numeric_limits<std::int64_t>::max(); }

  std::string describe(const memory_plan& mem) const override {
    return fmt::format("memory plan: {} KV blocks of {} tokens{} ({:.1f} MB, {}){}, weights {:.1f} MB{}, step limits {} tokens / {} seqs",
                       mem.n_blocks, mem.block_size, window_pool_text(mem), double(mem.kv_bytes) / 1e6,
                       kernels::kv_dtype_name(mem.kv_cache_dtype), state_pool_text(mem), double(mem.weight_bytes) / 1e6, token_weights(mem),
                       mem.max_batch_tokens, mem.max_seqs);
  }

  std::string unusable(std::uint64_t seq_id) const override {
    for (const auto& [id, why] : unusable_) {
      if (id == seq_id) return why + "; the request fails alone";
    }
    return "no candidates; the request fails alone";
  }

  void execute(const step_plan& plan, step_result& result) override {
    unusable_.clear();
    for (const block_copy& c : plan.copies) cache_->copy_block(c.src, c.dst, c.window);
    for (const state_copy& c : plan.state_copies) cache_->copy_state(c.src, c.dst);
    batch_.clear();
    for (const seq_step& s : plan.seqs) {
      batch_.push_back({.tokens = s.tokens,
                        .start_pos = s.start_pos,
                        .block_table = s.block_table,
                        .all_logits = !s.score_targets.empty(),
                        .window_table = s.window_table,
                        .state_slot = s.state_slot});
    }
    fwd_->run(batch_, *cache_, logits_);  // a scoring step may grow logits_ (counted as a scratch growth)
    for (const state_copy& c : plan.state_snapshots) cache_->copy_state(c.src, c.dst);
    const auto V = std::size_t(mem_.n_vocab);
    std::size_t row = 0;  // the first logits row of sequence i: all its fed tokens when scored, else its last
    for (std::size_t i = 0; i < plan.seqs.size(); ++i) {
      const seq_step& s = plan.seqs[i];
      const std::size_t rows = s.score_targets.empty() ? 1 : s.tokens.size();
      if (!s.score_targets.empty()) {
        seq_scores sc{s.seq_id, std::vector<float>(s.tokens.size(), 0.f)};
        for (std::size_t j = 0; j < rows; ++j) {
          if (s.score_targets[j] < 0) continue;
          sc.logprobs[j] = kernels::token_logprob_ref(std::span<const float>(logits_.data() + (row + j) * V, V),
                                                      s.score_targets[j]);
        }
        result.scores.push_back(std::move(sc));
      }
      if (s.want_candidates) {
        const std::span<const float> last(logits_.data() + (row + rows - 1) * V, V);
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
  const memory_plan& mem_;
  counting_resource arena_;  // declared first: destroyed after every buffer allocated from it
  std::unique_ptr<model::kv_cache_storage> cache_;
  std::unique_ptr<model::cpu_forward> fwd_;
  std::pmr::vector<float> logits_;
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
