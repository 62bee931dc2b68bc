// Quantizer quality and the dot product, per type: quantize -> dequantize round trips on random
// data with per-type error bounds (tight enough that a wrong layout, a lost bit or a bad scale
// fails them: such errors are tens of percent), and vec_dot_row against a double-precision dot
// of dequantize_row's output. The measured errors are printed and recorded as test properties.
#include <cmath>
#include <cstdio>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/quant/quant.h"

namespace {

using anvil::model::ggml_type;
namespace am = anvil::model;

struct type_case {
  ggml_type type;
  double normal_bound;  // relative RMSE bound on N(0, 1) data
  double offset_bound;  // relative RMSE bound on N(2, 1) data with 1% outliers at 8x
};

std::string name_of(ggml_type t) { return std::string(am::info(t).name); }
void PrintTo(const type_case& c, std::ostream* os) { *os << name_of(c.type); }  // gtest's hook

std::vector<float> normal_data(std::int64_t n, float mean, std::uint32_t seed, bool outliers) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(mean, 1.f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<float> x(std::size_t(n), 0.f);
  for (float& v : x) v = nd(rng) * (outliers && u(rng) < 0.01f ? 8.f : 1.f);
  return x;
}

std::vector<float> round_trip(ggml_type t, const std::vector<float>& x) {
  const auto n = std::int64_t(x.size());
  std::vector<std::uint8_t> q(*am::row_bytes(t, n), 0xAA);
  am::quantize_row(t, x.data(), q.data(), n);
  std::vector<float> y(x.size(), NAN);
  am::dequantize_row(t, q.data(), y.data(), n);
  return y;
}

double relative_rmse(const std::vector<float>& x, const std::vector<float>& y) {
  double err = 0, ref = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    err += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    ref += double(x[i]) * x[i];
  }
  return std::sqrt(err / ref);
}

class QuantRoundTrip : public ::testing::TestWithParam<type_case> {};

// 64 super-blocks; every block type divides it.
constexpr std::int64_t round_trip_elems = 256 * 64;

TEST_P(QuantRoundTrip, ErrorOnNormalDataIsWithinTheTypeBound) {
  const type_case& c = GetParam();
  const std::vector<float> x = normal_data(round_trip_elems, 0.f, 1234, false);
  const double e = relative_rmse(x, round_trip(c.type, x));
  std::printf("[ round trip ] %-5s N(0,1): relative RMSE %.5f%% (bound %.3f%%)\n", name_of(c.type).c_str(),
              100 * e, 100 * c.normal_bound);
  RecordProperty("relative_rmse_normal", std::to_string(e));
  EXPECT_LE(e, c.normal_bound);
}

TEST_P(QuantRoundTrip, ErrorWithOffsetAndOutliersIsWithinTheTypeBound) {
  const type_case& c = GetParam();
  const std::vector<float> x = normal_data(round_trip_elems, 2.f, 99, true);
  const double e = relative_rmse(x, round_trip(c.type, x));
  std::printf("[ round trip ] %-5s N(2,1)+outliers: relative RMSE %.5f%% (bound %.3f%%)\n",
              name_of(c.type).c_str(), 100 * e, 100 * c.offset_bound);
  RecordProperty("relative_rmse_offset", std::to_string(e));
  EXPECT_LE(e, c.offset_bound);
}

TEST_P(QuantRoundTrip, ZeroAndConstantRowsSurvive) {
  const ggml_type t = GetParam().type;
  const std::vector<float> zeros(256, 0.f);
  for (float v : round_trip(t, zeros)) ASSERT_EQ(v, 0.f) << name_of(t);
  // A constant block is one scale (or one min) times a level: every type gets it within 1%.
  for (float c : {-3.f, 0.75f}) {
    const std::vector<float> constant(256, c);
    for (float v : round_trip(t, constant)) ASSERT_NEAR(v, c, 0.01f * std::fabs(c)) << name_of(t) << " " << c;
  }
}

TEST_P(QuantRoundTrip, QuantizingIsDeterministicAndWritesEveryByte) {
  const ggml_type t = GetParam().type;
  const std::vector<float> x = normal_data(512, 0.f, 7, false);
  std::vector<std::uint8_t> a(*am::row_bytes(t, 512), 0x00), b(a.size(), 0xFF);
  am::quantize_row(t, x.data(), a.data(), 512);
  am::quantize_row(t, x.data(), b.data(), 512);
  EXPECT_EQ(a, b);  // differing prefill would show as a difference if a byte were skipped
}

// n with a partial last chunk for the 1- and 32-element types (vec_dot_row works in 256s).
std::int64_t dot_length(ggml_type t) {
  const std::int64_t block = am::info(t).block_elems;
  return block == 1 ? 1003 : block == 32 ? 32 * 37 : 256 * 5;
}

