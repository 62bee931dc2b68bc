// The scheduler actor against a GoogleMock worker: the test answers each step itself — with
// fabricated candidates, or with an error mid-run — and checks what reaches the request streams.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/use_future.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "actors/executor_pool.h"
#include "sched/scheduler.h"

namespace {

using namespace anvil;
namespace asio = boost::asio;
using ::testing::_;
using ::testing::Invoke;
using ::testing::Return;
using ::testing::ReturnRef;

class mock_worker : public gpu_worker::worker {
 public:
  MOCK_METHOD(const gpu_worker::memory_plan&, plan, (), (const, override));
  MOCK_METHOD(std::uint64_t, device_allocations, (), (const, override));
  MOCK_METHOD(void, do_execute,
              (gpu_worker::step_plan, asio::any_completion_handler<gpu_worker::worker::execute_signature>), (override));
  MOCK_METHOD(void, do_masks, (gpu_worker::step_masks), (override));
};

// Candidates that make token `t` the certain choice.
gpu_worker::seq_output certain(std::uint64_t seq, std::int32_t t) {
  gpu_worker::seq_output o;
  o.seq_id = seq;
  o.top = {{t, 0.f}};
  o.log_normalizer = 0.f;
  o.tail_mass = 0.f;
  return o;
}

struct harness {
  actors::executor_pool pool{"t", 2};
  mock_worker worker;
  kv::kv_manager kv;
  sampler::sampler_actor sampler;
  std::mutex mu;
  std::vector<sched::step_event> events;
  std::promise<void> all_done;
  int expected_finishes = 0;
  int finishes = 0;
  std::unique_ptr<sched::scheduler> sched;

  explicit harness(int finishes_expected, std::size_t mailbox = 1u << 16, std::size_t kv_mailbox = 4096,
                   std::size_t sampler_mailbox = 4096)
      : kv(pool.get_executor(), kv::kv_config{64, 4, true}, kv_mailbox),
        sampler(pool.get_executor(), sampler_mailbox),
        expected_finishes(finishes_expected) {
    sched::sched_config cfg;
    cfg.max_num_batched_tokens = 64;
    cfg.max_num_seqs = 8;
    cfg.block_size = 4;
    cfg.eog_tokens = {99};
    sched = std::make_unique<sched::scheduler>(pool.get_executor(), cfg, kv, worker, sampler,
                                               [this](std::vector<sched::step_event> ev) {
                                                 std::lock_guard lock(mu);
                                                 for (auto& e : ev) {
                                                   const bool last = e.finish != sched::finish_reason::none &&
                                                                     ++finishes == expected_finishes;
                                                   events.push_back(std::move(e));
                                                   if (last) all_done.set_value();
                                                 }
                                               },
                                               sched::sched_options{.mailbox_capacity = mailbox});
  }
  ~harness() {
    sched->async_stop(asio::use_future).get();
    sampler.async_stop(asio::use_future).get();
    kv.async_stop(asio::use_future).get();
  }
  error_code submit(sched::request r) {
    std::promise<error_code> p;
    sched->async_submit(std::move(r), {}, [&p](error_code ec) { p.set_value(ec); });
    return p.get_future().get();
  }
  // The worker answers nothing itself: every step's plan and handler are held for the test, which
  // completes them (through complete(), as a worker does) when and in what order it chooses.
  struct held_steps {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::pair<gpu_worker::step_plan, asio::any_completion_handler<gpu_worker::worker::execute_signature>>> steps;
  };
  held_steps held;
  // Answers a held step as a worker does: dispatched to the handler's own executor (the scheduler's
  // strand). Called inline from the test's thread, the handler would touch the scheduler's state
  // beside its strand (TSan saw that race).
  static void complete(asio::any_completion_handler<gpu_worker::worker::execute_signature> handler, error_code ec,
                       gpu_worker::step_result r) {
    const auto ex = asio::get_associated_executor(handler);
    asio::dispatch(ex, [handler = std::move(handler), ec, r = std::move(r)]() mutable { std::move(handler)(ec, std::move(r)); });
  }
  void hold_steps() {
    EXPECT_CALL(worker, do_execute(_, _)).WillRepeatedly(Invoke([this](gpu_worker::step_plan p, auto handler) {
      std::lock_guard lock(held.mu);
      held.steps.emplace_back(std::move(p), std::move(handler));
      held.cv.notify_all();
    }));
  }

