// The 8-bit KV cache formats (kernels/kv_quant.h): the E4M3 codec against its definition over
// every code, the halves the attention kernels decode through, rounding and saturation, one row's
// error bound, and the CPU cache written and read through the paged layout.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention.h"
#include "kernels/kv_quant.h"
#include "tests/random_data.h"

namespace {

using namespace anvil::kernels;
using anvil::test_support::randn;

// E4M3 by its definition: (-1)^s 2^(e-7) (1 + m/8), subnormal 2^-6 (m/8), e=15 m=7 NaN.
double e4m3_value(int b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

TEST(KvQuant, Fp8DecodesEveryCodeByItsDefinitionAndEncodesItBack) {
  for (int b = 0; b < 256; ++b) {
    const float x = fp8_e4m3_decode(std::uint8_t(b));
    if ((b & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(x)) << "code " << b;
      continue;
    }
    EXPECT_EQ(double(x), e4m3_value(b)) << "code " << b;
    if (b == 0x80) continue;  // -0 encodes as -0, equal to +0: checked by value below
    EXPECT_EQ(fp8_e4m3_encode(x), b) << "code " << b << " value " << x;
  }
  EXPECT_EQ(fp8_e4m3_decode(0x7E), 448.f);
  EXPECT_EQ(fp8_e4m3_decode(0x01), std::ldexp(1.f, -9));
}

TEST(KvQuant, Fp8RoundsToTheNearestCodeTiesToEvenAndSaturates) {
  // Between 1 (0x38) and 1.125 (0x39): the midpoint goes to the even mantissa (1), just above it up.
  EXPECT_EQ(fp8_e4m3_encode(1.0625f), 0x38);
  EXPECT_EQ(fp8_e4m3_encode(1.0626f), 0x39);
  EXPECT_EQ(fp8_e4m3_encode(1.1875f), 0x3A);  // midpoint of 1.125 and 1.25: to 1.25 (even)
  EXPECT_EQ(fp8_e4m3_encode(-1.0626f), 0xB9);
  EXPECT_EQ(fp8_e4m3_encode(1e9f), 0x7E);      // saturates at 448, never NaN
  EXPECT_EQ(fp8_e4m3_encode(-460.f), 0xFE);
  EXPECT_EQ(fp8_e4m3_encode(std::ldexp(1.f, -11)), 0x00);  // a quarter of the smallest step: 0
  EXPECT_EQ(fp8_e4m3_encode(std::ldexp(1.f, -10) * 3.f), 0x02);  // 1.5 steps: ties to even (2)
  EXPECT_EQ(fp8_e4m3_encode(0.015625f - std::ldexp(1.f, -11)), 0x08);  // the subnormal rounding up to 2^-6
  EXPECT_EQ(fp8_e4m3_encode(std::numeric_limits<float>::quiet_NaN()) & 0x7F, 0x7F);
  // The nearest code, found by search, for many values.
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-500.f, 500.f);
  for (int i = 0; i < 20000; ++i) {
    const float x = i % 2 ? d(rng) : d(rng) / 1000.f;
    const std::uint8_t c = fp8_e4m3_encode(x);
    const double err = std::abs(e4m3_value(c) - double(x));
    for (int b = 0; b < 256; ++b) {
      if ((b & 0x7F) == 0x7F) continue;
      ASSERT_LE(err, std::abs(e4m3_value(b) - double(x))) << "x=" << x << " code " << int(c) << " but " << b << " is nearer";
    }
  }
}

// IEEE binary16 by its definition (finite values).
double half_value(std::uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  const double mag = e == 0 ? std::ldexp(m / 1024.0, -14) : std::ldexp(1.0 + m / 1024.0, e - 15);
  return s ? -mag : mag;
}

TEST(KvQuant, TheKernelsHalfDecodeOfFp8IsExact) {
  for (std::uint32_t w = 0; w < 256; w += 1) {
    if ((w & 0x7F) == 0x7F) continue;
    const std::uint32_t word = w | ((w ^ 0x80u) << 8) | (((w + 1) & 0xFFu) << 16) | (0x38u << 24);
    std::uint32_t lo = 0, hi = 0;
    fp8x4_to_half2x2(word, lo, hi);
    const std::uint8_t codes[4] = {std::uint8_t(w), std::uint8_t(w ^ 0x80u), std::uint8_t(w + 1), 0x38};
    const std::uint16_t halves[4] = {std::uint16_t(lo), std::uint16_t(lo >> 16), std::uint16_t(hi), std::uint16_t(hi >> 16)};
    for (int i = 0; i < 4; ++i) {
      if ((codes[i] & 0x7F) == 0x7F) continue;
      EXPECT_EQ(half_value(halves[i]) * fp8_half_decode_factor, double(fp8_e4m3_decode(codes[i])))
          << "code " << int(codes[i]);
    }
  }
}

TEST(KvQuant, Int8RowsRoundToNearestWithTheScaleFromTheirLargestMagnitude) {
  const float x[4] = {-2.54f, 1.f, 0.004f, 0.5f};
  std::uint8_t c[4];
  const float scale = kv_quantize_row(x, 4, kv_dtype::int8, c);
  EXPECT_FLOAT_EQ(scale, 2.54f / 127.f);
  EXPECT_EQ(std::int8_t(c[0]), -127);
  EXPECT_EQ(std::int8_t(c[1]), 50);
  EXPECT_EQ(std::int8_t(c[2]), 0);
  EXPECT_EQ(std::int8_t(c[3]), 25);
  const float zeros[3] = {0.f, -0.f, 0.f};
  EXPECT_EQ(kv_quantize_row(zeros, 3, kv_dtype::fp8, c), 0.f);
  EXPECT_EQ(c[0] & 0x7F, 0);
  const float with_nan[3] = {1.f, NAN, 2.f};
  EXPECT_TRUE(std::isnan(kv_quantize_row(with_nan, 3, kv_dtype::int8, c))) << "a NaN must not be hidden";
}

TEST(KvQuant, ARowReadsBackWithinHalfAStepOfItsCodes) {
  for (const kv_dtype t : {kv_dtype::int8, kv_dtype::fp8}) {
    const std::vector<float> x = randn(128, 3, 4.f);
    std::vector<std::uint8_t> c(x.size());
    const float scale = kv_quantize_row(x.data(), 128, t, c.data());
    double amax = 0, sq_err = 0, sq = 0;
    for (float v : x) amax = std::max(amax, double(std::abs(v)));
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double back = double(kv_decode(c[i], t)) * scale, err = std::abs(back - x[i]);
      // int8: half a step of amax / 127; fp8: half a step of the binade, at most 1/16 relative, or
      // half the subnormal step.
      const double bound = t == kv_dtype::int8 ? 0.5 * amax / 127 + 1e-6
                                               : std::max(std::abs(double(x[i])) / 16, 0.5 * std::ldexp(scale, -9)) + 1e-6;
      EXPECT_LE(err, bound) << kv_dtype_name(t) << " i=" << i << " x=" << x[i];
      sq_err += err * err;
      sq += double(x[i]) * x[i];
    }
    std::printf("  %s row of N(0, 16): relative RMS error %.4f\n", std::string(kv_dtype_name(t)).c_str(), std::sqrt(sq_err / sq));
  }
}

