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
#include <thread>
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
    std::vector<std::pair<std::uint64_t, std::size_t>> finished;  // finish_begin: (step, words of its first mask)
  };
  explicit fake_queued_device(std::shared_ptr<record> r) : rec_(std::move(r)) {}

  void execute(const step_plan&, step_result&) override { throw std::logic_error("a queued device never executes"); }
  bool queues_steps() const override { return true; }
  void begin(const step_plan& plan) override {
    if (plan.seqs.front().seq_id == 666) throw std::runtime_error("the device failed to begin it");
    if (!on_device_.empty() && on_device_.back().held) throw std::logic_error("begun while a step waits for its masks");
    // Polls until it ends: the next steps arrive meanwhile. A step with deferred masks is held
    // until finish_begin().
    on_device_.push_back({plan.step, 1000, defers_masks(plan)});
    std::lock_guard lock(rec_->mu);
    rec_->begun.push_back(plan.step);
    rec_->most_on_device = std::max(rec_->most_on_device, on_device_.size());
  }
  void finish_begin(const step_plan& plan) override {
    if (on_device_.empty() || !on_device_.back().held || on_device_.back().step != plan.step) {
      throw std::logic_error("finish_begin without a held step");
    }
    if (defers_masks(plan)) throw std::logic_error("finish_begin before the masks are in the plan");
    on_device_.back().held = false;
    std::lock_guard lock(rec_->mu);
    rec_->finished.emplace_back(plan.step, plan.seqs.front().logits.allowed.size());
  }
  bool oldest_ended() const override {
    if (!on_device_.empty() && on_device_.front().held) throw std::logic_error("polled a step that waits for its masks");
    return on_device_.empty() || --on_device_.front().polls_left <= 0;
  }
  void collect(const step_plan& plan, step_result& result) override {
    if (on_device_.empty() || on_device_.front().step != plan.step) throw std::logic_error("collected out of order");
    if (on_device_.front().held) throw std::logic_error("collected a step that waits for its masks");
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
    bool held;
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

// A step planned ahead whose sequence's mask comes later (seq_step::mask_deferred).
step_plan deferred_plan_of(std::uint64_t step, std::uint64_t seq) {
  step_plan p = plan_of(step, seq, true);
  p.seqs[0].mask_deferred = true;
  return p;
}

step_masks masks_of(std::uint64_t step, std::size_t words) {
  return {.step = step, .allowed = {std::vector<std::uint32_t>(words, 0xffffffffu)}};
}

struct answers {
  std::mutex mu;
  std::vector<std::pair<std::uint64_t, error_code>> got;  // (the plan's step, the answer's error)
  std::promise<void> all;
  std::size_t expected = 0;
};

// A device that runs each step whole (the CPU's kind): it records the mask each step ran with.
class fake_serial_device final : public worker_device {
 public:
  explicit fake_serial_device(std::shared_ptr<fake_queued_device::record> r) : rec_(std::move(r)) {}
  void execute(const step_plan& plan, step_result& result) override {
    if (defers_masks(plan)) throw std::logic_error("executed before its masks came");
    std::lock_guard lock(rec_->mu);
    rec_->begun.push_back(plan.step);
    rec_->finished.emplace_back(plan.step, plan.seqs.front().logits.allowed.size());
    for (const seq_step& s : plan.seqs) {
      seq_output out;
      out.seq_id = s.seq_id;
      out.top = {{7, 0.f}};
      out.drawn = 7;
      result.outputs.push_back(std::move(out));
    }
  }
  std::uint64_t allocations() const override { return 0; }
  std::int64_t max_context() const override { return 1024; }
  std::string describe(const memory_plan&) const override { return "fake serial device"; }
  std::string unusable(std::uint64_t) const override { return ""; }

 private:
  std::shared_ptr<fake_queued_device::record> rec_;
};

struct harness {
  memory_plan mem{.device = "fake", .n_blocks = 16, .block_size = 16, .max_batch_tokens = 64, .max_seqs = 4, .n_vocab = 100};
  std::shared_ptr<fake_queued_device::record> rec = std::make_shared<fake_queued_device::record>();
  actors::executor_pool pool{"gpu", 1};
  std::unique_ptr<worker_shell> shell;
  answers a;

  explicit harness(bool queued = true) {
    std::unique_ptr<worker_device> dev;
    if (queued) {
      dev = std::make_unique<fake_queued_device>(rec);
    } else {
      dev = std::make_unique<fake_serial_device>(rec);
    }
    shell = std::make_unique<worker_shell>(pool.get_executor(), std::move(dev), mem);
  }
  // Answers so far, without waiting.
  std::size_t answered() {
    std::lock_guard lock(a.mu);
    return a.got.size();
  }

  // Polls until at least n answers came; false after 10 s.
  bool wait_for_answers(std::size_t n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (answered() < n) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

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

// A step planned ahead with a deferred mask: begun up to its logits at once, then neither polled
// nor answered until its masks come; they reach the device in the plan, and it is answered in
// order. The 100-token vocabulary takes masks of 4 words.
TEST(WorkerShellMasks, AStepWaitsForItsMasksAndRunsWithThem) {
  for (const bool queued : {true, false}) {
    SCOPED_TRACE(queued ? "a device that queues steps" : "a device that runs steps whole");
    harness h(queued);
    h.a.expected = 3;
    h.send(plan_of(0, 1, false));
    h.send(deferred_plan_of(1, 1));
    // Step 0 is answered however slow the machine (a sanitizer build on a loaded CI host took
    // longer than a fixed sleep); step 1 then stays unanswered while its masks have not come.
    EXPECT_TRUE(h.wait_for_answers(1)) << "step 0 was never answered";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(h.answered(), 1u) << "step 1 was answered without its masks";
    h.shell->masks(masks_of(1, 4));
    h.send(plan_of(2, 1, true));
    const auto got = h.wait();
    ASSERT_EQ(got.size(), 3u);
    for (std::uint64_t s = 0; s < 3; ++s) {
      EXPECT_EQ(got[s].first, s);
      EXPECT_FALSE(got[s].second) << s << ": " << got[s].second.message();
    }
    std::lock_guard lock(h.rec->mu);
    EXPECT_EQ(h.rec->begun, (std::vector<std::uint64_t>{0, 1, 2}));
    const std::vector<std::pair<std::uint64_t, std::size_t>> with_mask{{1, 4}};
    if (queued) {
      EXPECT_EQ(h.rec->finished, with_mask);
    } else {
      EXPECT_EQ(h.rec->finished, (std::vector<std::pair<std::uint64_t, std::size_t>>{{0, 0}, {1, 4}, {2, 0}}));
    }
  }
}

// Masks that do not fit their step fail it (it runs to its end without them on a device that
// queues steps, so the device stays in order); a plan that comes before the masks of the step
// waiting for them fails that step; the steps after go on.
TEST(WorkerShellMasks, MalformedOrLateMasksFailTheirStepAlone) {
  for (const bool queued : {true, false}) {
    SCOPED_TRACE(queued ? "a device that queues steps" : "a device that runs steps whole");
    harness h(queued);
    h.a.expected = 5;
    h.send(plan_of(0, 1, false));
    h.send(deferred_plan_of(1, 1));
    h.shell->masks(masks_of(1, 3));  // 3 words do not cover 100 tokens
    h.send(plan_of(2, 1, false));
    h.send(deferred_plan_of(3, 1));
    h.send(plan_of(4, 1, false));  // before step 3's masks
    h.shell->masks(masks_of(3, 4));  // too late: dropped
    const auto got = h.wait();
    ASSERT_EQ(got.size(), 5u);
    for (std::uint64_t s = 0; s < 5; ++s) EXPECT_EQ(got[s].first, s);
    EXPECT_FALSE(got[0].second);
    EXPECT_EQ(got[1].second, make_error_code(errc::invalid_argument));
    EXPECT_FALSE(got[2].second);
    EXPECT_EQ(got[3].second, make_error_code(errc::invalid_argument));
    EXPECT_FALSE(got[4].second) << got[4].second.message();
  }
}

}  // namespace
