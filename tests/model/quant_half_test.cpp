// Half-precision conversions: every binary16 and bfloat16 bit pattern decodes to the value its
// fields define and encodes back to itself; float -> half rounds to nearest, ties to even, at
// every tie point of the format, overflows to infinity and keeps NaNs NaN.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "model/quant/quant.h"

namespace {

namespace am = anvil::model;

float bits_f(std::uint32_t b) { return std::bit_cast<float>(b); }

// The value of a binary16 pattern from its fields, in double.
double half_value(std::uint16_t h) {
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  const double mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return (h & 0x8000) ? -mag : mag;
}

TEST(Quant, F16DecodesAndRoundTripsAllBitPatterns) {
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto h = std::uint16_t(i);
    const float f = am::f16_to_f32(h);
    const bool inf_nan = (h & 0x7c00) == 0x7c00;
    if (inf_nan && (h & 0x3ff)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      ASSERT_EQ(std::signbit(f), bool(h & 0x8000)) << std::hex << i;
    } else if (inf_nan) {
      ASSERT_EQ(f, (h & 0x8000) ? -INFINITY : INFINITY) << std::hex << i;
    } else {
      ASSERT_EQ(double(f), half_value(h)) << std::hex << i;
      ASSERT_EQ(std::signbit(f), bool(h & 0x8000)) << std::hex << i;  // -0 stays -0
    }
    // NaN payloads fit in float, so even NaNs come back bit for bit.
    ASSERT_EQ(am::f32_to_f16(f), h) << std::hex << i;
  }
}

TEST(Quant, F32ToF16RoundsEveryTieToEven) {
  // Between each pair of adjacent positive finite halves (and from the largest to 2^16): the
  // exact midpoint goes to the even one, a float ulp either side to the nearer one.
  for (std::uint32_t h = 0; h < 0x7c00; ++h) {
    const double lo = half_value(std::uint16_t(h));
    const double hi = h == 0x7bff ? 65536.0 : half_value(std::uint16_t(h + 1));
    const auto mid = float((lo + hi) / 2);  // exact: needs 12 significant bits
    ASSERT_EQ(double(mid), (lo + hi) / 2);
    const std::uint16_t even = (h & 1) ? std::uint16_t(h + 1) : std::uint16_t(h);  // 0x7c00 = inf
    ASSERT_EQ(am::f32_to_f16(mid), even) << std::hex << h;
    ASSERT_EQ(am::f32_to_f16(std::nextafter(mid, 0.f)), h) << std::hex << h;
    ASSERT_EQ(am::f32_to_f16(std::nextafter(mid, INFINITY)), h + 1) << std::hex << h;
    ASSERT_EQ(am::f32_to_f16(-mid), even | 0x8000) << std::hex << h;
  }
}