TEST_P(QuantRoundTrip, VecDotMatchesDotOfDequantizedRow) {
  const ggml_type t = GetParam().type;
  const std::int64_t n = dot_length(t);
  const std::vector<float> w = normal_data(n, 0.1f, 5, false), x = normal_data(n, 0.f, 6, false);
  std::vector<std::uint8_t> q(*am::row_bytes(t, n));
  am::quantize_row(t, w.data(), q.data(), n);
  std::vector<float> a(static_cast<std::size_t>(n));
  am::dequantize_row(t, q.data(), a.data(), n);
  double ref = 0, mag = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ref += double(a[i]) * x[i];
    mag += std::fabs(double(a[i]) * x[i]);
  }
  const float got = am::vec_dot_row(t, q.data(), x.data(), n);
  // Relative to sum |a_i x_i|, which a cancelling sum cannot make small.
  EXPECT_LE(std::fabs(double(got) - ref), 1e-4 * mag) << name_of(t) << ": " << got << " vs " << ref;
}

TEST_P(QuantRoundTrip, RowsNeedNoAlignment) {
  // GGUF rows of 18-, 22- or 210-byte blocks start at any byte; read one at an odd address.
  const ggml_type t = GetParam().type;
  const std::int64_t n = dot_length(t);
  const std::vector<float> w = normal_data(n, 0.f, 11, false), x = normal_data(n, 0.f, 12, false);
  const std::size_t size = *am::row_bytes(t, n);
  std::vector<std::uint8_t> q(size + 1);
  am::quantize_row(t, w.data(), q.data() + 1, n);
  std::vector<std::uint8_t> aligned(q.begin() + 1, q.end());
  std::vector<float> a(static_cast<std::size_t>(n)), b(static_cast<std::size_t>(n));
  am::dequantize_row(t, q.data() + 1, a.data(), n);
  am::dequantize_row(t, aligned.data(), b.data(), n);
  EXPECT_EQ(a, b);
  EXPECT_EQ(am::vec_dot_row(t, q.data() + 1, x.data(), n), am::vec_dot_row(t, aligned.data(), x.data(), n));
}

// Bounds: about 1.3x the measured error (printed by the tests above; the data are seeded), so a
// quantizer that gets worse fails too, not only a broken one. Measured relative RMSE, N(0,1) /
// N(2,1)+outliers: F16 0.021/0.021%, BF16 0.17/0.16%, Q8_0 0.54/0.78%, Q6_K 1.8/2.4%,
// Q5_0 4.3/6.2%, Q5_1 3.8/3.2%, Q5_K 3.6/3.2%, Q4_0 8.7/12.5%, Q4_1 7.8/6.6%, Q4_K 7.2/6.4%,
// Q3_K 15.4/21.0%, Q2_K 29.9/25.8%.
INSTANTIATE_TEST_SUITE_P(AllSupportedTypes, QuantRoundTrip,
                         ::testing::Values(type_case{ggml_type::F32, 0.0, 0.0},
                                           type_case{ggml_type::F16, 0.0003, 0.0003},
                                           type_case{ggml_type::BF16, 0.0022, 0.0022},
                                           type_case{ggml_type::Q8_0, 0.007, 0.010},
                                           type_case{ggml_type::Q6_K, 0.023, 0.031},
                                           type_case{ggml_type::Q5_0, 0.055, 0.080},
                                           type_case{ggml_type::Q5_1, 0.049, 0.042},
                                           type_case{ggml_type::Q5_K, 0.047, 0.042},
                                           type_case{ggml_type::Q4_0, 0.113, 0.163},
                                           type_case{ggml_type::Q4_1, 0.102, 0.086},
                                           type_case{ggml_type::Q4_K, 0.094, 0.083},
                                           type_case{ggml_type::Q3_K, 0.20, 0.274},
                                           type_case{ggml_type::Q2_K, 0.39, 0.34},
                                           type_case{ggml_type::IQ4_NL, 0.102, 0.128},
                                           type_case{ggml_type::IQ4_XS, 0.102, 0.130},
                                           type_case{ggml_type::MXFP4, 0.150, 0.203}),
                         [](const ::testing::TestParamInfo<type_case>& p) { return name_of(p.param.type); });

TEST(Quant, EverySupportedTypeIsCoveredByTheRoundTripSuite) {
  // Keeps the instantiation above honest when a type gains support.
  int supported = 0;
  for (std::uint32_t raw = 0; raw < 64; ++raw) {
    if (const am::type_info* t = am::find_type(raw); t && t->supported) ++supported;
  }
  EXPECT_EQ(supported, 16);
}

}  // namespace
