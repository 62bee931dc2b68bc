#include "actors/log.h"

#include <gtest/gtest.h>
#include <spdlog/logger.h>

TEST(Log, NamedLoggersAreCreatedOnceAndShared) {
  auto a = anvil::log::get("sched");
  auto b = anvil::log::get("sched");
  auto c = anvil::log::get("kv");
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), c.get());
  EXPECT_EQ(a->name(), "sched");
}

TEST(Log, SetLevelAppliesToExistingAndFutureLoggers) {
  auto before = anvil::log::get("before");
  ASSERT_TRUE(anvil::log::set_level("debug"));
  EXPECT_EQ(before->level(), spdlog::level::debug);
  EXPECT_EQ(anvil::log::get("after")->level(), spdlog::level::debug);
  ASSERT_TRUE(anvil::log::set_level("off"));
  EXPECT_EQ(before->level(), spdlog::level::off);
  ASSERT_TRUE(anvil::log::set_level("info"));
}

TEST(Log, UnknownLevelIsRefusedAndChangesNothing) {
  ASSERT_TRUE(anvil::log::set_level("warn"));
  EXPECT_FALSE(anvil::log::set_level("loud"));
  EXPECT_EQ(anvil::log::get("x")->level(), spdlog::level::warn);
  ASSERT_TRUE(anvil::log::set_level("info"));
}
