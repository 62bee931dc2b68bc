// The GGML block layouts, pinned: every supported type gets a block whose bytes are built here
// from ggml's format (field offsets, bit positions, biases), with the expected floats computed
// from the quants and scales by the format's formula. Scales are powers of two and quants small
// integers, so every expected value is exact and compared with ==. Also: the type table, row
// sizes, and the precondition errors.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/quant/quant.h"

namespace {

using anvil::model::ggml_type;
namespace am = anvil::model;

using bytes = std::vector<std::uint8_t>;

// Half-precision bit patterns used as block scales (all exact powers of two).
constexpr std::uint16_t h_quarter = 0x3400, h_half = 0x3800, h_one = 0x3c00, h_two = 0x4000;
constexpr std::uint16_t h_eighth = 0x3000, h_minus_one = 0xbc00;

void put_u16(bytes& b, std::size_t off, std::uint16_t v) {
  b[off] = std::uint8_t(v & 0xff);  // little-endian, as in the file
  b[off + 1] = std::uint8_t(v >> 8);
}

std::vector<float> dequantize(ggml_type t, const bytes& b, std::int64_t n) {
  EXPECT_EQ(am::row_bytes(t, n), b.size());
  std::vector<float> out(std::size_t(n), -12345.f);
  am::dequantize_row(t, b.data(), out.data(), n);
  return out;
}

void expect_all_eq(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
}

// ---- floats -------------------------------------------------------------------------------------

TEST(Quant, FloatTypesDequantizeTheirBitPatterns) {
  bytes f16(2 * 5);
  const std::uint16_t halves[] = {h_one, 0xc000 /* -2 */, 0x7bff /* 65504 */, 0x0001 /* 2^-24 */, 0x8000};
  for (int i = 0; i < 5; ++i) put_u16(f16, 2 * std::size_t(i), halves[i]);
  expect_all_eq(dequantize(ggml_type::F16, f16, 5), {1.f, -2.f, 65504.f, 0x1p-24f, -0.f});

  bytes bf16(2 * 3);
  put_u16(bf16, 0, 0x3f80);  // 1
  put_u16(bf16, 2, 0xc049);  // -3.140625
  put_u16(bf16, 4, 0x4780);  // 65536
  expect_all_eq(dequantize(ggml_type::BF16, bf16, 3), {1.f, -3.140625f, 65536.f});

  const float f32[] = {1.5f, -0.f, 3e38f};
  bytes raw(sizeof f32);
  std::memcpy(raw.data(), f32, sizeof f32);
  expect_all_eq(dequantize(ggml_type::F32, raw, 3), {1.5f, -0.f, 3e38f});
}

// ---- legacy 32-element blocks -----------------------------------------------------------------

TEST(Quant, Q8_0DequantizesAHandBuiltBlock) {
  // fp16 d, then 32 int8: value = q * d.
  bytes b(34);
  put_u16(b, 0, h_half);
  std::vector<float> want;
  for (int j = 0; j < 32; ++j) {
    const int q = j * 8 - 128;  // -128 .. 120
    b[2 + std::size_t(j)] = std::uint8_t(std::int8_t(q));
    want.push_back(float(q) * 0.5f);
  }
  expect_all_eq(dequantize(ggml_type::Q8_0, b, 32), want);
}

TEST(Quant, Q4_0DequantizesAHandBuiltBlock) {
  // fp16 d, then 16 bytes: byte j = element j (low nibble) | element j + 16 (high nibble);
  // value = (q - 8) * d.
  bytes b(18);
  put_u16(b, 0, h_quarter);
  std::vector<float> want(32);
  for (int j = 0; j < 16; ++j) {
    const int lo = j, hi = 15 - (j * 3) % 16;
    b[2 + std::size_t(j)] = std::uint8_t(lo | (hi << 4));
    want[std::size_t(j)] = float(lo - 8) * 0.25f;
    want[std::size_t(j) + 16] = float(hi - 8) * 0.25f;
  }
  expect_all_eq(dequantize(ggml_type::Q4_0, b, 32), want);
}

TEST(Quant, Q4_1DequantizesAHandBuiltBlock) {
  // fp16 d, fp16 m, 16 bytes of nibbles as Q4_0; value = q * d + m.
  bytes b(20);
  put_u16(b, 0, h_half);
  put_u16(b, 2, h_minus_one);
  std::vector<float> want(32);
  for (int j = 0; j < 16; ++j) {
    const int lo = (j * 5) % 16, hi = 15 - j;
    b[4 + std::size_t(j)] = std::uint8_t(lo | (hi << 4));
    want[std::size_t(j)] = float(lo) * 0.5f - 1.f;
    want[std::size_t(j) + 16] = float(hi) * 0.5f - 1.f;
  }
  expect_all_eq(dequantize(ggml_type::Q4_1, b, 32), want);
}

// Q5_0/Q5_1: 5-bit quants; low 4 bits as Q4_0, bit 4 of element j is bit j of a LE uint32 qh.
bytes build_q5(bool type1, const std::vector<int>& q, std::uint16_t d, std::uint16_t m) {
  const std::size_t qh_off = type1 ? 4 : 2, qs_off = qh_off + 4;
  bytes b(qs_off + 16);
  put_u16(b, 0, d);
  if (type1) put_u16(b, 2, m);
  std::uint32_t qh = 0;
  for (int j = 0; j < 32; ++j) qh |= std::uint32_t((q[std::size_t(j)] >> 4) & 1) << j;
  for (int k = 0; k < 4; ++k) b[qh_off + std::size_t(k)] = std::uint8_t(qh >> (8 * k));
  for (std::size_t j = 0; j < 16; ++j) b[qs_off + j] = std::uint8_t((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
  return b;
}

TEST(Quant, Q5_0DequantizesAHandBuiltBlock) {
  std::vector<int> q(32);
  std::vector<float> want(32);
  for (int j = 0; j < 32; ++j) {
    q[std::size_t(j)] = (j * 13 + 7) % 32;
    want[std::size_t(j)] = float(q[std::size_t(j)] - 16) * 0.5f;  // value = (q - 16) * d
  }
  expect_all_eq(dequantize(ggml_type::Q5_0, build_q5(false, q, h_half, 0), 32), want);
}

TEST(Quant, Q5_1DequantizesAHandBuiltBlock) {
  std::vector<int> q(32);
  std::vector<float> want(32);
  for (int j = 0; j < 32; ++j) {
    q[std::size_t(j)] = 31 - (j * 11) % 32;
    want[std::size_t(j)] = float(q[std::size_t(j)]) * 0.25f + 2.f;  // value = q * d + m
  }
  expect_all_eq(dequantize(ggml_type::Q5_1, build_q5(true, q, h_quarter, h_two), 32), want);
}

// ---- K-quants (256 elements) ------------------------------------------------------------------

// Q2_K/Q3_K low bits: element e = 128h + 32j + l sits in bits 2j..2j+1 of qs[32h + l].
void put_2bit(bytes& b, std::size_t qs_off, int e, int q) {
  b[qs_off + std::size_t(32 * (e / 128) + e % 32)] |= std::uint8_t((q & 3) << (2 * ((e % 128) / 32)));
}

TEST(Quant, Q2_KDequantizesAHandBuiltBlock) {
  // scales[16] (low nibble scale, high nibble min, per 16 elements), qs[64], fp16 d, fp16 dmin.
  // value = d * scale * q - dmin * min.
  bytes b(84);
  int sc[16], mn[16];
  for (int s = 0; s < 16; ++s) {
    sc[s] = (s * 7 + 1) % 16;
    mn[s] = 15 - s;
    b[std::size_t(s)] = std::uint8_t(sc[s] | (mn[s] << 4));
  }
  put_u16(b, 80, h_half);
  put_u16(b, 82, h_quarter);
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int q = (e * 5 + e / 64) % 4;
    put_2bit(b, 16, e, q);
    want[std::size_t(e)] = 0.5f * float(sc[e / 16]) * float(q) - 0.25f * float(mn[e / 16]);
  }
  expect_all_eq(dequantize(ggml_type::Q2_K, b, 256), want);
}

TEST(Quant, Q3_KDequantizesAHandBuiltBlock) {
  // hmask[32], qs[64], scales[12], fp16 d. A quant q in -4..3 is stored as q + 4: low 2 bits as
  // Q2_K, bit 2 in bit e/32 of hmask[e % 32]. Sixteen 6-bit scales stored as s + 32: low 4 bits
  // in byte s (s < 8) or the high nibble of byte s - 8, top 2 bits in bits 2*(s/4) of byte
  // 8 + s%4. value = d * s * q.
  bytes b(110);
  int sc[16];
  for (int s = 0; s < 16; ++s) {
    sc[s] = (s * 9) % 64 - 32;  // covers negative, zero and positive, all six bits
    const int u = sc[s] + 32;
    b[96 + std::size_t(s % 8)] |= std::uint8_t((u & 0xF) << (s < 8 ? 0 : 4));
    b[96 + 8 + std::size_t(s % 4)] |= std::uint8_t((u >> 4) << (2 * (s / 4)));
  }
  put_u16(b, 108, h_quarter);
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int q = (e * 3 + e / 32) % 8 - 4;
    const int u = q + 4;
    put_2bit(b, 32, e, u);
    b[std::size_t(e % 32)] |= std::uint8_t((u >> 2) << (e / 32));
    want[std::size_t(e)] = 0.25f * float(sc[e / 16]) * float(q);
  }
  expect_all_eq(dequantize(ggml_type::Q3_K, b, 256), want);
}

// Q4_K/Q5_K: eight 6-bit (scale, min) pairs in 12 bytes. Pairs 0..3: scale in bytes 0..3, min in
// bytes 4..7 (low 6 bits). Pairs 4..7: low 4 bits of scale/min in the low/high nibble of bytes
// 8..11, top 2 bits in the top 2 bits of bytes 0..3 (scale) and 4..7 (min).
void put_k4_scales(bytes& b, std::size_t off, const int* sc, const int* mn) {
  for (int j = 0; j < 4; ++j) {
    b[off + std::size_t(j)] = std::uint8_t(sc[j] | ((sc[j + 4] >> 4) << 6));
    b[off + 4 + std::size_t(j)] = std::uint8_t(mn[j] | ((mn[j + 4] >> 4) << 6));
    b[off + 8 + std::size_t(j)] = std::uint8_t((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
}
constexpr int k4_sc[8] = {1, 63, 17, 32, 5, 48, 33, 60};
constexpr int k4_mn[8] = {62, 0, 31, 16, 47, 3, 58, 21};

// Element e = 64c + 32p + l: nibble p (0 low, 1 high) of qs[32c + l]; sub-block e / 32.
void put_nibble(bytes& b, std::size_t qs_off, int e, int q) {
  b[qs_off + std::size_t(32 * (e / 64) + e % 32)] |= std::uint8_t((q & 0xF) << (((e % 64) / 32) * 4));
}

TEST(Quant, Q4_KDequantizesAHandBuiltBlock) {
  // fp16 d, fp16 dmin, scales[12], qs[128]; value = d * scale * q - dmin * min.
  bytes b(144);
  put_u16(b, 0, h_half);
  put_u16(b, 2, h_eighth);
  put_k4_scales(b, 4, k4_sc, k4_mn);
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int q = (e * 7 + e / 32) % 16;
    put_nibble(b, 16, e, q);
    want[std::size_t(e)] = 0.5f * float(k4_sc[e / 32]) * float(q) - 0.125f * float(k4_mn[e / 32]);
  }
  expect_all_eq(dequantize(ggml_type::Q4_K, b, 256), want);
}

TEST(Quant, Q5_KDequantizesAHandBuiltBlock) {
  // fp16 d, fp16 dmin, scales[12], qh[32], qs[128]: low 4 bits as Q4_K, bit 4 of element e in
  // bit e/32 of qh[e % 32]. value = d * scale * q - dmin * min.
  bytes b(176);
  put_u16(b, 0, h_quarter);
  put_u16(b, 2, h_one);
  put_k4_scales(b, 4, k4_sc, k4_mn);
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int q = (e * 11 + e / 16) % 32;
    put_nibble(b, 48, e, q);
    b[16 + std::size_t(e % 32)] |= std::uint8_t((q >> 4) << (e / 32));
    want[std::size_t(e)] = 0.25f * float(k4_sc[e / 32]) * float(q) - 1.f * float(k4_mn[e / 32]);
  }
  expect_all_eq(dequantize(ggml_type::Q5_K, b, 256), want);
}

TEST(Quant, Q6_KDequantizesAHandBuiltBlock) {
  // ql[128], qh[64], int8 scales[16], fp16 d. Element e = 128h + 32g + l (g < 4): low 4 bits in
  // ql[64h + 32(g%2) + l] (low nibble for g < 2, high for g >= 2), high 2 bits in bits 2g..2g+1
  // of qh[32h + l]. value = d * scale[e/16] * (q - 32).
  bytes b(210);
  int sc[16];
  for (int s = 0; s < 16; ++s) {
    sc[s] = s == 0 ? -128 : s == 1 ? 127 : (s * 37) % 256 - 128;
    b[192 + std::size_t(s)] = std::uint8_t(std::int8_t(sc[s]));
  }
  put_u16(b, 208, h_eighth);
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int q = (e * 29 + e / 64) % 64;
    const int h = e / 128, g = (e % 128) / 32, l = e % 32;
    b[std::size_t(64 * h + 32 * (g % 2) + l)] |= std::uint8_t((q & 0xF) << (g < 2 ? 0 : 4));
    b[128 + std::size_t(32 * h + l)] |= std::uint8_t((q >> 4) << (2 * g));
    want[std::size_t(e)] = 0.125f * float(sc[e / 16]) * float(q - 32);
  }
  expect_all_eq(dequantize(ggml_type::Q6_K, b, 256), want);
}

TEST(Quant, RowsOfSeveralBlocksDecodeBlockByBlock) {
  // Two Q8_0 blocks with different scales: the second must use its own scale and bytes.
  bytes b(68);
  put_u16(b, 0, h_one);
  put_u16(b, 34, h_two);
  for (int j = 0; j < 32; ++j) {
    b[2 + std::size_t(j)] = std::uint8_t(j);
    b[36 + std::size_t(j)] = std::uint8_t(std::int8_t(-j));
  }
  const std::vector<float> got = dequantize(ggml_type::Q8_0, b, 64);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(got[std::size_t(j)], float(j));
    EXPECT_EQ(got[32 + std::size_t(j)], -2.f * float(j));
  }
}