TEST(Quant, F32ToF16HandlesOverflowSubnormalsAndNaN) {
  EXPECT_EQ(am::f32_to_f16(1.f), 0x3c00);
  EXPECT_EQ(am::f32_to_f16(65504.f), 0x7bff);
  EXPECT_EQ(am::f32_to_f16(65519.99f), 0x7bff);
  EXPECT_EQ(am::f32_to_f16(65520.f), 0x7c00);  // the tie above the largest half: to infinity
  EXPECT_EQ(am::f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(am::f32_to_f16(-std::numeric_limits<float>::max()), 0xfc00);
  EXPECT_EQ(am::f32_to_f16(INFINITY), 0x7c00);
  EXPECT_EQ(am::f32_to_f16(-INFINITY), 0xfc00);
  EXPECT_EQ(am::f32_to_f16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(am::f32_to_f16(0x1p-25f), 0x0000);  // tie with zero: to even
  EXPECT_EQ(am::f32_to_f16(-0x1.000002p-25f), 0x8001);
  EXPECT_EQ(am::f32_to_f16(0x1p-14f), 0x0400);  // smallest normal
  EXPECT_EQ(am::f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400);  // tie, largest subnormal is odd
  EXPECT_EQ(am::f32_to_f16(1e-30f), 0x0000);
  EXPECT_EQ(am::f32_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(am::f32_to_f16(-0.f), 0x8000);
  for (std::uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7fffffffu}) {
    const std::uint16_t h = am::f32_to_f16(bits_f(nan));
    EXPECT_EQ(h & 0x7c00, 0x7c00) << std::hex << nan;
    EXPECT_NE(h & 0x3ff, 0) << std::hex << nan;  // NaN, not infinity
    EXPECT_EQ(bool(h & 0x8000), bool(nan >> 31)) << std::hex << nan;
  }
}

TEST(Quant, F32ToF16PicksTheNearestHalfForRandomFloats) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> mag(-26.f, 17.f);  // log2 of |x|: subnormals to overflow
  for (int i = 0; i < 200000; ++i) {
    const float f = std::exp2(mag(rng)) * ((i & 1) ? -1.f : 1.f);
    const std::uint16_t h = am::f32_to_f16(f);
    if ((h & 0x7fff) == 0x7c00) {
      ASSERT_GE(std::fabs(f), 65520.f);
      continue;
    }
    const double err = std::fabs(half_value(h) - f);
    for (int step : {-1, 1}) {
      const std::uint16_t mag_bits = std::uint16_t((h & 0x7fff) + step);
      if ((h & 0x7fff) == 0 && step < 0) continue;
      const std::uint16_t nb = std::uint16_t((h & 0x8000) | mag_bits);
      if ((nb & 0x7fff) >= 0x7c00) continue;
      ASSERT_LE(err, std::fabs(half_value(nb) - f)) << f;
    }
  }
}

TEST(Quant, Bf16DecodesAndRoundTripsAllBitPatterns) {
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto h = std::uint16_t(i);
    const float f = am::bf16_to_f32(h);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f), i << 16);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(am::bf16_to_f32(am::f32_to_bf16(f)))) << std::hex << i;
    } else {
      ASSERT_EQ(am::f32_to_bf16(f), h) << std::hex << i;
    }
  }
}

TEST(Quant, F32ToBf16RoundsToNearestEven) {
  EXPECT_EQ(am::f32_to_bf16(bits_f(0x3f808000)), 0x3f80);  // tie, 0x3f80 even
  EXPECT_EQ(am::f32_to_bf16(bits_f(0x3f818000)), 0x3f82);  // tie, 0x3f81 odd: up
  EXPECT_EQ(am::f32_to_bf16(bits_f(0x3f808001)), 0x3f81);  // above the tie
  EXPECT_EQ(am::f32_to_bf16(bits_f(0x3f807fff)), 0x3f80);  // below the tie
  EXPECT_EQ(am::f32_to_bf16(bits_f(0xbf818000)), 0xbf82);  // sign does not change the rule
  EXPECT_EQ(am::f32_to_bf16(bits_f(0x00008000)), 0x0000);  // subnormal tie to zero
  EXPECT_EQ(am::f32_to_bf16(bits_f(0x00018000)), 0x0002);  // subnormal tie, odd: up
  EXPECT_EQ(am::f32_to_bf16(bits_f(0x007fffff)), 0x0080);  // largest subnormal to smallest normal
  EXPECT_EQ(am::f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // past the last tie: inf
  EXPECT_EQ(am::f32_to_bf16(bits_f(0x7f7f7fff)), 0x7f7f);
  EXPECT_EQ(am::f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(am::f32_to_bf16(-INFINITY), 0xff80);
  for (std::uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    const std::uint16_t h = am::f32_to_bf16(bits_f(nan));
    EXPECT_TRUE(std::isnan(am::bf16_to_f32(h))) << std::hex << nan;  // never rounds to infinity
    EXPECT_EQ(bool(h & 0x8000), bool(nan >> 31)) << std::hex << nan;
  }
}

}  // namespace
