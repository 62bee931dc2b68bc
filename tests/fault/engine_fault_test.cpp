// A device fault through the real engine (DESIGN.md, Errors): the worker's fault-injection hook
// fails a step the way a broken device does, while requests are queued, in prefill and in decode,
// streamed and not. Every one of them ends with finish_reason "error" and errc::device_fault, none
// hangs, the engine turns unhealthy and refuses new work with the same error, stops cleanly, and
// the KV ledger balances. A delayed step only delays.
#include <atomic>
#include <future>
#include <memory>
#include <vector>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include "tests/fault/engine_helpers.h"

namespace {

using namespace anvil;
using namespace anvil::testing;
namespace asio = boost::asio;

const error_code device_fault = make_error_code(errc::device_fault);

class EngineDeviceFault : public ::testing::TestWithParam<const char*> {};

// 2 streamed decodes, 2 streamed prefills, 2 non-streamed decodes, 2 non-streamed in the queue.
TEST_P(EngineDeviceFault, FailsEveryRequestItHoldsAndRefusesNewOnes) {
  engine_config cfg = tiny_engine_config();
  cfg.max_seqs = 6;             // the last two wait in the queue
  cfg.max_prefill_chunk = 8;    // a 300-token prompt takes 38 steps to prefill
  cfg.test_faults = gpu_worker::parse_fault_injection(GetParam());  // the fault comes at step 12
  auto eng = engine::create(cfg);
  const std::uint64_t allocations = eng->stats().device_allocations;

  std::vector<std::unique_ptr<stream_log>> decodes, prefills;
  std::vector<std::future<stream_event>> decode_done, prefill_done;
  for (std::uint32_t i = 0; i < 2; ++i) {
    decodes.push_back(std::make_unique<stream_log>());
    decode_done.push_back(decodes.back()->done_future());
    ASSERT_TRUE(eng->submit(greedy_request(random_prompt(4, i), 400), decodes.back()->handler()));
  }
  for (std::uint32_t i = 0; i < 2; ++i) {
    prefills.push_back(std::make_unique<stream_log>());
    prefill_done.push_back(prefills.back()->done_future());
    ASSERT_TRUE(eng->submit(greedy_request(random_prompt(300, 10 + i), 4), prefills.back()->handler()));
  }
  std::vector<std::future<completion>> whole;
  for (std::uint32_t i = 0; i < 4; ++i) {
    whole.push_back(eng->async_generate(greedy_request(random_prompt(5, 20 + i), 400), asio::use_future));
  }

  for (std::size_t i = 0; i < decodes.size(); ++i) {
    const stream_event last = get_within(decode_done[i], "a streamed decode");
    EXPECT_EQ(last.finish_reason, "error");
    EXPECT_EQ(last.error, device_fault) << last.error.message();
    EXPECT_GT(decodes[i]->tokens().size(), 0u) << "it was decoding when the fault came";
    EXPECT_LT(decodes[i]->tokens().size(), 20u);
  }
  for (std::size_t i = 0; i < prefills.size(); ++i) {
    const stream_event last = get_within(prefill_done[i], "a streamed prefill");
    EXPECT_EQ(last.finish_reason, "error");
    EXPECT_EQ(last.error, device_fault);
    EXPECT_EQ(last.usage.completion_tokens, 0) << "it was still in prefill when the fault came";
  }
  for (auto& f : whole) {
    if (f.wait_for(hang_limit) != std::future_status::ready) {
      ADD_FAILURE() << "a non-streamed request hung";
      continue;
    }
    try {
      f.get();
      ADD_FAILURE() << "a non-streamed request succeeded on a faulted engine";
    } catch (const boost::system::system_error& e) {
      EXPECT_EQ(e.code(), device_fault) << e.what();
    }
  }

  EXPECT_FALSE(eng->healthy());
  // New work is refused at once, with the reason.
  auto refused = eng->submit(greedy_request(random_prompt(4, 99), 4), nullptr);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error(), device_fault);
  auto late = eng->async_generate(greedy_request(random_prompt(4, 98), 4), asio::use_future);
  ASSERT_EQ(late.wait_for(hang_limit), std::future_status::ready);
  EXPECT_THROW(late.get(), boost::system::system_error);

