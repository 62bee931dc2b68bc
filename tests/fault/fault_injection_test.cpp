// The fault-injection hook on its own: the spec parser, and the worker decorator around a
// GoogleMock worker — chosen steps fail with errc::device_fault without reaching the device,
// answered like any actor reply (posted, on the caller's executor); a delayed step starts late;
// every other step passes through untouched.
#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "actors/executor_pool.h"
#include "gpu_worker/fault_injection.h"

namespace {

using namespace anvil;
using namespace anvil::gpu_worker;
namespace asio = boost::asio;
using ::testing::_;
using ::testing::Invoke;
using ::testing::Return;
using ::testing::ReturnRef;

class mock_worker : public worker {
 public:
  MOCK_METHOD(const memory_plan&, plan, (), (const, override));
  MOCK_METHOD(std::uint64_t, device_allocations, (), (const, override));
  MOCK_METHOD(void, do_execute, (step_plan, asio::any_completion_handler<worker::execute_signature>), (override));
  MOCK_METHOD(void, do_masks, (step_masks), (override));
};

TEST(FaultInjectionSpec, ParsesEachItemAndCombinations) {
  EXPECT_FALSE(parse_fault_injection("").any());
  const fault_injection one = parse_fault_injection("fail_step:3");
  EXPECT_TRUE(one.fails(3));
  EXPECT_FALSE(one.fails(2));
  EXPECT_FALSE(one.fails(4));
  const fault_injection from = parse_fault_injection("after_steps:5");
  EXPECT_FALSE(from.fails(4));
  EXPECT_TRUE(from.fails(5));
  EXPECT_TRUE(from.fails(500));
  const fault_injection both = parse_fault_injection("delay_step:2:300,after_steps:0");
  EXPECT_EQ(both.delay_step, 2);
  EXPECT_EQ(both.delay, std::chrono::milliseconds(300));
  EXPECT_TRUE(both.fails(0));
  EXPECT_EQ(describe(both), "after_steps:0,delay_step:2:300");
  EXPECT_EQ(describe(parse_fault_injection(describe(one))), "fail_step:3");
}

TEST(FaultInjectionSpec, RefusesWhatItDoesNotKnowWithTheReason) {
  for (const char* bad : {"fail", "fail_step", "fail_step:", "fail_step:-1", "fail_step:x", "after_steps:1:2",
                          "delay_step:1", "explode:1", "fail_step:1,", ",fail_step:1"}) {
    try {
      parse_fault_injection(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("fault injection"), std::string::npos) << e.what();
    }
  }
}

struct decorated {
  actors::executor_pool pool{"t", 1};
  memory_plan mem{.device = "mock", .n_blocks = 8, .block_size = 16, .max_batch_tokens = 64, .max_seqs = 4, .n_vocab = 100};
  mock_worker* inner = nullptr;
  std::unique_ptr<fault_injecting_worker> w;

  explicit decorated(const char* spec) {
    auto m = std::make_unique<mock_worker>();
    inner = m.get();
    ON_CALL(*inner, plan()).WillByDefault(ReturnRef(mem));
    ON_CALL(*inner, device_allocations()).WillByDefault(Return(7));
    w = std::make_unique<fault_injecting_worker>(std::move(m), parse_fault_injection(spec), pool.get_executor());
  }
  ~decorated() {
    w.reset();
    pool.join();
  }
  // Executes one step and waits for its answer.
  error_code execute(std::uint64_t step) {
    step_plan p;
    p.step = step;
    auto f = w->async_execute(std::move(p), asio::use_future);
    if (f.wait_for(std::chrono::seconds(30)) != std::future_status::ready) return make_error_code(errc::dropped);
    try {
      f.get();
      return {};
    } catch (const boost::system::system_error& e) {
      return e.code();
    }
  }
};

// The inner worker answers every step it is given, successfully.
void answers_every_step(mock_worker& m, std::atomic<int>& reached) {
  EXPECT_CALL(m, do_execute(_, _)).WillRepeatedly(Invoke([&reached](step_plan p, auto handler) {
    ++reached;
    step_result r;
    r.step = p.step;
    std::move(handler)(error_code{}, std::move(r));
  }));
}

TEST(FaultInjectingWorker, FailsTheChosenStepWithoutRunningItAndPassesTheRest) {
  decorated d("fail_step:2");
  std::atomic<int> reached{0};
  answers_every_step(*d.inner, reached);
  EXPECT_FALSE(d.execute(0));
  EXPECT_FALSE(d.execute(1));
  EXPECT_EQ(d.execute(2), make_error_code(errc::device_fault));
  EXPECT_FALSE(d.execute(3));
  EXPECT_EQ(reached, 3);
  EXPECT_EQ(d.w->steps_seen(), 4);
  EXPECT_EQ(d.w->plan().n_blocks, 8);
  EXPECT_EQ(d.w->device_allocations(), 7u);
}

TEST(FaultInjectingWorker, AfterStepsNFailsEveryStepFromN) {
  decorated d("after_steps:1");
  std::atomic<int> reached{0};
  answers_every_step(*d.inner, reached);
  EXPECT_FALSE(d.execute(0));
  for (std::uint64_t s = 1; s < 5; ++s) EXPECT_EQ(d.execute(s), make_error_code(errc::device_fault));
  EXPECT_EQ(reached, 1);
}

TEST(FaultInjectingWorker, AnInjectedFaultIsAnsweredOnTheCallersExecutorNeverInline) {
  decorated d("after_steps:0");
  EXPECT_CALL(*d.inner, do_execute(_, _)).Times(0);
  asio::io_context caller;
  error_code got;
  bool answered = false;
  d.w->async_execute(step_plan{}, asio::bind_executor(caller, [&](error_code ec, step_result) {
                       got = ec;
                       answered = true;
                     }));
  EXPECT_FALSE(answered);  // not inside the initiating call
  caller.run();            // returns once the answer ran here (the pending reply kept it alive)
  EXPECT_TRUE(answered);
  EXPECT_EQ(got, make_error_code(errc::device_fault));
}

TEST(FaultInjectingWorker, ADelayedStepReachesTheDeviceNoSoonerThanTheDelay) {
  decorated d("delay_step:1:200");
  std::atomic<int> reached{0};
  answers_every_step(*d.inner, reached);
  EXPECT_FALSE(d.execute(0));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(d.execute(1));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(200));
  EXPECT_FALSE(d.execute(2));
  EXPECT_EQ(reached, 3);
}

}  // namespace
