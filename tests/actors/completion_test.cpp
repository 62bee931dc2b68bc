// Completion tokens: the same async_* call works with a callback, use_future and use_awaitable,
// and the completion runs on the caller's executor, never inside the initiating call.
#include <atomic>
#include <future>
#include <thread>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include "actors/executor_pool.h"
#include "tests/actors/recorder_actor.h"

namespace {

namespace asio = boost::asio;
using anvil::errc;
using anvil::error_code;
using anvil::actors::executor_pool;
using anvil::actors::testing::recorder_actor;

TEST(Completion, CallbackRunsOnTheExecutorItIsBoundTo) {
  executor_pool actor_pool("actor", 2);
  executor_pool caller_pool("caller", 2);
  recorder_actor actor(actor_pool.get_executor());
  auto caller_strand = asio::make_strand(caller_pool.get_executor());

  std::promise<bool> on_caller_strand, on_actor_strand;
  actor.async_record(1, asio::bind_executor(caller_strand, [&](error_code ec, std::size_t n) {
                       EXPECT_FALSE(ec);
                       EXPECT_EQ(n, 1u);
                       on_caller_strand.set_value(caller_strand.running_in_this_thread());
                       on_actor_strand.set_value(actor.get_executor().running_in_this_thread());
                     }));
  EXPECT_TRUE(on_caller_strand.get_future().get());
  EXPECT_FALSE(on_actor_strand.get_future().get());
  actor.async_stop(asio::use_future).get();
}

TEST(Completion, PlainCallbackRunsOffTheActorsStrand) {
  executor_pool pool("t", 2);
  recorder_actor actor(pool.get_executor());
  std::promise<bool> on_strand;
  actor.async_record(1, [&](error_code, std::size_t) {
    on_strand.set_value(actor.get_executor().running_in_this_thread());
  });
  EXPECT_FALSE(on_strand.get_future().get());
  actor.async_stop(asio::use_future).get();
}

TEST(Completion, RefusalIsNeverDeliveredInsideTheInitiatingCall) {
  asio::io_context ctx;
  recorder_actor actor(ctx.get_executor(), 0);  // a mailbox of zero refuses everything
  bool called = false;
  error_code got;
  actor.async_record(1, [&](error_code ec, std::size_t) {
    called = true;
    got = ec;
  });
  EXPECT_FALSE(called);
  ctx.run();
  EXPECT_TRUE(called);
  EXPECT_EQ(got, make_error_code(errc::busy));
  ctx.restart();
  actor.async_stop([](error_code) {});
  ctx.run();
}

TEST(Completion, UseFutureDeliversValuesAndThrowsErrors) {
  executor_pool pool("t", 2);
  recorder_actor actor(pool.get_executor());
  EXPECT_EQ(actor.async_record(4, asio::use_future).get(), 1u);
  EXPECT_EQ(actor.async_seen(asio::use_future).get(), std::vector<int>{4});
  actor.async_stop(asio::use_future).get();
  EXPECT_THROW(actor.async_record(5, asio::use_future).get(), boost::system::system_error);
}

TEST(Completion, UseAwaitableResumesOnTheCoroutinesExecutor) {
  executor_pool actor_pool("actor", 2);
  recorder_actor actor(actor_pool.get_executor());
  asio::io_context caller;  // run below by this thread only
  const std::thread::id caller_thread = std::this_thread::get_id();

  std::vector<std::size_t> counts;
  std::vector<bool> resumed_on_caller;
  bool refused_after_stop = false;
  asio::co_spawn(
      caller,
      [&]() -> asio::awaitable<void> {
        for (int i = 0; i < 3; ++i) {
          counts.push_back(co_await actor.async_record(i, asio::use_awaitable));
          resumed_on_caller.push_back(std::this_thread::get_id() == caller_thread);
        }
        co_await actor.async_stop(asio::use_awaitable);
        try {
          co_await actor.async_record(9, asio::use_awaitable);
        } catch (const boost::system::system_error& e) {
          refused_after_stop = e.code() == make_error_code(errc::stopped);
        }
      },
      asio::detached);
  // The caller's context has no other work: it stays alive only because each pending reply
  // tracks outstanding work on it.
  caller.run();
  EXPECT_EQ(counts, (std::vector<std::size_t>{1, 2, 3}));
  EXPECT_EQ(resumed_on_caller, (std::vector<bool>{true, true, true}));
  EXPECT_TRUE(refused_after_stop);
}

}  // namespace
