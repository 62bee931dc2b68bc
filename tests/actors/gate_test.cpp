#include "actors/gate.h"

#include <atomic>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

using anvil::actors::gate;

TEST(Gate, EntersAndLeavesWhileOpen) {
  gate g;
  EXPECT_TRUE(g.try_enter());
  EXPECT_TRUE(g.try_enter());
  EXPECT_EQ(g.in_flight(), 2u);
  EXPECT_FALSE(g.leave());  // not closed: no drain to report
  EXPECT_FALSE(g.leave());
  EXPECT_EQ(g.in_flight(), 0u);
  EXPECT_FALSE(g.is_closed());
}

TEST(Gate, CloseWhenIdleReportsDrainedAtOnce) {
  gate g;
  EXPECT_TRUE(g.close());
  EXPECT_TRUE(g.is_closed());
  EXPECT_FALSE(g.try_enter());
  EXPECT_TRUE(g.close());  // idempotent
}

TEST(Gate, WorkInFlightMayBringMoreWorkIntoADrainingGateButNotIntoADrainedOne) {
  gate g;
  ASSERT_TRUE(g.try_enter());
  EXPECT_FALSE(g.close());
  EXPECT_FALSE(g.try_enter());           // nothing new from outside
  EXPECT_TRUE(g.try_enter_undrained());  // but the work in flight may start more
  EXPECT_FALSE(g.leave());               // the close now waits for that too
  EXPECT_TRUE(g.leave());
  EXPECT_FALSE(g.try_enter_undrained());  // drained: nothing joins any more
  EXPECT_EQ(g.in_flight(), 0u);
  gate open;
  EXPECT_TRUE(open.try_enter_undrained());
  EXPECT_FALSE(open.leave());
}

TEST(Gate, LastLeaveAfterCloseReportsDrain) {
  gate g;
  ASSERT_TRUE(g.try_enter());
  ASSERT_TRUE(g.try_enter());
  EXPECT_FALSE(g.close());
  EXPECT_FALSE(g.try_enter());
  EXPECT_FALSE(g.leave());
  EXPECT_TRUE(g.leave());
  EXPECT_EQ(g.in_flight(), 0u);
}

// Many threads enter and leave while one closes: exactly one party observes the drain (the
// close itself or one leave), and no enter succeeds after the close.
TEST(Gate, ExactlyOneDrainUnderContention) {
  for (int round = 0; round < 50; ++round) {
    gate g;
    std::atomic<int> drains{0};
    std::atomic<bool> closed{false};
    std::atomic<int> entered_after_close{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 500; ++i) {
          const bool was_closed = closed.load();
          if (!g.try_enter()) continue;
          if (was_closed) entered_after_close++;
          if (g.leave()) drains++;
        }
      });
    }
    std::this_thread::yield();
    if (g.close()) drains++;
    closed = true;
    for (auto& th : threads) th.join();
    EXPECT_EQ(drains.load(), 1) << "round " << round;
    EXPECT_EQ(entered_after_close.load(), 0) << "round " << round;
    EXPECT_EQ(g.in_flight(), 0u);
  }
}
