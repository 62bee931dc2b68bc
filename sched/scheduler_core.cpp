#include "sched/scheduler_core.h"

#include <algorithm>
#include <cassert>
#include <map>

namespace anvil::sched {

scheduler_core::scheduler_core(sched_config cfg) : cfg_(std::move(cfg)) {}

error_code scheduler_core::submit(request r) {
  // Id 0 is never a request: in_step_ marks a sequence ended mid-step with it.
  if (r.id == 0 || r.prompt.empty() || r.max_tokens < 1 || seqs_.count(r.id)) return make_error_code(errc::invalid_argument);
  if (std::int64_t(r.prompt.size()) >= cfg_.max_model_len) return make_error_code(errc::context_overflow);
  if (std::int64_t(waiting_.size()) >= cfg_.max_queue) return make_error_code(errc::overloaded);
  seq_state s;
  s.tokens = r.prompt;
  s.n_prompt = std::int64_t(r.prompt.size());
  s.arrival = next_arrival_++;
  s.req = std::move(r);
  waiting_.insert(key(s));
  seqs_.emplace(s.req.id, std::move(s));
  stats_.waiting = std::int64_t(waiting_.size());
  return {};
}

void scheduler_core::cancel(std::uint64_t id) {
  if (!seqs_.count(id)) return;
  finish(id, finish_reason::cancelled, -1, events_);
}

void scheduler_core::fail(std::uint64_t id, error_code why) {
  if (!seqs_.count(id)) return;
  finish(id, finish_reason::failed, -1, events_, why);
}

std::vector<seq_event> scheduler_core::take_events() { return std::exchange(events_, {}); }

void scheduler_core::finish(std::uint64_t id, finish_reason why, std::int32_t token, std::vector<seq_event>& out,
                            error_code error) {
  auto it = seqs_.find(id);
  seq_state& s = it->second;
  (s.at == where::waiting ? waiting_ : running_).erase(key(s));
  if (s.kv_live) pending_release_.push_back(id);
  // A sequence cancelled mid-step produces nothing from that step.
  for (scheduled& sc : in_step_) {
    if (sc.id == id) sc.id = 0;
  }
  seq_event& e = out.emplace_back();
  e.id = id;
  e.token = token;
  e.finish = why;
  e.error = error;
  seqs_.erase(it);
  stats_.waiting = std::int64_t(waiting_.size());
  stats_.running = std::int64_t(running_.size());
}

void scheduler_core::to_waiting(seq_state& s, bool release_kv) {
  if (s.at == where::running) running_.erase(key(s));
  s.at = where::waiting;
  s.n_computed = 0;  // recompute: prompt and generated tokens are fed again
  if (release_kv && s.kv_live) pending_release_.push_back(s.req.id);
  s.kv_live = false;
  waiting_.insert(key(s));
}

kv::kv_batch scheduler_core::plan_kv() {
  kv::kv_batch batch;
  batch.step = std::uint64_t(stats_.steps);
  // One allocation each: this runs every step for every sequence.
  const std::size_t ops = pending_commits_.size() + pending_release_.size() + running_.size() +
                          2 * std::min<std::size_t>(waiting_.size(), std::size_t(cfg_.max_num_seqs));
  batch.ops.reserve(ops);
  batch.victims.reserve(running_.size());
  planned_.clear();
  // Commits first, so a sequence finishing this step still leaves its full blocks cached.
  for (kv::kv_op& op : pending_commits_) {
    planned_.push_back({planned_op::kind::commit, op.seq_id, 0});
    batch.ops.push_back(std::move(op));
  }
  pending_commits_.clear();
  for (std::uint64_t id : pending_release_) {
    batch.ops.push_back({kv::kv_op::kind::release, id, {}, 0, false, 0});
    planned_.push_back({planned_op::kind::release, id, 0});
  }
  pending_release_.clear();

  std::int64_t budget = cfg_.max_num_batched_tokens, slots = cfg_.max_num_seqs;
  for (const auto& k : running_) {
    if (budget == 0 || slots == 0) break;
    const seq_state& s = seqs_.at(std::get<2>(k));
    const std::int64_t n_new = std::min({std::int64_t(s.tokens.size()) - s.n_computed, cfg_.max_prefill_chunk, budget});
    assert(n_new > 0 && "a running sequence always has a token to feed");
    batch.ops.push_back({kv::kv_op::kind::reserve, s.req.id, {}, s.n_computed + n_new, true, 0});
    planned_.push_back({planned_op::kind::reserve_running, s.req.id, s.n_computed + n_new});
    budget -= n_new;
    --slots;
  }
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) batch.victims.push_back(std::get<2>(*it));