  const engine_stats s = settled_stats(*eng);
  EXPECT_FALSE(s.healthy);
  EXPECT_EQ(s.live_requests, 0);
  EXPECT_EQ(s.sched.running + s.sched.waiting, 0);
  EXPECT_EQ(s.kv.counts.in_use, 0);
  EXPECT_EQ(s.kv.counts.free + s.kv.counts.cached + s.kv.counts.in_use, s.kv.counts.total);
  EXPECT_EQ(s.requests.finished_error, 8u);
  EXPECT_EQ(s.device_allocations, allocations);
  stop_within_limit(*eng);
}

// A device that dies for good, and one that fails a single step: the engine treats both alike.
INSTANTIATE_TEST_SUITE_P(Modes, EngineDeviceFault, ::testing::Values("after_steps:12", "fail_step:12"));

TEST(EngineFault, AFaultOnTheFirstStepFailsTheRequestsThatStartedIt) {
  engine_config cfg = tiny_engine_config();
  cfg.test_faults = gpu_worker::parse_fault_injection("after_steps:0");
  auto eng = engine::create(cfg);
  std::vector<std::unique_ptr<stream_log>> logs;
  std::vector<std::future<stream_event>> done;
  for (std::uint32_t i = 0; i < 5; ++i) {
    logs.push_back(std::make_unique<stream_log>());
    done.push_back(logs.back()->done_future());
    const auto id = eng->submit(greedy_request(random_prompt(10, i), 8), logs.back()->handler());
    if (!id) {  // the fault came before this submit: refused up front, with the same reason
      EXPECT_EQ(id.error(), device_fault);
      done.pop_back();
    }
  }
  ASSERT_FALSE(done.empty()) << "the first submit comes before any step";
  for (auto& f : done) {
    const stream_event last = get_within(f, "a request on a faulted engine");
    EXPECT_EQ(last.finish_reason, "error");
    EXPECT_EQ(last.error, device_fault);
    EXPECT_TRUE(last.tokens.empty());
  }
  EXPECT_FALSE(eng->healthy());
  EXPECT_EQ(settled_stats(*eng).kv.counts.in_use, 0);
  stop_within_limit(*eng);
}

TEST(EngineFault, StopCompletesWhileAFaultFailsTheRequestsItIsDraining) {
  engine_config cfg = tiny_engine_config();
  cfg.test_faults = gpu_worker::parse_fault_injection("after_steps:6");
  auto eng = engine::create(cfg);
  std::vector<std::future<completion>> whole;
  for (std::uint32_t i = 0; i < 6; ++i) {
    whole.push_back(eng->async_generate(greedy_request(random_prompt(6, i), 200), asio::use_future));
  }
  auto stopped = eng->async_stop(asio::use_future);  // drains: the fault ends the draining
  ASSERT_EQ(stopped.wait_for(hang_limit), std::future_status::ready) << "async_stop hung";
  stopped.get();
  for (auto& f : whole) {
    ASSERT_EQ(f.wait_for(hang_limit), std::future_status::ready);
    try {
      f.get();
      ADD_FAILURE() << "a request outlived the fault";
    } catch (const boost::system::system_error& e) {
      EXPECT_EQ(e.code(), device_fault);
    }
  }
  EXPECT_FALSE(eng->healthy());
}

TEST(EngineFault, ADelayedStepOnlyDelays) {
  engine_config cfg = tiny_engine_config();
  cfg.test_faults = gpu_worker::parse_fault_injection("delay_step:3:300");
  auto eng = engine::create(cfg);
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<std::future<completion>> whole;
  for (std::uint32_t i = 0; i < 4; ++i) {
    prompts.push_back(random_prompt(9 + i, 40 + i));
    whole.push_back(eng->async_generate(greedy_request(prompts.back(), 10), asio::use_future));
  }
  for (std::size_t i = 0; i < whole.size(); ++i) {
    const completion c = get_within(whole[i], "a request across a delayed step");
    EXPECT_EQ(c.finish_reason, "length");
    EXPECT_EQ(c.tokens, reference_greedy(prompts[i], 10)) << i;
  }
  EXPECT_TRUE(eng->healthy());
  stop_within_limit(*eng);
}

