// GEMV kernel (launch_gemv) against matmul_ref for every weight type, several shapes (odd row
// counts, rows shorter and longer than a warp's stride) and every decode batch size 1..8, with
// and without bias. Outputs are poisoned and guarded. Tolerance: 1e-5 of the |W|.|x| scale of
// each output (the formats dequantize exactly; only the summation order differs). Label: gpu.
#include <cstdio>
#include <random>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/gemv.h"
#include "tests/kernels/matmul_gpu_cases.h"

namespace {

using namespace anvil::kernels;
using namespace anvil::kernels::testing;

struct gemv_case {
  ggml_type type;
  std::int64_t out, in;
  std::string str() const {
    std::ostringstream s;
    s << "gemv(" << type_name(type) << ", out=" << out << ", in=" << in << ")";
    return s.str();
  }
};

std::vector<gemv_case> gemv_cases() {
  std::vector<gemv_case> cases;
  for (ggml_type t : gpu_weight_types()) {
    const std::int64_t b = anvil::model::info(t).block_elems == 256 ? 256 : 32;
    for (auto [out, in] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {1, b}, {7, 3 * b}, {37, 4096}, {131, 2 * b}, {257, 5 * b}, {64, 896}, {5, 14336}}) {
      if (in % b != 0) continue;
      cases.push_back({t, out, in});
    }
  }
  return cases;
}

class GemvGpu : public ::testing::TestWithParam<gemv_case> {};

TEST_P(GemvGpu, MatchesCpuReferenceForEveryBatchSize) {
  require_device();
  if (HasFatalFailure()) return;  // no GPU: require_device has said so
  const gemv_case c = GetParam();
  SCOPED_TRACE(c.str());
  std::mt19937 rng(static_cast<unsigned>(c.out * 131 + c.in + int(c.type) * 7919));
  const host_weight w(c.type, c.out, c.in, rng);
  const std::vector<float> x = random_vector(std::size_t(gemv_max_tokens * c.in), rng, -2.f, 2.f);
  const std::vector<float> bias = random_vector(std::size_t(c.out), rng, -1.f, 1.f);

  device_bytes dw(w.bytes.size());
  dw.upload(w.bytes.data(), w.bytes.size());
  guarded_buffer dx(x.size()), db(bias.size());
  dx.upload(x);
  db.upload(bias);

  for (std::int64_t nt = 1; nt <= gemv_max_tokens; ++nt) {
    const bool with_bias = nt % 2 == 1;
    SCOPED_TRACE("n_tokens=" + std::to_string(nt) + (with_bias ? " bias" : ""));
    std::vector<float> ref(std::size_t(nt * c.out));
    matmul_ref({w.bytes.data(), c.type, c.in, c.out, with_bias ? bias.data() : nullptr, x.data(), ref.data(), nt});

    guarded_buffer dy(ref.size());
    dy.poison();
    ANVIL_GPU_CHECK(launch_gemv({dw.data(), c.type, c.in, c.out, with_bias ? db.data() : nullptr, dx.data(), dy.data(), nt},
                                nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    const std::vector<float> out = dy.download();
    const double err = max_scaled_error(out, ref, w, x, with_bias ? bias.data() : nullptr, nt);
    std::printf("  %-40s n_tokens=%lld%s  max scaled error %.3g\n", c.str().c_str(), static_cast<long long>(nt),
                with_bias ? " +bias" : "      ", err);
    EXPECT_LT(err, 1e-5);
    EXPECT_TRUE(dy.guards_intact());
  }
  EXPECT_TRUE(dx.guards_intact());
}

INSTANTIATE_TEST_SUITE_P(TypesAndShapes, GemvGpu, ::testing::ValuesIn(gemv_cases()),
                         [](const ::testing::TestParamInfo<gemv_case>& i) {
                           return type_name(i.param.type) + "_" + std::to_string(i.param.out) + "x" +
                                  std::to_string(i.param.in);
                         });

TEST(GemvGpuLaunch, RejectsWhatItCannotDoWithoutLaunching) {
  require_device();
  if (HasFatalFailure()) return;  // no GPU: require_device has said so
  guarded_buffer buf(4096);
  float* p = buf.data();
  const matmul_params ok{p, ggml_type::F32, 64, 8, nullptr, p + 1024, p + 2048, 1};
  auto with = [&](auto edit) {
    matmul_params q = ok;
    edit(q);
    return launch_gemv(q, nullptr);
  };
  EXPECT_EQ(with([](matmul_params& q) { q.n_tokens = 9; }), hipErrorInvalidValue);
  EXPECT_EQ(with([](matmul_params& q) { q.n_tokens = -1; }), hipErrorInvalidValue);
  EXPECT_EQ(with([](matmul_params& q) { q.in = 12; }), hipErrorInvalidValue);           // not a multiple of 8
  EXPECT_EQ(with([](matmul_params& q) { q.w_type = ggml_type::Q4_K; }), hipErrorInvalidValue);  // 64 % 256
  EXPECT_EQ(with([](matmul_params& q) { q.w_type = ggml_type::Q2_K; q.in = 256; }), hipErrorInvalidValue);
  EXPECT_EQ(with([&](matmul_params& q) { q.x = p + 1025; }), hipErrorInvalidValue);      // x misaligned
  EXPECT_EQ(with([&](matmul_params& q) { q.w = p + 1; }), hipErrorInvalidValue);         // w misaligned
  EXPECT_EQ(with([](matmul_params& q) { q.n_tokens = 0; }), hipSuccess);
  EXPECT_EQ(hipGetLastError(), hipSuccess);
  EXPECT_TRUE(buf.guards_intact());
}

}  // namespace
