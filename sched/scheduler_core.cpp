#include "sched/scheduler_core.h"

#include <algorithm>
#include <cassert>
#include <map>
#include <unordered_map>
#include <utility>

namespace anvil::sched {

scheduler_core::scheduler_core(sched_config cfg) : cfg_(std::move(cfg)) {}

error_code scheduler_core::submit(request r) {
  // Id 0 is never a request: in_flight_ marks a sequence ended mid-step with it.
  if (r.id == 0 || r.prompt.empty() || r.max_tokens < 1 || seqs_.count(r.id)) return make_error_code(errc::invalid_argument);
  if (std::int64_t(r.prompt.size()) >= cfg_.max_model_len) return make_error_code(errc::context_overflow);
  if (std::int64_t(waiting_.size()) >= cfg_.max_queue) return make_error_code(errc::overloaded);
  seq_state s;
  s.tokens = r.prompt;
  if (has_penalties(r)) {
    for (std::int32_t t : s.tokens) ++s.counts[t];
  }
  s.n_prompt = std::int64_t(r.prompt.size());
  if (r.constraint) s.constraint_state = r.constraint->start();
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
  // A sequence ended mid-step produces nothing from the steps in flight.
  for (flying_step& step : in_flight_) {
    for (scheduled& sc : step.seqs) {
      if (sc.id == id) sc.id = 0;
    }
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

bool scheduler_core::has_penalties(const request& r) {
  const gpu_worker::logit_params& l = r.logits;
  return l.repetition_penalty != 1.f || l.presence_penalty != 0.f || l.frequency_penalty != 0.f;
}

// A constrained request planned ahead gets its mask later (take_masks).
bool scheduler_core::device_drawable(const request& r) { return r.logits.draw.on && !has_penalties(r); }

bool scheduler_core::can_plan_ahead() const {
  if (in_flight_.size() != 1 || ahead_blocked_) return false;
  for (const scheduled& sc : in_flight_.front().seqs) {
    if (sc.id != 0 && sc.samples && !device_drawable(seqs_.at(sc.id).req)) return false;
  }
  return true;
}

kv::kv_batch scheduler_core::plan_kv(bool ahead) {
  assert((!ahead || can_plan_ahead()) && (ahead || in_flight_.empty()) && "plan serially with nothing in flight");
  kv::kv_batch batch;
  batch.step = next_step_;
  // One allocation each: this runs every step for every sequence.
  const std::size_t ops = pending_commits_.size() + pending_release_.size() + running_.size() +
                          2 * std::min<std::size_t>(waiting_.size(), std::size_t(cfg_.max_num_seqs));
  batch.ops.reserve(ops);
  batch.victims.reserve(running_.size());
  planned_.clear();
  planning_ahead_ = ahead;
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

  // Ahead: what the step in flight feeds and samples, per sequence.
  std::unordered_map<std::uint64_t, in_flight_part> flying;
  if (ahead) {
    std::int32_t out = 0;
    for (const scheduled& sc : in_flight_.front().seqs) {
      if (sc.id != 0) flying[sc.id] = {sc.n_new, sc.samples ? out : -1};
      out += sc.samples ? 1 : 0;
    }
  }
  std::int64_t budget = cfg_.max_num_batched_tokens, slots = cfg_.max_num_seqs;
  for (const auto& k : running_) {
    if (budget == 0 || slots == 0) break;
    const seq_state& s = seqs_.at(std::get<2>(k));
    std::int64_t computed = s.n_computed, known = std::int64_t(s.tokens.size());
    std::int32_t feed_from = -1;
    if (const auto f = flying.find(s.req.id); f != flying.end()) {
      computed += f->second.n_new;
      if (f->second.out_index >= 0) {
        // It gets a token from the step in flight: leave it out if that token ends it by length
        // (it keeps its slot until then, so no more than max_num_seqs are ever running).
        if (s.n_generated + 1 >= s.req.max_tokens || known + 1 >= cfg_.max_model_len) {
          --slots;
          continue;
        }
        feed_from = f->second.out_index;
        ++known;
      }
    }
    std::int64_t n_new = std::min({known - computed, cfg_.max_prefill_chunk, budget});
    assert(n_new > 0 && "a running sequence always has a token to feed");
    const bool snapshot = snapshot_stop(computed, known, n_new);
    batch.ops.push_back({kv::kv_op::kind::reserve, s.req.id, {}, computed + n_new, !ahead, 0, snapshot});
    planned_.push_back({planned_op::kind::reserve_running, s.req.id, computed + n_new, computed, feed_from});
    budget -= n_new;
    --slots;
  }
  if (!ahead) {
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) batch.victims.push_back(std::get<2>(*it));
  }

  for (const auto& k : waiting_) {
    if (budget == 0 || slots == 0) break;
    seq_state& s = seqs_.at(std::get<2>(k));
    std::int64_t n = std::min({std::int64_t(s.tokens.size()), cfg_.max_prefill_chunk, budget});
    // Before begin's answer the cached part is unknown: when it reaches the stop, this step feeds
    // nothing for the sequence and the next one the rest.
    const bool snapshot = snapshot_stop(0, std::int64_t(s.tokens.size()), n);
    batch.ops.push_back({kv::kv_op::kind::begin, s.req.id, s.tokens, 0, false, 0});
    planned_.push_back({planned_op::kind::begin, s.req.id, 0});
    batch.ops.push_back({kv::kv_op::kind::reserve, s.req.id, {}, n, false, 0, snapshot});
    planned_.push_back({planned_op::kind::reserve_admit, s.req.id, n});
    s.kv_live = true;
    budget -= n;
    --slots;
  }
  return batch;
}

// With state snapshots, a prefill that would run past the last block boundary before the last
// known token stops there (n_new shrinks), and its reserve asks for the snapshot; so does a
// prefill chunk that ends on a block boundary before it, so that prompts sharing only a head
// (a system prompt, then each its own question) find a snapshot within a chunk of where they part.
bool scheduler_core::snapshot_stop(std::int64_t computed, std::int64_t known, std::int64_t& n_new) const {
  if (!cfg_.state_snapshots || !cfg_.prefix_caching) return false;
  const std::int64_t stop = (known - 1) / cfg_.block_size * cfg_.block_size;
  if (stop <= computed) return false;  // decoding, or in the prompt's last block
  if (computed + n_new >= stop) {
    n_new = stop - computed;
    return true;
  }
  return (computed + n_new) % cfg_.block_size == 0;
}

// min_tokens: while fewer tokens than that are out before this step's one, the tokens that would
// end the request get a bias no logit survives (the draw, candidates and logprobs all see it).
void scheduler_core::suppress_ends(const seq_state& s, bool one_in_flight, gpu_worker::logit_params& l) const {
  if (s.n_generated + (one_in_flight ? 1 : 0) >= s.req.min_tokens) return;
  constexpr float never = -1e9f;
  if (!s.req.ignore_eos) {
    for (const std::int32_t t : cfg_.eog_tokens) l.logit_bias.emplace_back(t, never);
  }
  for (const std::int32_t t : s.req.stop_token_ids) l.logit_bias.emplace_back(t, never);
}

gpu_worker::seq_step scheduler_core::make_step(const seq_state& s, std::int64_t start, std::int64_t n_new,
                                               std::vector<std::int32_t> table, std::int32_t feed_from) const {
  gpu_worker::seq_step st;
  st.seq_id = s.req.id;
  st.start_pos = start;
  st.block_table = std::move(table);
  if (feed_from >= 0) {  // the token the worker drew in the step in flight
    st.tokens = {-1};
    st.feed_from = feed_from;
    st.want_candidates = true;
    st.logits = s.req.logits;  // no penalties (device_drawable): no counts to miss
    suppress_ends(s, true, st.logits);
    st.mask_deferred = s.req.constraint != nullptr;  // its state waits for that token: take_masks()
    return st;
  }
  st.tokens.assign(s.tokens.begin() + start, s.tokens.begin() + start + n_new);
  st.want_candidates = start + n_new == std::int64_t(s.tokens.size());
  if (st.want_candidates) {
    st.logits = s.req.logits;
    if (has_penalties(s.req)) st.logits.token_counts.assign(s.counts.begin(), s.counts.end());
    suppress_ends(s, false, st.logits);
    if (s.req.constraint) st.logits.allowed = s.req.constraint->mask(s.constraint_state);
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
  const bool ahead = std::exchange(planning_ahead_, false);
  gpu_worker::step_plan plan;
  plan.seqs.reserve(planned_.size());
  std::vector<scheduled> step;
  const auto add = [&](const seq_state& s, const planned_op& p, kv::kv_op_result& r, std::int64_t start) {
    plan.seqs.push_back(make_step(s, start, p.n_tokens - start, std::move(r.block_table), p.feed_from));
    plan.seqs.back().window_table = std::move(r.window_table);  // empty without a window pool
    plan.seqs.back().state_slot = r.state_slot;                  // -1 without state slots
    step.push_back({p.id, p.n_tokens - start, plan.seqs.back().want_candidates, plan.seqs.back().mask_deferred});  // it samples if it asks
    plan.copies.insert(plan.copies.end(), r.copies.begin(), r.copies.end());
    if (r.state_from >= 0) plan.state_copies.push_back({.src = r.state_from, .dst = r.state_slot});
    if (r.snapshot_slot >= 0) plan.state_snapshots.push_back({.src = r.state_slot, .dst = r.snapshot_slot});
  };
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
        if (!r.ok && ahead) {               // it waits for a serial plan, which may preempt
          ahead_blocked_ = true;
          break;
        }
        if (!r.ok) {                        // no room even after the victims: it yields itself
          to_waiting(s, true);
          ++stats_.preemptions;
          break;
        }
        add(s, p, r, p.start);
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
        {
          seq_event& admitted = events_.emplace_back();  // admitted (no token, no finish): queue time ends
          admitted.id = p.id;
          admitted.cached_tokens = s.n_computed;
        }
        if (p.n_tokens > s.n_computed) add(s, p, r, s.n_computed);
        break;
      case planned_op::kind::commit:
      case planned_op::kind::release: break;
    }
  }
  // Blocks that ended sequences still hold (their release waits for the next batch): a request
  // that ended while this batch was out (a cancel; ahead of a step, the step in flight completing).
  const bool ended_hold_blocks =
      std::any_of(pending_release_.begin(), pending_release_.end(), [&](std::uint64_t id) { return !seqs_.count(id); });
  if (admission_blocked && running_.empty() && !ahead && !ended_hold_blocks) {
    // The cache is as empty as it gets (everything else is free or evictable) and the first
    // waiting request still does not fit: it never will. Only a serial plan can tell: ahead of a
    // step, the sequences in flight may have ended since the batch went out, their blocks held.
    finish(std::get<2>(*waiting_.begin()), finish_reason::failed, -1, events_, make_error_code(errc::context_overflow));
  }
  stats_.waiting = std::int64_t(waiting_.size());
  stats_.running = std::int64_t(running_.size());
  if (plan.seqs.empty()) {
    if (ahead) ahead_blocked_ = true;  // nothing to run ahead: wait for the step in flight
    return std::nullopt;
  }
  plan.step = next_step_++;
  stats_.steps_ahead += ahead;
  const bool owed = std::any_of(step.begin(), step.end(), [](const scheduled& sc) { return sc.mask_deferred; });
  in_flight_.push_back({.step = plan.step, .seqs = std::move(step), .masks_owed = owed});
  return plan;
}

std::optional<finish_reason> scheduler_core::finished(const seq_state& s) const {
  const std::int32_t last = s.tokens.back();
  if (!s.req.ignore_eos && std::find(cfg_.eog_tokens.begin(), cfg_.eog_tokens.end(), last) != cfg_.eog_tokens.end()) {
    return finish_reason::stop;
  }
  if (std::find(s.req.stop_token_ids.begin(), s.req.stop_token_ids.end(), last) != s.req.stop_token_ids.end()) {
    return finish_reason::stop;
  }
  // A constrained output that nothing can extend is complete: no end token needs sampling.
  if (s.req.constraint && s.req.constraint->complete(s.constraint_state)) return finish_reason::stop;
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
  assert(!in_flight_.empty() && "complete_step needs a step in flight");
  const std::vector<scheduled> step = std::move(in_flight_.front().seqs);
  in_flight_.pop_front();
  ahead_blocked_ = false;
  std::vector<seq_event> out;
  out.reserve(step.size());
  std::size_t k = 0;
  ++stats_.steps;
  for (const scheduled& sc : step) {
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
    if (has_penalties(s.req)) ++s.counts[token];
    ++s.n_generated;
    ++stats_.generated_tokens;
    if (s.req.constraint) s.constraint_state = s.req.constraint->advance(s.constraint_state, token);
    if (s.req.constraint && s.constraint_state == sampler::structured::dfa::dead) {
      // The mask allows only what the automaton takes: a token outside it is a broken worker.
      finish(sc.id, finish_reason::failed, token, out, make_error_code(errc::device_fault));
    } else if (const auto why = finished(s)) {
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
  return out;
}

std::optional<gpu_worker::step_masks> scheduler_core::take_masks() {
  if (in_flight_.empty() || !in_flight_.front().masks_owed) return std::nullopt;
  flying_step& f = in_flight_.front();
  f.masks_owed = false;
  gpu_worker::step_masks m{.step = f.step, .allowed = {}};
  for (const scheduled& sc : f.seqs) {
    if (!sc.mask_deferred) continue;
    std::vector<std::uint32_t>& allowed = m.allowed.emplace_back();
    if (sc.id == 0) continue;  // ended since it was planned: its output is discarded
    const seq_state& s = seqs_.at(sc.id);
    allowed = s.req.constraint->mask(s.constraint_state);
  }
  return m;
}

std::vector<seq_event> scheduler_core::fail_step(error_code why) {
  std::vector<seq_event> out;
  ++stats_.steps;
  if (in_flight_.empty()) return out;
  const std::vector<scheduled> step = std::move(in_flight_.front().seqs);
  in_flight_.pop_front();
  ahead_blocked_ = false;
  for (const scheduled& sc : step) {
    if (sc.id != 0 && seqs_.count(sc.id)) finish(sc.id, finish_reason::failed, -1, out, why);
  }
  return out;
}

std::vector<seq_event> scheduler_core::fail_all(error_code why) {
  std::vector<seq_event> out;
  std::vector<std::uint64_t> ids;
  ids.reserve(seqs_.size());
  for (const auto& k : running_) ids.push_back(std::get<2>(k));
  for (const auto& k : waiting_) ids.push_back(std::get<2>(k));
  for (std::uint64_t id : ids) finish(id, finish_reason::failed, -1, out, why);
  return out;
}

}  // namespace anvil::sched