// ---- pinned quantizer output --------------------------------------------------------------------

TEST(Quant, Q8_0QuantizesIntegersToTheirExactBytes) {
  // absmax 127 gives d = 1 exactly, so every level is the value itself.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[std::size_t(j)] = float(j * 8 - 127);
  bytes b(34);
  am::quantize_row(ggml_type::Q8_0, x.data(), b.data(), 32);
  EXPECT_EQ(b[0] | (b[1] << 8), h_one);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(std::int8_t(b[2 + std::size_t(j)]), j * 8 - 127);
}

TEST(Quant, Q4_0QuantizesIntegersToTheirExactBytes) {
  // The largest magnitude, -8, maps to level 0 with d = 1; values -8..7 become levels 0..15.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[std::size_t(j)] = float(j % 16 - 8);
  bytes b(18);
  am::quantize_row(ggml_type::Q4_0, x.data(), b.data(), 32);
  EXPECT_EQ(b[0] | (b[1] << 8), h_one);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b[2 + std::size_t(j)], j | (j << 4)) << j;
}

// ---- non-linear 4-bit types ----------------------------------------------------------------------
constexpr int iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

TEST(Quant, Iq4NlDequantizesAHandBuiltBlock) {
  // fp16 d, 16 bytes of nibbles as Q4_0; value = d * level[q].
  bytes b(18);
  put_u16(b, 0, h_half);
  std::vector<float> want(32);
  for (int j = 0; j < 16; ++j) {
    const int lo = j, hi = 15 - (j * 5) % 16;
    b[2 + std::size_t(j)] = std::uint8_t(lo | (hi << 4));
    want[std::size_t(j)] = 0.5f * float(iq4_levels[lo]);
    want[std::size_t(j) + 16] = 0.5f * float(iq4_levels[hi]);
  }
  expect_all_eq(dequantize(ggml_type::IQ4_NL, b, 32), want);
}