  for (const auto& k : waiting_) {
    if (budget == 0 || slots == 0) break;
    seq_state& s = seqs_.at(std::get<2>(k));
    const std::int64_t n = std::min({std::int64_t(s.tokens.size()), cfg_.max_prefill_chunk, budget});
    batch.ops.push_back({kv::kv_op::kind::begin, s.req.id, s.tokens, 0, false, 0});
    planned_.push_back({planned_op::kind::begin, s.req.id, 0});
    batch.ops.push_back({kv::kv_op::kind::reserve, s.req.id, {}, n, false, 0});
    planned_.push_back({planned_op::kind::reserve_admit, s.req.id, n});
    s.kv_live = true;
    budget -= n;
    --slots;
  }
  return batch;
}

gpu_worker::seq_step scheduler_core::make_step(const seq_state& s, std::int64_t n_new, std::vector<std::int32_t> table) const {
  gpu_worker::seq_step st;
  st.seq_id = s.req.id;
  st.tokens.assign(s.tokens.begin() + s.n_computed, s.tokens.begin() + s.n_computed + n_new);
  st.start_pos = s.n_computed;
  st.block_table = std::move(table);
  st.want_candidates = s.n_computed + n_new == std::int64_t(s.tokens.size());
  if (st.want_candidates) {
    st.logits = s.req.logits;
    const auto& l = s.req.logits;
    if (l.repetition_penalty != 1.f || l.presence_penalty != 0.f || l.frequency_penalty != 0.f) {
      std::map<std::int32_t, std::int32_t> counts;
      for (std::int32_t t : s.tokens) counts[t]++;
      st.logits.token_counts.assign(counts.begin(), counts.end());
    }
  }
  return st;
}

std::optional<gpu_worker::step_plan> scheduler_core::plan_step(kv::kv_batch_result kv) {
  assert(kv.results.size() == planned_.size() && "the KV batch result must answer every op");
  for (std::uint64_t id : kv.preempted) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;
    it->second.kv_live = false;  // the KV manager released it
    to_waiting(it->second, false);
    ++stats_.preemptions;
  }
  gpu_worker::step_plan plan;
  plan.step = std::uint64_t(stats_.steps);
  plan.seqs.reserve(planned_.size());
  in_step_.clear();
  bool admission_blocked = false;  // FCFS: once one admission fails, later ones wait too
  for (std::size_t i = 0; i < planned_.size(); ++i) {
    const planned_op& p = planned_[i];
    kv::kv_op_result& r = kv.results[i];
    auto it = seqs_.find(p.id);
    if (it == seqs_.end() || p.what == planned_op::kind::release || p.what == planned_op::kind::commit) continue;
    seq_state& s = it->second;
    if (r.preempted) continue;
    switch (p.what) {
      case planned_op::kind::reserve_running:
        if (s.at != where::running) break;  // preempted later in the batch
        if (!r.ok) {                        // no room even after the victims: it yields itself
          to_waiting(s, true);
          ++stats_.preemptions;
          break;
        }
        in_step_.push_back({p.id, p.n_tokens - s.n_computed, p.n_tokens == std::int64_t(s.tokens.size())});
        plan.seqs.push_back(make_step(s, p.n_tokens - s.n_computed, std::move(r.block_table)));
        plan.copies.insert(plan.copies.end(), r.copies.begin(), r.copies.end());
        break;
      case planned_op::kind::begin:
        s.n_computed = std::min(r.cached_tokens, std::int64_t(s.tokens.size()) - 1);
        break;
      case planned_op::kind::reserve_admit:
        if (!r.ok || admission_blocked) {
          admission_blocked = true;
          to_waiting(s, true);  // give back what begin took; it stays first in line
          break;
        }
        waiting_.erase(key(s));
        s.at = where::running;
        running_.insert(key(s));
        stats_.prompt_tokens += s.n_prompt;
        stats_.cached_prompt_tokens += s.n_computed;
        events_.emplace_back().id = p.id;  // admitted (no token, no finish): queue time ends
        if (p.n_tokens > s.n_computed) {
          in_step_.push_back({p.id, p.n_tokens - s.n_computed, p.n_tokens == std::int64_t(s.tokens.size())});
          plan.seqs.push_back(make_step(s, p.n_tokens - s.n_computed, std::move(r.block_table)));
          plan.copies.insert(plan.copies.end(), r.copies.begin(), r.copies.end());
        }
        break;
      case planned_op::kind::commit:
      case planned_op::kind::release: break;
    }
  }
  if (admission_blocked && running_.empty()) {
    // The cache is as empty as it gets (everything else is free or evictable) and the first
    // waiting request still does not fit: it never will.
    finish(std::get<2>(*waiting_.begin()), finish_reason::failed, -1, events_, make_error_code(errc::context_overflow));
  }
  stats_.waiting = std::int64_t(waiting_.size());
  stats_.running = std::int64_t(running_.size());
  if (plan.seqs.empty()) return std::nullopt;
  return plan;
}

