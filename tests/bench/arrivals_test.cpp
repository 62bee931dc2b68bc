// Arrival times: gamma gaps with mean 1/rate (Poisson at burstiness 1), seeded.
#include "bench/load/arrivals.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace anvil::bench {
namespace {

struct gap_stats {
  double mean;  // mean gap (s)
  double cv;    // coefficient of variation of the gaps
};

gap_stats gaps_of(const std::vector<double>& t) {
  double sum = 0, sq = 0;
  const double n = double(t.size() - 1);
  for (std::size_t i = 1; i < t.size(); ++i) sum += t[i] - t[i - 1];
  const double mean = sum / n;
  for (std::size_t i = 1; i < t.size(); ++i) sq += (t[i] - t[i - 1] - mean) * (t[i] - t[i - 1] - mean);
  return {mean, std::sqrt(sq / n) / mean};
}

TEST(Arrivals, PoissonMeanRateAndSpread) {
  const auto t = arrival_offsets(100000, 20.0, 1.0, 7);
  ASSERT_EQ(t.size(), 100000u);
  EXPECT_EQ(t[0], 0.0);
  for (std::size_t i = 1; i < t.size(); ++i) ASSERT_GE(t[i], t[i - 1]);
  const auto s = gaps_of(t);
  EXPECT_NEAR(s.mean, 1.0 / 20.0, 0.02 / 20.0);  // within 2%
  EXPECT_NEAR(s.cv, 1.0, 0.03);                  // exponential gaps: cv 1
}

TEST(Arrivals, BurstinessSetsTheSpreadNotTheRate) {
  for (double b : {0.25, 4.0}) {
    const auto s = gaps_of(arrival_offsets(100000, 5.0, b, 11));
    EXPECT_NEAR(s.mean, 0.2, 0.2 * 0.03) << "burstiness " << b;
    EXPECT_NEAR(s.cv, 1.0 / std::sqrt(b), 0.05 / std::sqrt(b)) << "burstiness " << b;  // gamma: cv = 1/sqrt(k)
  }
}

TEST(Arrivals, SameSeedSameSchedule) {
  EXPECT_EQ(arrival_offsets(100, 3.0, 1.0, 42), arrival_offsets(100, 3.0, 1.0, 42));
  EXPECT_NE(arrival_offsets(100, 3.0, 1.0, 42), arrival_offsets(100, 3.0, 1.0, 43));
}

TEST(Arrivals, InfiniteRateSendsEverythingAtOnce) {
  const auto t = arrival_offsets(10, std::numeric_limits<double>::infinity(), 1.0, 0);
  EXPECT_EQ(t, std::vector<double>(10, 0.0));
}

}  // namespace
}  // namespace anvil::bench