TEST(Quant, Iq4XsDequantizesAHandBuiltBlock) {
  // fp16 d, uint16 scales_h (2 high bits per sub-block), 4 bytes scales_l (a nibble per
  // sub-block), 128 bytes of nibbles (16 per 32 elements, halves as Q4_0);
  // value = d * (scale - 32) * level[q].
  bytes b(136);
  put_u16(b, 0, h_eighth);
  const int scale[8] = {0, 63, 32, 33, 17, 48, 31, 5};  // 6-bit, biased by 32
  std::uint16_t scales_h = 0;
  for (int ib = 0; ib < 8; ++ib) {
    b[4 + std::size_t(ib / 2)] = std::uint8_t(b[4 + std::size_t(ib / 2)] | ((scale[ib] & 0xF) << (4 * (ib % 2))));
    scales_h = std::uint16_t(scales_h | ((scale[ib] >> 4) << (2 * ib)));
  }
  put_u16(b, 2, scales_h);
  std::vector<float> want(256);
  for (int ib = 0; ib < 8; ++ib) {
    for (int j = 0; j < 16; ++j) {
      const int lo = (j + ib) % 16, hi = (3 * j + 7 * ib) % 16;
      b[8 + std::size_t(16 * ib + j)] = std::uint8_t(lo | (hi << 4));
      want[std::size_t(32 * ib + j)] = 0.125f * float(scale[ib] - 32) * float(iq4_levels[lo]);
      want[std::size_t(32 * ib + j + 16)] = 0.125f * float(scale[ib] - 32) * float(iq4_levels[hi]);
    }
  }
  expect_all_eq(dequantize(ggml_type::IQ4_XS, b, 256), want);
}

