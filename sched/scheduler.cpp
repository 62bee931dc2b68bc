#include "sched/scheduler.h"

#include <stdexcept>

#include <spdlog/logger.h>

namespace anvil::sched {

scheduler::scheduler(boost::asio::any_io_executor ex, sched_config cfg, kv::kv_manager& kv, gpu_worker::worker& worker,
                     sampler::sampler_actor& sampler, event_sink sink, sched_options opt)
    : strand_actor(std::move(ex), {"sched", opt.mailbox_capacity}), core_(std::move(cfg)), kv_(kv), worker_(worker),
      sampler_(sampler), sink_(std::move(sink)), opt_(opt) {}

scheduler::~scheduler() = default;

actors::outcome<void> scheduler::submit(request r, const submit_options& opt) {
  const std::uint64_t id = r.id;
  // After a device fault nothing new is taken: the engine is unhealthy and says so.
  if (!healthy_) return make_error_code(errc::device_fault);
  r.n_logprobs = opt.n_logprobs;
  if (const error_code ec = core_.submit(std::move(r))) return ec;
  // FIFO on the sampler's strand: the open is handled before any sample for this id.
  sampler_.async_open(id, opt.sampling, on_strand([this, id](error_code ec) {
    if (ec) {  // invalid parameters (the engine validates them first) or a stopped sampler
      log().error("req={} sampler refused the request: {}", id, ec.message());
      core_.fail(id, ec);
      kick();
    }
  }));
  kick();
  return {};
}

void scheduler::kick() {
  if (planning_) return;
  if (done_.empty()) {
    if (!core_.has_work()) return idle();
    if (!looping_) {
      looping_ = true;
      loop_ = hold();  // async_stop waits for the loop, also one a message accepted before the stop starts
    }
    return plan(false);
  }
  if (opt_.overlap && core_.can_plan_ahead()) plan(true);
}

sched_stats scheduler::stats() const {
  sched_stats s = core_.stats();
  s.timed_gaps = device_time_.timed_gaps;
  s.device_idle_us = device_time_.device_idle_us;
  s.timed_steps = device_time_.timed_steps;
  s.device_busy_us = device_time_.device_busy_us;
  return s;
}

void scheduler::note_timing(const gpu_worker::step_result& r) {
  if (r.device_busy_us >= 0) {
    ++device_time_.timed_steps;
    device_time_.device_busy_us += r.device_busy_us;
  }
  if (unbroken_ && r.device_idle_us >= 0) {
    ++device_time_.timed_gaps;
    device_time_.device_idle_us += r.device_idle_us;
  }
  unbroken_ = true;
}

void scheduler::idle() {
  unbroken_ = false;
  if (!looping_) return;
  looping_ = false;
  loop_.release();
}

void scheduler::plan(bool ahead) {
  planning_ = true;
  kv_.async_apply(core_.plan_kv(ahead), on_strand([this](error_code ec, kv::kv_batch_result r) { on_kv(ec, std::move(r)); }));
}

void scheduler::on_kv(error_code ec, kv::kv_batch_result r) {
  planning_ = false;
  if (ec) {
    log().error("KV manager failed: {}", ec.message());
    fail_everything(ec, false);
    // No new plan: the KV manager would refuse it too. Steps in flight still complete (drain).
    if (done_.empty()) idle();
    return;
  }
  std::optional<gpu_worker::step_plan> plan = core_.plan_step(std::move(r));
  // Admissions and cancellations, before the step runs. With no plan there is nothing to feed this
  // step (e.g. everything was cancelled or preempted): with nothing in flight the loop goes again
  // while there is work (the core fails a request that can never fit, so this cannot spin
  // forever); ahead of a step, the core waits for that step.
  emit(core_.take_events());
  if (!plan) return kick();
  log().debug("step={} seqs={} copies={} in_flight={}", plan->step, plan->seqs.size(), plan->copies.size(), done_.size());
  const std::uint64_t step = plan->step;
  done_.push_back(step_done{.step = step, .error = {}, .sampled_ok = false, .sampled = {}});
  worker_.async_execute(std::move(*plan), on_strand([this, step](error_code ec2, gpu_worker::step_result res) {
    on_executed(step, ec2, std::move(res));
  }));
  send_masks();  // the step before completed while this one was planned ahead of it
  kick();        // the next step, ahead of this one
}

scheduler::step_done& scheduler::done(std::uint64_t step) {
  for (step_done& d : done_) {
    if (d.step == step) return d;
  }
  throw std::logic_error("scheduler: an answer for a step not in flight");
}

void scheduler::on_executed(std::uint64_t step, error_code ec, gpu_worker::step_result r) {
  if (ec) {
    log().error("step={} failed on the worker: {}", step, ec.message());
    done(step).error = ec;
    return drain();
  }
  note_timing(r);
  // Requests that ended since the step was planned (an end-of-generation token in the step
  // before, a cancel) are not sampled: their outputs are wasted, and their sampler state may
  // already be closed.
  std::vector<sampler::sample_request> batch;
  std::vector<std::uint64_t> ids;
  std::vector<std::size_t> index;
  batch.reserve(r.outputs.size());
  for (std::size_t i = 0; i < r.outputs.size(); ++i) {
    gpu_worker::seq_output& out = r.outputs[i];
    if (!core_.live(out.seq_id)) continue;
    ids.push_back(out.seq_id);
    index.push_back(i);
    const std::int32_t n_logprobs = core_.n_logprobs(out.seq_id);
    batch.push_back({out.seq_id, std::move(out), n_logprobs});
  }
  sampler_.async_sample(std::move(batch), on_strand([this, step, ids = std::move(ids), index = std::move(index),
                                                     n = r.outputs.size()](error_code ec2, std::vector<sampler::sample_outcome> o) mutable {
    on_sampled(step, ec2, std::move(o), std::move(ids), std::move(index), n);
  }));
}

void scheduler::on_sampled(std::uint64_t step, error_code ec, std::vector<sampler::sample_outcome> outcomes,
                           std::vector<std::uint64_t> ids, std::vector<std::size_t> index, std::size_t n_outputs) {
  step_done& d = done(step);
  if (ec || outcomes.size() != ids.size()) {
    log().error("step={} sampler failed: {}", step, ec ? ec.message() : "wrong number of answers");
    d.error = ec ? ec : make_error_code(errc::dropped);
    return drain();
  }
  d.sampled.resize(n_outputs);
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    if (outcomes[i]) {
      d.sampled[index[i]] = {outcomes[i]->token, outcomes[i]->logprob, std::move(outcomes[i]->top_logprobs)};
    } else if (core_.live(ids[i])) {  // the sequence's candidates were unusable: it fails alone
      log().error("req={} sampling failed: {}", ids[i], outcomes[i].error().message());
      core_.fail(ids[i], outcomes[i].error());
    }
  }
  d.sampled_ok = true;
  drain();
}

