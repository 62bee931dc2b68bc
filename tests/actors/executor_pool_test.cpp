#include "actors/executor_pool.h"

#include <pthread.h>

#include <atomic>
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

}  // namespace