TEST(Quant, Mxfp4DequantizesAHandBuiltBlock) {
  // One E8M0 byte e, 16 bytes of nibbles as Q4_0; value = 2^(e - 128) * (FP4 E2M1 value * 2):
  // codes 0..7 are +0, 0.5, 1, 1.5, 2, 3, 4, 6 and 8..15 their negatives.
  const float e2m1[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
  for (const int e : {0, 1, 120, 127, 128, 131, 254}) {
    bytes b(17);
    b[0] = std::uint8_t(e);
    std::vector<float> want(32);
    const double scale = std::ldexp(1.0, e - 127);  // the E2M1 values' own scale
    for (int j = 0; j < 16; ++j) {
      const int lo = j, hi = (j * 7 + 3) % 16;
      b[1 + std::size_t(j)] = std::uint8_t(lo | (hi << 4));
      want[std::size_t(j)] = float(scale * e2m1[lo]);
      want[std::size_t(j) + 16] = float(scale * e2m1[hi]);
    }
    expect_all_eq(dequantize(ggml_type::MXFP4, b, 32), want);
  }
}

// ---- type table, sizes, preconditions -----------------------------------------------------------

TEST(Quant, TypeTableMatchesGgml) {
  struct row {
    std::uint32_t raw;
    const char* name;
    std::int64_t elems;
    std::size_t bytes;
    bool supported;
  };
  const row rows[] = {
      {0, "F32", 1, 4, true},          {1, "F16", 1, 2, true},          {2, "Q4_0", 32, 18, true},
      {3, "Q4_1", 32, 20, true},       {6, "Q5_0", 32, 22, true},       {7, "Q5_1", 32, 24, true},
      {8, "Q8_0", 32, 34, true},       {9, "Q8_1", 32, 36, false},      {10, "Q2_K", 256, 84, true},
      {11, "Q3_K", 256, 110, true},    {12, "Q4_K", 256, 144, true},    {13, "Q5_K", 256, 176, true},
      {14, "Q6_K", 256, 210, true},    {15, "Q8_K", 256, 292, false},   {16, "IQ2_XXS", 256, 66, false},
      {17, "IQ2_XS", 256, 74, false},  {18, "IQ3_XXS", 256, 98, false}, {19, "IQ1_S", 256, 50, false},
      {20, "IQ4_NL", 32, 18, true},   {21, "IQ3_S", 256, 110, false},  {22, "IQ2_S", 256, 82, false},
      {23, "IQ4_XS", 256, 136, true}, {24, "I8", 1, 1, false},         {25, "I16", 1, 2, false},
      {26, "I32", 1, 4, false},        {27, "I64", 1, 8, false},        {28, "F64", 1, 8, false},
      {29, "IQ1_M", 256, 56, false},   {30, "BF16", 1, 2, true},        {34, "TQ1_0", 256, 54, false},
      {35, "TQ2_0", 256, 66, false},   {39, "MXFP4", 32, 17, true},
  };
  for (const row& r : rows) {
    const am::type_info* t = am::find_type(r.raw);
    ASSERT_NE(t, nullptr) << r.raw;
    EXPECT_EQ(t->name, r.name);
    EXPECT_EQ(t->block_elems, r.elems) << r.name;
    EXPECT_EQ(t->block_bytes, r.bytes) << r.name;
    EXPECT_EQ(t->supported, r.supported) << r.name;
    EXPECT_EQ(&am::info(ggml_type(r.raw)), t);
    EXPECT_EQ(am::has_quantizer(ggml_type(r.raw)), r.supported) << r.name;
  }
}

TEST(Quant, FindTypeReturnsNullForValuesGgufDoesNotDefine) {
  for (std::uint32_t raw : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 1000u, 0xffffffffu}) {
    EXPECT_EQ(am::find_type(raw), nullptr) << raw;
  }
  EXPECT_THROW(am::info(ggml_type(4)), std::invalid_argument);
}

