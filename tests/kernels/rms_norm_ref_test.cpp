// The CPU reference is the definition the GPU kernel is tested against, so it is checked here
// against hand-computed values and the op's algebraic properties.
#include "kernels/rms_norm.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace {

using anvil::kernels::rms_norm_params;
using anvil::kernels::rms_norm_ref;

std::vector<float> run(const std::vector<float>& x, const std::vector<float>& w, std::int64_t rows, float eps) {
  std::vector<float> y(x.size(), NAN);
  rms_norm_ref(
      {.x = x.data(), .weight = w.data(), .y = y.data(), .rows = rows, .cols = std::int64_t(w.size()), .eps = eps});
  return y;
}

TEST(RmsNormRef, MatchesHandComputedValues) {
  // mean(1,4,9,16) = 7.5; 1/sqrt(7.5) = 0.365148...
  const std::vector<float> y = run({1, 2, 3, 4}, {1, 1, 2, 0.5f}, 1, 0.f);
  const float s = 1.f / std::sqrt(7.5f);
  EXPECT_NEAR(y[0], 1 * s, 1e-6);
  EXPECT_NEAR(y[1], 2 * s, 1e-6);
  EXPECT_NEAR(y[2], 3 * s * 2, 1e-6);
  EXPECT_NEAR(y[3], 4 * s * 0.5f, 1e-6);
}

TEST(RmsNormRef, EpsKeepsAZeroRowFinite) {
  const std::vector<float> y = run({0, 0, 0}, {1, 1, 1}, 1, 1e-6f);
  for (float v : y) EXPECT_EQ(v, 0.f);
}

TEST(RmsNormRef, RowsAreIndependentAndScaleInvariant) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  const int cols = 37;
  std::vector<float> x(2 * cols), w(cols);
  for (auto& v : x) v = nd(rng);
  for (auto& v : w) v = nd(rng);
  // Row 1 is row 0 times 8: with eps = 0 the outputs must agree.
  for (int c = 0; c < cols; ++c) x[cols + c] = 8.f * x[c];
  const std::vector<float> y = run(x, w, 2, 0.f);
  for (int c = 0; c < cols; ++c) EXPECT_NEAR(y[c], y[cols + c], 1e-5f * std::abs(y[c]) + 1e-7f);
  // Output rows have unit RMS before the gain.
  double ss = 0;
  for (int c = 0; c < cols; ++c) ss += double(y[c] / w[c]) * double(y[c] / w[c]);
  EXPECT_NEAR(ss / cols, 1.0, 1e-4);
}

TEST(RmsNormRef, WorksInPlace) {
  std::vector<float> x = {3, 4}, w = {1, 1};
  rms_norm_ref({.x = x.data(), .weight = w.data(), .y = x.data(), .rows = 1, .cols = 2, .eps = 0.f});
  // rms = sqrt(12.5)
  EXPECT_NEAR(x[0], 3 / std::sqrt(12.5f), 1e-6);
  EXPECT_NEAR(x[1], 4 / std::sqrt(12.5f), 1e-6);
}

// Rows in groups (Q/K norm inside fused q/k/v rows): two tokens of 7 floats, two rows of 2 at
// offset 1 of each; the rest of each token is left alone.
TEST(RmsNormRef, GroupedRowsSkipWhatLiesBetweenTheGroups) {
  std::vector<float> x = {9, 3, 4, 6, 8, 9, 9, 9, 1, 1, 2, 2, 9, 9};
  const std::vector<float> w = {1, 1};
  rms_norm_ref({.x = x.data() + 1, .weight = w.data(), .y = x.data() + 1, .rows = 4, .cols = 2, .eps = 0.f,
                .group_rows = 2, .group_stride = 7});
  const float a = 1 / std::sqrt(12.5f), b = 1 / std::sqrt(50.f);  // rows (3, 4) and (6, 8); (1, 1) and (2, 2) give 1s
  const std::vector<float> want = {9, 3 * a, 4 * a, 6 * b, 8 * b, 9, 9, 9, 1, 1, 1, 1, 9, 9};
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], want[i], 1e-6) << i;
}

TEST(RmsNormRef, ZeroRowsWritesNothing) {
  std::vector<float> y = {42.f};
  const float x = 1.f, w = 1.f;
  rms_norm_ref({.x = &x, .weight = &w, .y = y.data(), .rows = 0, .cols = 1, .eps = 0.f});
  EXPECT_EQ(y[0], 42.f);
}

}  // namespace