  sched::request req(std::uint64_t id, std::vector<std::int32_t> prompt, std::int64_t max_tokens) {
    sched::request r;
    r.id = id;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    return r;
  }
};

TEST(SchedulerActor, StreamsTheTokensTheWorkerAndSamplerChoose) {
  harness h(1);
  int step = 0;
  EXPECT_CALL(h.worker, do_execute(_, _)).WillRepeatedly(Invoke([&](gpu_worker::step_plan p, auto handler) {
    gpu_worker::step_result r;
    r.step = p.step;
    EXPECT_EQ(p.seqs.size(), 1u);
    if (p.seqs[0].want_candidates) r.outputs.push_back(certain(p.seqs[0].seq_id, 40 + step++));
    std::move(handler)(error_code{}, std::move(r));
  }));
  ASSERT_FALSE(h.submit(h.req(1, {1, 2, 3, 4, 5, 6}, 3)));
  h.all_done.get_future().wait();
  std::vector<std::int32_t> tokens;
  for (const auto& e : h.events) {
    if (e.token >= 0) tokens.push_back(e.token);
  }
  EXPECT_EQ(tokens, (std::vector<std::int32_t>{40, 41, 42}));
  EXPECT_EQ(h.events.back().finish, sched::finish_reason::length);
}

TEST(SchedulerActor, AWorkerErrorMidRunFailsTheStepsRequestsAndMarksUnhealthy) {
  harness h(2);
  h.hold_steps();
  auto next_step = [&] {
    std::unique_lock lock(h.held.mu);
    h.held.cv.wait(lock, [&] { return !h.held.steps.empty(); });
    auto s = std::move(h.held.steps.front());
    h.held.steps.pop_front();
    return s;
  };
  ASSERT_FALSE(h.submit(h.req(1, {1, 2, 3}, 50)));
  auto [first, first_handler] = next_step();  // seq 1 alone, held while seq 2 arrives
  ASSERT_FALSE(h.submit(h.req(2, {4, 5, 6}, 50)));
  gpu_worker::step_result r1;
  r1.outputs.push_back(certain(first.seqs.at(0).seq_id, 7));
  harness::complete(std::move(first_handler), error_code{}, std::move(r1));
  auto [second, second_handler] = next_step();
  EXPECT_EQ(second.seqs.size(), 2u);
  harness::complete(std::move(second_handler), make_error_code(errc::device_fault), gpu_worker::step_result{});
  h.all_done.get_future().wait();

  int failed = 0;
  for (const auto& e : h.events) {
    if (e.finish == sched::finish_reason::failed) {
      ++failed;
      EXPECT_EQ(e.error, make_error_code(errc::device_fault));
    }
  }
  EXPECT_EQ(failed, 2);
  EXPECT_FALSE(h.sched->healthy());
  const kv::kv_stats ks = h.kv.async_stats(asio::use_future).get();
  EXPECT_EQ(ks.counts.free + ks.counts.cached + ks.counts.in_use, ks.counts.total);
}

// Overlapped steps: with a step planned ahead, two are in flight, and their answers may come back
// in either order (the worker's here; the sampler's leave through a pool of threads). The test
// answers the newer first every time it holds two: the steps still complete in order, so the
// tokens (each the position it takes, 40 + position) come out in order.
TEST(SchedulerActor, AnswersOfTwoStepsInFlightInEitherOrderCompleteTheStepsInOrder) {
  harness h(1);
  h.hold_steps();
  const auto answer = [](gpu_worker::step_plan& p, auto& handler) {
    gpu_worker::step_result r;
    r.step = p.step;
    for (const auto& s : p.seqs) {
      if (s.want_candidates) r.outputs.push_back(certain(s.seq_id, std::int32_t(40 + s.start_pos + std::int64_t(s.tokens.size()))));
    }
    harness::complete(std::move(handler), error_code{}, std::move(r));
  };
  sched::request r = h.req(1, {1, 2, 3, 4, 5, 6}, 12);
  r.logits.draw.on = true;  // the worker "draws": steps are planned ahead
  ASSERT_FALSE(h.submit(std::move(r)));
  std::future<void> done = h.all_done.get_future();
  int reversed = 0;
  auto& held = h.held.steps;
  while (done.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready) {
    std::unique_lock lock(h.held.mu);
    h.held.cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return held.size() >= 2; });
    if (held.size() >= 2) {
      auto newer = std::move(held[1]);
      auto older = std::move(held[0]);
      held.erase(held.begin(), held.begin() + 2);
      lock.unlock();
      answer(newer.first, newer.second);
      answer(older.first, older.second);
      ++reversed;
    } else if (held.size() == 1) {
      auto only = std::move(held.front());
      held.pop_front();
      lock.unlock();
      answer(only.first, only.second);
    }
  }
  std::vector<std::int32_t> tokens;
  for (const auto& e : h.events) {
    if (e.token >= 0) tokens.push_back(e.token);
  }
  EXPECT_EQ(tokens, (std::vector<std::int32_t>{46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57}));
  EXPECT_GT(reversed, 0) << "no two steps were ever in flight: the test would not see a reordering";
  EXPECT_TRUE(h.sched->healthy());
}

