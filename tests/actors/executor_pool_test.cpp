#include "actors/executor_pool.h"

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include <boost/asio/post.hpp>
#include <gtest/gtest.h>

namespace {

namespace asio = boost::asio;
using anvil::actors::executor_pool;

std::string current_thread_name() {
  char buf[16] = {};
  pthread_getname_np(pthread_self(), buf, sizeof buf);
  return buf;
}

TEST(ExecutorPool, JoinRunsAllQueuedWorkOnTheNamedThreads) {
  std::atomic<int> done{0};
  std::mutex mu;
  std::set<std::string> names;
  {
    executor_pool pool("work", 3);
    EXPECT_EQ(pool.size(), 3u);
    for (int i = 0; i < 300; ++i) {
      asio::post(pool.get_executor(), [&] {
        {
          std::lock_guard lock(mu);
          names.insert(current_thread_name());
        }
        done++;
      });
    }
    pool.join();
    EXPECT_EQ(done.load(), 300);
  }
  ASSERT_FALSE(names.empty());
  for (const auto& n : names) EXPECT_TRUE(n.rfind("work-", 0) == 0) << n;
}

TEST(ExecutorPool, ZeroThreadsMeansOne) {
  executor_pool pool("one", 0);
  EXPECT_EQ(pool.size(), 1u);
}

TEST(ExecutorPool, SurvivesAHandlerThatThrows) {
  executor_pool pool("t", 1);
  std::atomic<bool> after{false};
  asio::post(pool.get_executor(), [] { throw std::runtime_error("bad message"); });
  asio::post(pool.get_executor(), [&] { after = true; });
  pool.join();
  EXPECT_TRUE(after.load());
}

TEST(ExecutorPool, StopAbandonsQueuedWork) {
  executor_pool pool("t", 1);
  std::atomic<bool> gate_open{false};
  std::atomic<int> ran{0};
  asio::post(pool.get_executor(), [&] {
    while (!gate_open) std::this_thread::yield();
    ran++;
  });
  for (int i = 0; i < 100; ++i) asio::post(pool.get_executor(), [&] { ran++; });
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate_open = true;
  });
  pool.stop();
  opener.join();
  EXPECT_LT(ran.load(), 101);
}

// A pool whose threads poll for a while before sleeping (idle spin) runs work that arrives
// while they poll and work that arrives after they went to sleep, lets a throwing handler pass,
// and ends on join() and on stop() without waiting out the spin.
TEST(ExecutorPool, SpinningThreadsRunWorkArrivingWhilePollingOrAsleep) {
  executor_pool pool("spin", 2, std::chrono::microseconds(3000));
  for (const auto pause : {std::chrono::milliseconds(0), std::chrono::milliseconds(20)}) {
    std::this_thread::sleep_for(pause);  // 20 ms: past the spin, the threads sleep
    std::promise<void> ran;
    asio::post(pool.get_executor(), [] { throw std::runtime_error("bad message"); });
    asio::post(pool.get_executor(), [&] { ran.set_value(); });
    EXPECT_EQ(ran.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready)
        << "after a pause of " << pause.count() << " ms";
  }
  std::atomic<int> done{0};
  for (int i = 0; i < 200; ++i) asio::post(pool.get_executor(), [&] { done++; });
  pool.join();
  EXPECT_EQ(done.load(), 200);
}

TEST(ExecutorPool, StopEndsASpinningPoolAtOnce) {
  executor_pool pool("spin", 2, std::chrono::seconds(60));
  std::promise<void> ran;
  asio::post(pool.get_executor(), [&] { ran.set_value(); });
  ran.get_future().wait();
  const auto t0 = std::chrono::steady_clock::now();
  pool.stop();  // the threads are polling, with a minute of spin left
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
}

}  // namespace