TEST(Quant, RowBytesHandlesEdgeCases) {
  EXPECT_EQ(am::row_bytes(ggml_type::Q4_K, 0), 0u);
  EXPECT_EQ(am::row_bytes(ggml_type::Q4_K, 4096), 16u * 144);
  EXPECT_EQ(am::row_bytes(ggml_type::Q8_0, 96), 3u * 34);
  EXPECT_EQ(am::row_bytes(ggml_type::F16, 7), 14u);
  EXPECT_EQ(am::row_bytes(ggml_type::Q4_K, 100), std::nullopt);  // not a multiple of 256
  EXPECT_EQ(am::row_bytes(ggml_type::Q8_0, 33), std::nullopt);
  EXPECT_EQ(am::row_bytes(ggml_type::F32, -1), std::nullopt);
  EXPECT_EQ(am::row_bytes(ggml_type::Q4_K, -256), std::nullopt);
  EXPECT_EQ(am::row_bytes(ggml_type(4), 32), std::nullopt);  // unknown type
  constexpr std::int64_t max = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(am::row_bytes(ggml_type::I8, max), std::size_t(max));  // the largest that fits
  EXPECT_EQ(am::row_bytes(ggml_type::F32, max), std::nullopt);     // 4 * (2^63 - 1) overflows
  EXPECT_EQ(am::row_bytes(ggml_type::F64, std::int64_t(1) << 60), std::size_t(1) << 63);
  EXPECT_EQ(am::row_bytes(ggml_type::F64, std::int64_t(1) << 61), std::nullopt);  // 2^64
  // Under a byte per element: the largest multiple of 256 still fits.
  EXPECT_EQ(am::row_bytes(ggml_type::Q6_K, (max / 256) * 256), std::size_t(max / 256) * 210);
}