TEST(SchedulerActor, UnusableCandidatesFailTheirRequestAloneAndTheEngineStaysHealthy) {
  harness h(2);
  // Sequence 1's logits are never usable (the worker answers it with no candidates, step.h);
  // sequence 2 shares its steps and must not notice.
  EXPECT_CALL(h.worker, do_execute(_, _)).WillRepeatedly(Invoke([&](gpu_worker::step_plan p, auto handler) {
    gpu_worker::step_result r;
    r.step = p.step;
    for (const auto& s : p.seqs) {
      if (!s.want_candidates) continue;
      gpu_worker::seq_output none;
      none.seq_id = s.seq_id;
      r.outputs.push_back(s.seq_id == 1 ? none : certain(s.seq_id, 30));
    }
    std::move(handler)(error_code{}, std::move(r));
  }));
  ASSERT_FALSE(h.submit(h.req(1, {1, 2, 3}, 4)));
  ASSERT_FALSE(h.submit(h.req(2, {4, 5, 6}, 4)));
  h.all_done.get_future().wait();
  int tokens_of_2 = 0;
  for (const auto& e : h.events) {
    if (e.id == 1 && e.finish != sched::finish_reason::none) {
      EXPECT_EQ(e.finish, sched::finish_reason::failed);
      EXPECT_EQ(e.error, make_error_code(sampler::sampler_errc::invalid_candidates));
    }
    if (e.id == 1) {
      EXPECT_LT(e.token, 0);
    }
    if (e.id == 2 && e.token >= 0) ++tokens_of_2;
    if (e.id == 2 && e.finish != sched::finish_reason::none) {
      EXPECT_EQ(e.finish, sched::finish_reason::length);
    }
  }
  EXPECT_EQ(tokens_of_2, 4);
  EXPECT_TRUE(h.sched->healthy());
}

// Blocks an actor's strand until released, so that what is sent meanwhile waits in its mailbox.
struct strand_blocker {
  std::promise<void> running, release;
  explicit strand_blocker(const actors::strand_actor& a) {
    asio::post(a.get_executor(), [this] {
      running.set_value();
      release.get_future().wait();
    });
    running.get_future().wait();
  }
  void open() { release.set_value(); }
};