std::optional<finish_reason> scheduler_core::finished(const seq_state& s) const {
  const std::int32_t last = s.tokens.back();
  if (!s.req.ignore_eos && std::find(cfg_.eog_tokens.begin(), cfg_.eog_tokens.end(), last) != cfg_.eog_tokens.end()) {
    return finish_reason::stop;
  }
  if (s.n_generated >= s.req.max_tokens || std::int64_t(s.tokens.size()) >= cfg_.max_model_len) return finish_reason::length;
  return std::nullopt;
}

std::int32_t scheduler_core::n_logprobs(std::uint64_t id) const {
  const auto it = seqs_.find(id);
  return it == seqs_.end() ? 0 : it->second.req.n_logprobs;
}

std::vector<seq_event> scheduler_core::complete_step(std::span<const std::int32_t> tokens) {
  std::vector<sampled_token> sampled(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) sampled[i].token = tokens[i];
  return complete_step(std::span<sampled_token>(sampled));
}

std::vector<seq_event> scheduler_core::complete_step(std::span<sampled_token> sampled) {
  std::vector<seq_event> out;
  out.reserve(in_step_.size());
  std::size_t k = 0;
  ++stats_.steps;
  for (const scheduled& sc : in_step_) {
    sampled_token* answer = sc.samples ? &sampled[k++] : nullptr;
    const std::int32_t token = answer ? answer->token : -1;
    if (sc.id == 0) continue;  // cancelled while the step ran
    seq_state& s = seqs_.at(sc.id);
    const std::int64_t blocks_before = s.n_computed / cfg_.block_size;
    s.n_computed += sc.n_new;
    if (cfg_.prefix_caching && s.n_computed / cfg_.block_size > blocks_before) {
      pending_commits_.push_back({kv::kv_op::kind::commit, sc.id,
                                  {s.tokens.begin(), s.tokens.begin() + s.n_computed}, 0, false, 0});
    }
    if (!sc.samples) continue;
    s.tokens.push_back(token);
    ++s.n_generated;
    ++stats_.generated_tokens;
    if (const auto why = finished(s)) {
      finish(sc.id, *why, token, out);
    } else {
      out.emplace_back();
      out.back().id = sc.id;
      out.back().token = token;
    }
    out.back().logprob = answer->logprob;
    out.back().top_logprobs = std::move(answer->top_logprobs);
  }
  assert(k == sampled.size() && "one sampled token per sequence that asked");
  in_step_.clear();
  return out;
}

std::vector<seq_event> scheduler_core::fail_step(error_code why) {
  std::vector<seq_event> out;
  ++stats_.steps;
  for (const scheduled& sc : in_step_) {
    if (sc.id != 0 && seqs_.count(sc.id)) finish(sc.id, finish_reason::failed, -1, out, why);
  }
  in_step_.clear();
  return out;
}

std::vector<seq_event> scheduler_core::fail_all(error_code why) {
  std::vector<seq_event> out;
  std::vector<std::uint64_t> ids;
  ids.reserve(seqs_.size());
  for (const auto& k : running_) ids.push_back(std::get<2>(k));
  for (const auto& k : waiting_) ids.push_back(std::get<2>(k));
  for (std::uint64_t id : ids) finish(id, finish_reason::failed, -1, out, why);
  in_step_.clear();
  return out;
}

}  // namespace anvil::sched
