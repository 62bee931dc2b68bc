// Ordering, mutual exclusion, backpressure and stop/drain of strand_actor.
#include "actors/strand_actor.h"

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include "actors/executor_pool.h"
#include "tests/actors/recorder_actor.h"
#include "tests/actors/future_error.h"

namespace {

namespace asio = boost::asio;
using anvil::errc;
using anvil::error_code;
using anvil::actors::executor_pool;
using anvil::actors::testing::recorder_actor;
using namespace std::chrono_literals;

void stop_and_wait(recorder_actor& a) { a.async_stop(asio::use_future).get(); }

// A reply's pass is released just after its handler is posted, so counters settle a moment after
// the caller's future is ready.
template <class Pred>
bool eventually(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

using anvil::test_support::error_of;

TEST(StrandActor, RunsMessagesFromOneCallerInOrder) {
  executor_pool pool("t", 4);
  recorder_actor actor(pool.get_executor());
  for (int i = 0; i < 2000; ++i) ASSERT_FALSE(actor.record(i));
  const std::vector<int> seen = actor.async_seen(asio::use_future).get();
  ASSERT_EQ(seen.size(), 2000u);
  for (int i = 0; i < 2000; ++i) ASSERT_EQ(seen[i], i);
  stop_and_wait(actor);
}

TEST(StrandActor, KeepsEachProducersOrderAndRunsOneMessageAtATime) {
  executor_pool pool("t", 4);
  recorder_actor actor(pool.get_executor());
  constexpr int producers = 4, per_producer = 1000;
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      for (int i = 0; i < per_producer; ++i) {
        const int v = p * per_producer + i;
        if (i % 2) {
          actor.async_record(v, [](error_code ec, std::size_t) { EXPECT_FALSE(ec); });
        } else {
          EXPECT_FALSE(actor.record(v));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  const std::vector<int> seen = actor.async_seen(asio::use_future).get();
  ASSERT_EQ(seen.size(), std::size_t(producers * per_producer));
  std::vector<int> last(producers, -1);
  for (int v : seen) {
    const int p = v / per_producer;
    EXPECT_GT(v, last[p]) << "producer " << p << " reordered";
    last[p] = v;
  }
  EXPECT_EQ(actor.max_concurrent(), 1);
  stop_and_wait(actor);
}

TEST(StrandActor, AnswersBusyWhenMailboxIsFull) {
  asio::io_context ctx;  // not running yet: accepted messages stay in the mailbox
  recorder_actor actor(ctx.get_executor(), 3);
  std::vector<error_code> results(5, make_error_code(errc::dropped));
  for (int i = 0; i < 5; ++i) {
    actor.async_record(i, [&results, i](error_code ec, std::size_t) { results[i] = ec; });
  }
  EXPECT_EQ(actor.mailbox_depth(), 3u);
  EXPECT_EQ(actor.record(99), make_error_code(errc::busy));
  ctx.run();
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(results[i]) << i;
  EXPECT_EQ(results[3], make_error_code(errc::busy));
  EXPECT_EQ(results[4], make_error_code(errc::busy));
  EXPECT_EQ(actor.mailbox_depth(), 0u);

  // Once drained the mailbox takes work again.
  ctx.restart();
  error_code later = make_error_code(errc::dropped);
  std::size_t count = 0;
  actor.async_record(7, [&](error_code ec, std::size_t n) {
    later = ec;
    count = n;
  });
  ctx.run();
  EXPECT_FALSE(later);
  EXPECT_EQ(count, 4u);
  ctx.restart();
  actor.async_stop([](error_code) {});
  ctx.run();
}

TEST(StrandActor, ExemptAndUrgentMessagesPassAFullMailbox) {
  asio::io_context ctx;  // not running yet: accepted messages stay in the mailbox
  recorder_actor actor(ctx.get_executor(), 2);
  actor.async_record(1, [](error_code, std::size_t) {});
  actor.async_record(2, [](error_code, std::size_t) {});
  EXPECT_EQ(actor.record(3), make_error_code(errc::busy));
  error_code exempt = make_error_code(errc::dropped);
  actor.async_record_exempt(4, [&](error_code ec, std::size_t) { exempt = ec; });
  EXPECT_FALSE(actor.record_urgent(5));
  ctx.run();
  EXPECT_FALSE(exempt);
  std::vector<int> seen;
  ctx.restart();
  actor.async_seen([&](error_code, std::vector<int> s) { seen = std::move(s); });
  ctx.run();
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 4, 5}));  // in the order accepted
  ctx.restart();
  actor.async_stop([](error_code) {});
  ctx.run();
}

TEST(StrandActor, AnUrgentMessageIsTakenWhileAStopDrainsAndRefusedOnceStopped) {
  executor_pool pool("t", 2);
  recorder_actor actor(pool.get_executor());
  auto held = actor.async_hold(asio::use_future);  // keeps the stop draining
  std::promise<void> stopped;
  actor.async_stop([&](error_code) { stopped.set_value(); });
  while (!actor.stopping()) std::this_thread::yield();
  EXPECT_EQ(actor.record(1), make_error_code(errc::stopped));
  EXPECT_FALSE(actor.record_urgent(2));  // e.g. a cancel of the work the stop waits for
  actor.event_answer_held(7);
  EXPECT_EQ(held.get(), 7);
  stopped.get_future().wait();
  EXPECT_EQ(actor.record_urgent(3), make_error_code(errc::stopped));
}

TEST(StrandActor, ExpectedFailuresTravelAsValues) {
  executor_pool pool("t", 2);
  recorder_actor actor(pool.get_executor());
  EXPECT_EQ(actor.async_checked(21, asio::use_future).get(), 42);
  EXPECT_EQ(error_of(actor.async_checked(-1, asio::use_future)), make_error_code(errc::busy));
  stop_and_wait(actor);
}

TEST(StrandActor, StopCompletesAtOnceWhenIdleAndRefusesNewWork) {
  executor_pool pool("t", 2);
  recorder_actor actor(pool.get_executor());
  EXPECT_EQ(actor.async_record(1, asio::use_future).get(), 1u);
  stop_and_wait(actor);
  EXPECT_TRUE(actor.stopping());
  EXPECT_EQ(error_of(actor.async_record(2, asio::use_future)), make_error_code(errc::stopped));
  EXPECT_EQ(actor.record(3), make_error_code(errc::stopped));
  stop_and_wait(actor);  // a second stop completes too
}

TEST(StrandActor, StopDrainsPendingRepliesBeforeCompleting) {
  executor_pool pool("t", 2);
  recorder_actor actor(pool.get_executor());
  std::future<int> held = actor.async_hold(asio::use_future);
  actor.async_seen(asio::use_future).get();  // FIFO: the hold has run and kept its reply
  ASSERT_TRUE(eventually([&] { return actor.in_flight_count() == 1; }));

  std::future<void> stopped = actor.async_stop(asio::use_future);
  std::future<void> stopped_again = actor.async_stop(asio::use_future);
  while (!actor.stopping()) std::this_thread::yield();
  EXPECT_EQ(error_of(actor.async_record(1, asio::use_future)), make_error_code(errc::stopped));
  EXPECT_EQ(stopped.wait_for(50ms), std::future_status::timeout) << "stop completed with a reply pending";
  EXPECT_EQ(held.wait_for(0ms), std::future_status::timeout);

  actor.event_answer_held(5);  // in-flight work finishes while stopping
  EXPECT_EQ(held.get(), 5);
  stopped.get();
  stopped_again.get();
  EXPECT_EQ(actor.in_flight_count(), 0u);  // stop completes only after the last pass is gone
}

TEST(StrandActor, DroppedReplyCompletesWithDroppedInsteadOfHanging) {
  executor_pool pool("t", 2);
  recorder_actor actor(pool.get_executor());
  std::future<int> held = actor.async_hold(asio::use_future);
  actor.async_drop_all(asio::use_future).get();
  EXPECT_EQ(error_of(held), make_error_code(errc::dropped));
  EXPECT_TRUE(eventually([&] { return actor.in_flight_count() == 0; }));
  stop_and_wait(actor);
}

}  // namespace
