// RMSNorm GPU kernel against its CPU reference on random inputs of several shapes, with
// sentinels around every buffer and a poisoned output. Label: gpu.
#include <cstdio>
#include <random>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/rms_norm.h"
#include "tests/kernels/op_check.h"

namespace {

using namespace anvil::kernels;
using namespace anvil::kernels::testing;

struct rms_norm_case {
  std::int64_t rows, cols;
  float eps;
  bool in_place;      // y aliases x
  std::int64_t skew;  // element offset of x/y inside their buffers (breaks 16-byte alignment)

  std::string str() const {
    std::ostringstream s;
    s << "rms_norm(rows=" << rows << ", cols=" << cols << ", eps=" << eps << ", in_place=" << in_place
      << ", skew=" << skew << ")";
    return s.str();
  }
};

class RmsNormGpu : public ::testing::TestWithParam<rms_norm_case> {};

TEST_P(RmsNormGpu, MatchesCpuReference) {
  require_device();
  const rms_norm_case c = GetParam();
  SCOPED_TRACE(c.str());
  std::mt19937 rng(static_cast<unsigned>(c.rows * 7919 + c.cols));
  const std::size_t n = std::size_t(c.rows * c.cols);

  std::vector<float> x = random_vector(n + c.skew, rng, -3.f, 3.f);
  const std::vector<float> w = random_vector(std::size_t(c.cols), rng, 0.5f, 1.5f);

  std::vector<float> ref(n);
  rms_norm_ref(
      {.x = x.data() + c.skew, .weight = w.data(), .y = ref.data(), .rows = c.rows, .cols = c.cols, .eps = c.eps});

  guarded_buffer dx(n + c.skew), dw(std::size_t(c.cols)), dy(n + c.skew);
  dx.upload(x);
  dw.upload(w);
  dy.poison();
  float* y = c.in_place ? dx.data() + c.skew : dy.data() + c.skew;
  ANVIL_GPU_CHECK(launch_rms_norm(
      {.x = dx.data() + c.skew, .weight = dw.data(), .y = y, .rows = c.rows, .cols = c.cols, .eps = c.eps}, nullptr));
  ANVIL_GPU_CHECK(hipDeviceSynchronize());

  std::vector<float> out = c.in_place ? dx.download() : dy.download();
  out.erase(out.begin(), out.begin() + c.skew);
  const double err = nmse(out, ref);
  std::printf("  %-70s nmse=%.3g\n", c.str().c_str(), err);
  EXPECT_LT(err, 1e-10) << "nmse " << err;
  EXPECT_TRUE(dx.guards_intact());
  EXPECT_TRUE(dw.guards_intact());
  EXPECT_TRUE(dy.guards_intact());
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormGpu,
                         ::testing::Values(rms_norm_case{1, 1, 1e-6f, false, 0},
                                           rms_norm_case{1, 7, 1e-6f, false, 0},
                                           rms_norm_case{3, 64, 1e-5f, false, 0},
                                           rms_norm_case{5, 896, 1e-6f, false, 0},      // Qwen2.5-0.5B
                                           rms_norm_case{17, 4096, 1e-5f, false, 0},    // Llama 3 8B
                                           rms_norm_case{9, 4097, 1e-6f, false, 0},     // odd width
                                           rms_norm_case{64, 5120, 1e-6f, false, 0},
                                           rms_norm_case{2, 8192, 1e-5f, true, 0},      // in place
                                           rms_norm_case{4, 4096, 1e-6f, false, 1},     // misaligned
                                           rms_norm_case{300, 128, 1e-6f, true, 3}));

// Rows in groups (qwen3's Q/K norm inside fused q/k/v rows): tokens of `stride` floats, the
// normed heads at an offset inside each; both row kernels (short rows and block rows), in place.
// Everything between the groups keeps its value.
TEST(RmsNormGpuGroups, NormsOnlyTheRowsOfEachGroup) {
  require_device();
  for (const std::int64_t cols : {std::int64_t(128), std::int64_t(1024)}) {
    SCOPED_TRACE(cols);
    const std::int64_t tokens = 37, heads = 5, offset = 3 * cols, stride = 9 * cols + 4;
    std::mt19937 rng(static_cast<unsigned>(cols));
    const std::vector<float> x = random_vector(std::size_t(tokens * stride), rng, -3.f, 3.f);
    const std::vector<float> w = random_vector(std::size_t(cols), rng, 0.5f, 1.5f);
    const rms_norm_params shape{.rows = tokens * heads, .cols = cols, .eps = 1e-6f, .group_rows = heads, .group_stride = stride};
    std::vector<float> ref = x;
    rms_norm_params rp = shape;
    rp.x = ref.data() + offset, rp.weight = w.data(), rp.y = ref.data() + offset;
    rms_norm_ref(rp);
    // The reference itself: token 2's head 4 equals the contiguous op on that one row.
    std::vector<float> one(static_cast<std::size_t>(cols));
    rms_norm_ref({.x = x.data() + 2 * stride + offset + 4 * cols, .weight = w.data(), .y = one.data(), .rows = 1, .cols = cols});
    ASSERT_EQ(std::vector<float>(ref.begin() + 2 * stride + offset + 4 * cols, ref.begin() + 2 * stride + offset + 5 * cols), one);

    guarded_buffer dx(x.size()), dw(w.size());
    dx.upload(x);
    dw.upload(w);
    rms_norm_params dp = shape;
    dp.x = dx.data() + offset, dp.weight = dw.data(), dp.y = dx.data() + offset;
    ANVIL_GPU_CHECK(launch_rms_norm(dp, nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    const std::vector<float> out = dx.download();
    std::size_t outside_changed = 0;
    for (std::int64_t i = 0; i < tokens * stride; ++i) {
      const std::int64_t in_token = i % stride;
      if (in_token < offset || in_token >= offset + heads * cols) outside_changed += out[std::size_t(i)] != x[std::size_t(i)];
    }
    EXPECT_EQ(outside_changed, 0u);
    const double err = nmse(out, ref);
    EXPECT_LT(err, 1e-10) << "nmse " << err;
    EXPECT_TRUE(dx.guards_intact());
  }
  const float dummy = 0;
  EXPECT_EQ(launch_rms_norm({.x = &dummy, .weight = &dummy, .y = nullptr, .rows = 4, .cols = 8, .group_rows = 2, .group_stride = 15},
                            nullptr),
            hipErrorInvalidValue);  // groups overlap
}

TEST(RmsNormGpuLaunch, RejectsBadShapesWithoutLaunching) {
  require_device();
  const float dummy = 0;
  EXPECT_EQ(launch_rms_norm({.x = &dummy, .weight = &dummy, .y = nullptr, .rows = 1, .cols = 0, .eps = 1e-6f}, nullptr),
            hipErrorInvalidValue);
  EXPECT_EQ(
      launch_rms_norm({.x = &dummy, .weight = &dummy, .y = nullptr, .rows = -1, .cols = 4, .eps = 1e-6f}, nullptr),
      hipErrorInvalidValue);
  EXPECT_EQ(launch_rms_norm({.x = &dummy, .weight = &dummy, .y = nullptr, .rows = 0, .cols = 4, .eps = 1e-6f}, nullptr),
            hipSuccess);
  EXPECT_EQ(hipGetLastError(), hipSuccess);
}

}  // namespace
