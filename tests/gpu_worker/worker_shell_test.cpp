// The worker shell over a device that queues steps (worker_shell.h; the GPU device is one): steps
// are begun as they arrive, several on the device at once, and answered in the order they came —
// a refused step or one that fails to begin too, behind the steps still on the device — and a
// step may feed from the one begun just before only. A fake device stands in for the GPU: each
// step ends after 1,000 polls, and its outputs say which step made them.
#include <chrono>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include "actors/executor_pool.h"
#include "gpu_worker/worker_shell.h"

namespace {

using namespace anvil;
using namespace anvil::gpu_worker;

class fake_queued_device final : public worker_device {
 public:
  // Shared with the test (the shell owns the device): what was begun, and the most on the device.
  struct record {
    std::mutex mu;
    std::vector<std::uint64_t> begun;
    std::size_t most_on_device = 0;
  };
  explicit fake_queued_device(std::shared_ptr<record> r) : rec_(std::move(r)) {}

  void execute(const step_plan&, step_result&) override { throw std::logic_error("a queued device never executes"); }
  bool queues_steps() const override { return true; }
  void begin(const step_plan& plan) override {
    if (plan.seqs.front().seq_id == 666) throw std::runtime_error("the device failed to begin it");
    on_device_.push_back({plan.step, 1000});  // polls until it ends: the next steps arrive meanwhile
    std::lock_guard lock(rec_->mu);
    rec_->begun.push_back(plan.step);
    rec_->most_on_device = std::max(rec_->most_on_device, on_device_.size());
  }
  bool oldest_ended() const override { return on_device_.empty() || --on_device_.front().polls_left <= 0; }
  void collect(const step_plan& plan, step_result& result) override {
    if (on_device_.empty() || on_device_.front().step != plan.step) throw std::logic_error("collected out of order");
    on_device_.pop_front();
    for (const seq_step& s : plan.seqs) {
      if (!s.want_candidates) continue;
      seq_output out;
      out.seq_id = s.seq_id;
      out.top = {{std::int32_t(plan.step % 50), 0.f}};
      out.drawn = std::int32_t(plan.step % 50);
      result.outputs.push_back(std::move(out));
    }
  }
  std::uint64_t allocations() const override { return 0; }
  std::int64_t max_context() const override { return 1024; }
  std::string describe(const memory_plan&) const override { return "fake queued device"; }
  std::string unusable(std::uint64_t) const override { return ""; }

 private:
  struct on_device {
    std::uint64_t step;
    mutable int polls_left;
  };
  mutable std::deque<on_device> on_device_;
  std::shared_ptr<record> rec_;
};

step_plan plan_of(std::uint64_t step, std::uint64_t seq, bool fed) {
  step_plan p;
  p.step = step;
  seq_step s;
  s.seq_id = seq;
  s.tokens = {fed ? -1 : 5};
  s.feed_from = fed ? 0 : -1;
  s.start_pos = std::int64_t(step);
  s.block_table = {0};
  s.want_candidates = true;
  p.seqs.push_back(s);
  return p;
}

struct answers {
  std::mutex mu;
  std::vector<std::pair<std::uint64_t, error_code>> got;  // (the plan's step, the answer's error)
  std::promise<void> all;
  std::size_t expected = 0;
};

struct harness {
  memory_plan mem{.device = "fake", .n_blocks = 16, .block_size = 16, .max_batch_tokens = 64, .max_seqs = 4, .n_vocab = 100};
  std::shared_ptr<fake_queued_device::record> rec = std::make_shared<fake_queued_device::record>();
  actors::executor_pool pool{"gpu", 1};
  std::unique_ptr<worker_shell> shell =
      std::make_unique<worker_shell>(pool.get_executor(), std::make_unique<fake_queued_device>(rec), mem);
  answers a;

  void send(step_plan p) {
    const std::uint64_t step = p.step;
    shell->execute(std::move(p), [this, step](error_code ec, step_result r) {
      std::lock_guard lock(a.mu);
      if (!ec) {
        EXPECT_EQ(r.step, step);
      }
      a.got.emplace_back(step, ec);
      if (a.got.size() == a.expected) a.all.set_value();
    });
  }
  std::vector<std::pair<std::uint64_t, error_code>> wait() {
    EXPECT_EQ(a.all.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
    std::lock_guard lock(a.mu);
    return a.got;
  }
  ~harness() {
    shell->async_stop(boost::asio::use_future).get();
    shell.reset();
    pool.join();
  }
};

TEST(WorkerShellQueued, StepsSentBackToBackRunTogetherAndAreAnsweredInOrder) {
  harness h;
  h.a.expected = 6;
  h.send(plan_of(0, 1, false));
  for (std::uint64_t s = 1; s < 6; ++s) h.send(plan_of(s, 1, true));  // each feeds from the one before
  const auto got = h.wait();
  ASSERT_EQ(got.size(), 6u);
  for (std::uint64_t s = 0; s < 6; ++s) {
    EXPECT_EQ(got[s].first, s);
    EXPECT_FALSE(got[s].second) << got[s].second.message();
  }
  EXPECT_EQ(h.rec->most_on_device, 2u) << "steps queue behind each other, at most two on the device";
}

TEST(WorkerShellQueued, ARefusedOrFailedStepIsAnsweredAfterTheStepsStillOnTheDevice) {
  harness h;
  h.a.expected = 5;
  h.send(plan_of(0, 1, false));
  h.send(plan_of(1, 1, true));
  step_plan bad = plan_of(2, 2, false);
  bad.seqs[0].tokens = {100};  // out of the vocabulary: refused
  h.send(std::move(bad));
  h.send(plan_of(3, 666, false));  // the device fails to begin it
  h.send(plan_of(4, 1, true));     // feeds from step 3, which never ran: refused
  const auto got = h.wait();
  ASSERT_EQ(got.size(), 5u);
  for (std::uint64_t s = 0; s < 5; ++s) EXPECT_EQ(got[s].first, s);
  EXPECT_FALSE(got[0].second);
  EXPECT_FALSE(got[1].second);
  EXPECT_EQ(got[2].second, make_error_code(errc::invalid_argument));
  EXPECT_EQ(got[3].second, make_error_code(errc::device_fault));
  EXPECT_EQ(got[4].second, make_error_code(errc::invalid_argument));
  std::lock_guard lock(h.rec->mu);
  EXPECT_EQ(h.rec->begun, (std::vector<std::uint64_t>{0, 1}));
}

}  // namespace