void scheduler::drain() {
  while (!done_.empty() && (done_.front().error || done_.front().sampled_ok)) {
    step_done d = std::move(done_.front());
    done_.pop_front();
    if (d.error) {
      unbroken_ = false;
      fail_everything(d.error, true);  // one more KV batch then releases the failed requests' blocks
    } else {
      emit(core_.complete_step(std::span<sched::sampled_token>(d.sampled)));
    }
    send_masks();  // the step planned ahead of this one, whose masks wait for its tokens
  }
  kick();
}

void scheduler::send_masks() {
  if (std::optional<gpu_worker::step_masks> m = core_.take_masks()) worker_.send_masks(std::move(*m));
}

void scheduler::fail_everything(error_code ec, bool step_in_flight) {
  healthy_ = false;
  std::vector<seq_event> failed = step_in_flight ? core_.fail_step(ec) : std::vector<seq_event>{};
  std::vector<seq_event> rest = core_.fail_all(ec);
  failed.insert(failed.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
  log().error("unhealthy: {} requests failed, new ones are refused", failed.size());
  emit(std::move(failed));
}

void scheduler::emit(std::vector<seq_event> events) {
  if (events.empty()) return;
  for (const seq_event& e : events) {
    if (e.finish != finish_reason::none) sampler_.async_close(e.id, [](error_code) {});
  }
  sink_(std::move(events));
}

}  // namespace anvil::sched