TEST(SchedulerActor, ACancelGetsThroughAFullMailbox) {
  harness h(1, /*mailbox=*/2);
  EXPECT_CALL(h.worker, do_execute(_, _)).WillRepeatedly(Invoke([&](gpu_worker::step_plan p, auto handler) {
    gpu_worker::step_result r;
    r.step = p.step;
    for (const auto& s : p.seqs) {
      if (s.want_candidates) r.outputs.push_back(certain(s.seq_id, 30));
    }
    std::move(handler)(error_code{}, std::move(r));
  }));
  ASSERT_FALSE(h.submit(h.req(1, {1, 2, 3}, 4000)));
  strand_blocker block(*h.sched);
  std::vector<std::future<sched::sched_stats>> stats;
  for (int i = 0; i < 3; ++i) stats.push_back(h.sched->async_stats(asio::use_future));
  EXPECT_EQ(h.sched->mailbox_depth(), 2u);  // full: the third was refused busy
  EXPECT_FALSE(h.sched->cancel(1));          // a stop string found now must still end the request
  block.open();
  h.all_done.get_future().wait();
  EXPECT_EQ(h.events.back().finish, sched::finish_reason::cancelled);
  int tokens = 0;
  for (const auto& e : h.events) tokens += e.token >= 0;
  EXPECT_LT(tokens, 4000);
  EXPECT_THROW(stats[2].get(), boost::system::system_error);
}

TEST(SchedulerActor, AFullKvMailboxNeverMakesItUnhealthy) {
  // The KV manager's mailbox holds one message and other senders' stats requests keep it full
  // while the step loop runs: the loop's batches are exempt (as the sampler's open, sample and
  // close are), so every request finishes normally.
  harness h(3, 1u << 16, /*kv_mailbox=*/1, /*sampler_mailbox=*/1);
  EXPECT_CALL(h.worker, do_execute(_, _)).WillRepeatedly(Invoke([&](gpu_worker::step_plan p, auto handler) {
    gpu_worker::step_result r;
    r.step = p.step;
    for (const auto& s : p.seqs) {
      if (s.want_candidates) r.outputs.push_back(certain(s.seq_id, 30));
    }
    std::move(handler)(error_code{}, std::move(r));
  }));
  std::atomic<bool> done{false};
  std::thread flood([&] {
    while (!done) {
      h.kv.async_stats([](error_code, kv::kv_stats) {});
      std::this_thread::yield();
    }
  });
  for (std::uint64_t id = 1; id <= 3; ++id) ASSERT_FALSE(h.submit(h.req(id, {1, 2, 3}, 40)));
  h.all_done.get_future().wait();
  done = true;
  flood.join();
  for (const auto& e : h.events) {
    if (e.finish != sched::finish_reason::none) {
      EXPECT_EQ(e.finish, sched::finish_reason::length) << e.id << " " << e.error.message();
    }
  }
  EXPECT_TRUE(h.sched->healthy());
}

TEST(SchedulerActor, EndOfGenerationFinishesWithStop) {
  harness h(1);
  EXPECT_CALL(h.worker, do_execute(_, _)).WillRepeatedly(Invoke([&](gpu_worker::step_plan p, auto handler) {
    gpu_worker::step_result r;
    for (const auto& s : p.seqs) {
      if (s.want_candidates) r.outputs.push_back(certain(s.seq_id, 99));
    }
    std::move(handler)(error_code{}, std::move(r));
  }));
  ASSERT_FALSE(h.submit(h.req(5, {1, 2}, 10)));
  h.all_done.get_future().wait();
  EXPECT_EQ(h.events.back().finish, sched::finish_reason::stop);
  EXPECT_EQ(h.events.back().token, 99);
}

TEST(SchedulerActor, AdmissionErrorsComeBackFromSubmit) {
  harness h(0);
  EXPECT_CALL(h.worker, do_execute(_, _)).Times(0);
  EXPECT_EQ(h.submit(h.req(1, {}, 4)), make_error_code(errc::invalid_argument));
  EXPECT_EQ(h.submit(h.req(2, std::vector<std::int32_t>(5000, 1), 4)), make_error_code(errc::context_overflow));
}

}  // namespace