TEST(KvQuant, NamesParseBackAndOthersAreRefused) {
  for (const kv_dtype t : {kv_dtype::f16, kv_dtype::int8, kv_dtype::fp8}) EXPECT_EQ(parse_kv_dtype(kv_dtype_name(t)), t);
  EXPECT_FALSE(parse_kv_dtype("fp16"));
  EXPECT_FALSE(parse_kv_dtype("q8_0"));
  EXPECT_FALSE(parse_kv_dtype(""));
  EXPECT_EQ(kv_row_bytes_device(kv_dtype::f16, 128), 256);
  EXPECT_EQ(kv_row_bytes_device(kv_dtype::fp8, 128), 132);
}

// The CPU cache in 8 bits: rows written through the block table read back as their codes times
// their scales, and attention over them stays close to attention over the exact values.
TEST(KvQuant, AttentionOverAn8BitCpuCacheStaysCloseToTheExactOne) {
  const std::int64_t kvh = 2, heads = 8, dim = 64, bs = 4, nblocks = 9, n = 29;
  const std::int32_t table[] = {7, 1, 4, 0, 8, 2, 5, 3};
  std::vector<std::int64_t> slots;
  for (std::int64_t p = 0; p < n; ++p) slots.push_back(table[p / bs] * bs + p % bs);
  const auto k = randn(std::size_t(n * kvh * dim), 11, 2.f), v = randn(std::size_t(n * kvh * dim), 12);
  const auto q = randn(std::size_t(n * heads * dim), 13);
  const attention_seq seq{0, n, 0, table};

  std::vector<float> kc(std::size_t(nblocks * bs * kvh * dim)), vc(kc.size());
  const paged_kv_view exact{.k = kc.data(), .v = vc.data(), .n_blocks = nblocks, .block_size = bs, .n_kv_heads = kvh, .head_dim = dim};
  kv_write_ref({.cache = exact, .k = k.data(), .v = v.data(), .slots = slots.data(), .n_tokens = n});
  std::vector<float> want(q.size());
  attention_ref({.q = q.data(), .out = want.data(), .n_heads = heads, .cache = exact, .scale = 0.125f, .seqs = std::span(&seq, 1)});

  for (const kv_dtype t : {kv_dtype::int8, kv_dtype::fp8}) {
    std::vector<std::uint8_t> k8(kc.size(), 0xAB), v8(kc.size(), 0xAB);
    std::vector<float> ks(std::size_t(nblocks * bs * kvh), -1.f), vs(ks.size(), -1.f);
    const paged_kv_view c8{.n_blocks = nblocks,
                           .block_size = bs,
                           .n_kv_heads = kvh,
                           .head_dim = dim,
                           .dtype = t,
                           .k8 = k8.data(),
                           .v8 = v8.data(),
                           .k_scales = ks.data(),
                           .v_scales = vs.data()};
    kv_write_ref({.cache = c8, .k = k.data(), .v = v.data(), .slots = slots.data(), .n_tokens = n});
    // Each written row holds its codes and scale; slots of the unused block 6 are untouched.
    std::vector<float> row(dim);
    for (std::int64_t p = 0; p < n; ++p) {
      for (std::int64_t h = 0; h < kvh; ++h) {
        std::vector<std::uint8_t> codes(dim);
        const float scale = kv_quantize_row(k.data() + (p * kvh + h) * dim, dim, t, codes.data());
        EXPECT_EQ(ks[std::size_t(slots[std::size_t(p)] * kvh + h)], scale);
        kv_read_row(c8, false, slots[std::size_t(p)], h, row.data());
        for (std::int64_t i = 0; i < dim; ++i) ASSERT_EQ(row[std::size_t(i)], kv_decode(codes[std::size_t(i)], t) * scale);
      }
    }
    for (std::int64_t s = 6 * bs * kvh; s < 7 * bs * kvh; ++s) EXPECT_EQ(ks[std::size_t(s)], -1.f);
    std::vector<float> got(q.size());
    attention_ref({.q = q.data(), .out = got.data(), .n_heads = heads, .cache = c8, .scale = 0.125f, .seqs = std::span(&seq, 1)});
    double err = 0, ref = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      err += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
      ref += double(want[i]) * want[i];
    }
    const double nmse = err / ref;
    std::printf("  attention over an %s cache: nmse %.3g against the exact cache\n", std::string(kv_dtype_name(t)).c_str(), nmse);
    EXPECT_LT(nmse, t == kv_dtype::int8 ? 3e-4 : 5e-3) << kv_dtype_name(t);
    EXPECT_GT(nmse, 0.) << "an 8-bit cache that is exact is not 8 bits";
  }
}

}  // namespace