void expect_invalid(const std::function<void()>& f, const std::string& needle1, const std::string& needle2) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(needle1), std::string::npos) << what;
    EXPECT_NE(what.find(needle2), std::string::npos) << what;
  }
}

TEST(Quant, CallerBugsThrowInvalidArgumentNamingTypeAndN) {
  std::vector<float> f(512, 1.f);
  bytes b(4096);
  expect_invalid([&] { am::dequantize_row(ggml_type::Q4_K, b.data(), f.data(), 100); }, "Q4_K", "n=100");
  expect_invalid([&] { am::dequantize_row(ggml_type::Q8_0, b.data(), f.data(), -32); }, "Q8_0", "n=-32");
  expect_invalid([&] { am::dequantize_row(ggml_type::IQ2_XXS, b.data(), f.data(), 256); }, "IQ2_XXS", "n=256");
  expect_invalid([&] { am::dequantize_row(ggml_type(4), b.data(), f.data(), 32); }, "type 4", "n=32");
  expect_invalid([&] { am::quantize_row(ggml_type::Q8_K, f.data(), b.data(), 256); }, "Q8_K", "n=256");
  expect_invalid([&] { am::quantize_row(ggml_type::Q6_K, f.data(), b.data(), 300); }, "Q6_K", "n=300");
  expect_invalid([&] { (void)am::vec_dot_row(ggml_type::I32, b.data(), f.data(), 4); }, "I32", "n=4");
  expect_invalid([&] { (void)am::vec_dot_row(ggml_type::Q4_0, b.data(), f.data(), 48); }, "Q4_0", "n=48");
}

TEST(Quant, EmptyRowsTouchNoMemory) {
  // n = 0 is a valid row (a zero-sized tensor): null pointers are never dereferenced.
  for (ggml_type t : {ggml_type::F32, ggml_type::F16, ggml_type::Q8_0, ggml_type::Q4_K, ggml_type::Q6_K}) {
    EXPECT_EQ(am::vec_dot_row(t, nullptr, nullptr, 0), 0.f);
    EXPECT_NO_THROW(am::dequantize_row(t, nullptr, nullptr, 0));
    EXPECT_NO_THROW(am::quantize_row(t, nullptr, nullptr, 0));
  }
}

}  // namespace