// cancel() on a request whose step is running (held up by a delayed step): the request ends
// "cancelled" with nothing from that step, the others are untouched; also for a non-streamed
// request, cancelled through the completion token's cancellation slot.
TEST(EngineFault, CancelWhileItsStepRunsEndsTheRequestAndNothingElse) {
  engine_config cfg = tiny_engine_config();
  cfg.test_faults = gpu_worker::parse_fault_injection("delay_step:4:500");
  auto eng = engine::create(cfg);
  stream_log streamed;
  auto streamed_done = streamed.done_future();
  std::promise<void> third_token;
  std::atomic<int> tokens{0};
  const auto id = eng->submit(greedy_request(random_prompt(5, 1), 50), [&](const stream_event& e) {
    streamed.handler()(e);
    if (!e.tokens.empty() && ++tokens == 3) third_token.set_value();  // step 3 is done; step 4 is held
  });
  ASSERT_TRUE(id);
  asio::cancellation_signal cancel_whole;
  auto whole = eng->async_generate(greedy_request(random_prompt(6, 2), 50),
                                   asio::bind_cancellation_slot(cancel_whole.slot(), asio::use_future));
  const auto other_prompt = random_prompt(7, 3);
  auto other = eng->async_generate(greedy_request(other_prompt, 12), asio::use_future);

  auto third = third_token.get_future();
  ASSERT_EQ(third.wait_for(hang_limit), std::future_status::ready);
  eng->cancel(*id);
  cancel_whole.emit(asio::cancellation_type::terminal);

  const stream_event last = get_within(streamed_done, "a cancelled streamed request");
  EXPECT_EQ(last.finish_reason, "cancelled");
  EXPECT_LE(streamed.tokens().size(), 4u);
  const completion c = get_within(whole, "a cancelled non-streamed request");
  EXPECT_EQ(c.finish_reason, "cancelled");
  EXPECT_LT(c.tokens.size(), 50u);
  EXPECT_EQ(c.usage.completion_tokens, std::int64_t(c.tokens.size()));
  const completion o = get_within(other, "the request nobody cancelled");
  EXPECT_EQ(o.finish_reason, "length");
  EXPECT_EQ(o.tokens, reference_greedy(other_prompt, 12));
  EXPECT_EQ(settled_stats(*eng).kv.counts.in_use, 0);
  EXPECT_TRUE(eng->healthy());
  stop_within_limit(*eng);
}

TEST(EngineFault, CancellingANonStreamedRequestInTheQueueOrInPrefill) {
  engine_config cfg = tiny_engine_config();
  cfg.max_seqs = 1;           // one at a time: the second waits in the queue
  cfg.max_prefill_chunk = 8;  // the first takes 50 steps to prefill
  auto eng = engine::create(cfg);
  asio::cancellation_signal in_prefill, in_queue;
  auto first = eng->async_generate(greedy_request(random_prompt(400, 1), 4),
                                   asio::bind_cancellation_slot(in_prefill.slot(), asio::use_future));
  auto second = eng->async_generate(greedy_request(random_prompt(10, 2), 4),
                                    asio::bind_cancellation_slot(in_queue.slot(), asio::use_future));
  in_queue.emit(asio::cancellation_type::terminal);
  const completion queued = get_within(second, "a request cancelled in the queue");
  EXPECT_EQ(queued.finish_reason, "cancelled");
  EXPECT_TRUE(queued.tokens.empty());
  in_prefill.emit(asio::cancellation_type::terminal);
  const completion prefilling = get_within(first, "a request cancelled in prefill");
  EXPECT_EQ(prefilling.finish_reason, "cancelled");
  EXPECT_TRUE(prefilling.tokens.empty());
  EXPECT_EQ(settled_stats(*eng).kv.counts.in_use, 0);
  stop_within_limit(*eng);
}

}  // namespace
