#include "sched/scheduler.h"

#include <spdlog/logger.h>

namespace anvil::sched {

scheduler::scheduler(boost::asio::any_io_executor ex, sched_config cfg, kv::kv_manager& kv, gpu_worker::worker& worker,
                     sampler::sampler_actor& sampler, event_sink sink, std::size_t mailbox_capacity)
    : strand_actor(std::move(ex), {"sched", mailbox_capacity}), core_(std::move(cfg)), kv_(kv), worker_(worker),
      sampler_(sampler), sink_(std::move(sink)) {}

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
  if (looping_ || !core_.has_work()) return;
  looping_ = true;
  loop_ = hold();  // async_stop waits for the loop, also one a message accepted before the stop starts
  step();
}

void scheduler::idle() {
  looping_ = false;
  loop_.release();
}

void scheduler::step() {
  kv_.async_apply(core_.plan_kv(), on_strand([this](error_code ec, kv::kv_batch_result r) { on_kv(ec, std::move(r)); }));
}

void scheduler::on_kv(error_code ec, kv::kv_batch_result r) {
  if (ec) {
    log().error("KV manager failed: {}", ec.message());
    fail_everything(ec, false);
    return idle();
  }
  std::optional<gpu_worker::step_plan> plan = core_.plan_step(std::move(r));
  if (!plan) {
    // Nothing to feed this step (e.g. everything was cancelled or preempted): go again while
    // there is work; the core fails a request that can never fit, so this cannot spin forever.
    emit(core_.take_events());
    return core_.has_work() ? step() : idle();
  }
  emit(core_.take_events());  // admissions and cancellations, before the step runs
  log().debug("step={} seqs={} copies={}", plan->step, plan->seqs.size(), plan->copies.size());
  worker_.async_execute(std::move(*plan), on_strand([this](error_code ec2, gpu_worker::step_result res) {
    on_executed(ec2, std::move(res));
  }));
}

void scheduler::on_executed(error_code ec, gpu_worker::step_result r) {
  if (ec) {
    log().error("step failed on the worker: {}", ec.message());
    fail_everything(ec, true);
    return core_.has_work() ? step() : idle();  // one more KV batch releases the failed requests' blocks
  }
  std::vector<sampler::sample_request> batch;
  std::vector<std::uint64_t> ids;
  batch.reserve(r.outputs.size());
  for (gpu_worker::seq_output& out : r.outputs) {
    ids.push_back(out.seq_id);
    const std::int32_t n_logprobs = core_.n_logprobs(out.seq_id);
    batch.push_back({out.seq_id, std::move(out), n_logprobs});
  }
  sampler_.async_sample(std::move(batch), on_strand([this, ids = std::move(ids)](error_code ec2, std::vector<sampler::sample_outcome> o) mutable {
    on_sampled(ec2, std::move(o), std::move(ids));
  }));
}

void scheduler::on_sampled(error_code ec, std::vector<sampler::sample_outcome> outcomes, std::vector<std::uint64_t> ids) {
  if (ec || outcomes.size() != ids.size()) {
    log().error("sampler failed: {}", ec ? ec.message() : "wrong number of answers");
    fail_everything(ec ? ec : make_error_code(errc::dropped), true);
    return core_.has_work() ? step() : idle();
  }
  std::vector<sched::sampled_token> sampled(outcomes.size());
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    if (outcomes[i]) {
      sampled[i] = {outcomes[i]->token, outcomes[i]->logprob, std::move(outcomes[i]->top_logprobs)};
    } else {  // the sequence's candidates were unusable: it fails alone
      log().error("req={} sampling failed: {}", ids[i], outcomes[i].error().message());
      core_.fail(ids[i], outcomes[i].error());
    }
  }
  emit(core_.complete_step(std::span<sched::sampled_token>(sampled)));
  core_.has_work() ? step() : idle();
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
