// The KV cache's element types and the 8-bit row format, shared by the CPU reference and the GPU
// kernels (the functions here compile for both; the host and the device give the same bits).
//
// f16  — the default: IEEE half on the GPU; the CPU reference keeps the exact f32.
// int8 — symmetric int8 codes, one f32 scale per row: x ~ code * scale, scale = amax / 127.
// fp8  — FP8 E4M3 (no infinities; ±448 the largest finite) codes, one f32 scale per row:
//        x ~ e4m3(code) * scale, scale = amax / 448.
// A row is one token's one KV head (head_dim values) of K or of V; its scale is computed when the
// row is written, from the row itself, so no calibration is needed and an outlier costs only its
// own row precision. Scales sit beside the codes, [slot][kv head] floats per layer: 4 bytes per
// row, so an 8-bit block of head_dim 128 takes 132 bytes per row where f16 takes 256.
// Rounding is to nearest, ties to even; codes saturate at ±127 / ±448. A row holding a NaN gets
// a NaN scale, so it reads back as NaN, as the f16 cache would give it.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>

#include "kernels/host_device.h"

namespace anvil::kernels {

enum class kv_dtype : std::uint8_t { f16, int8, fp8 };

constexpr std::string_view kv_dtype_name(kv_dtype t) {
  return t == kv_dtype::int8 ? "int8" : t == kv_dtype::fp8 ? "fp8" : "f16";
}
inline std::optional<kv_dtype> parse_kv_dtype(std::string_view name) {  // "f16", "int8", "fp8"
  for (const kv_dtype t : {kv_dtype::f16, kv_dtype::int8, kv_dtype::fp8}) {
    if (name == kv_dtype_name(t)) return t;
  }
  return std::nullopt;
}

inline constexpr bool kv_is_8bit(kv_dtype t) { return t != kv_dtype::f16; }

// Bytes of one element in the GPU cache (a code, or a half), and of one row of K (or V): its
// elements plus, for 8 bits, its scale.
inline constexpr std::int64_t kv_elem_bytes_device(kv_dtype t) { return kv_is_8bit(t) ? 1 : 2; }
inline constexpr std::int64_t kv_row_bytes_device(kv_dtype t, std::int64_t head_dim) {
  return head_dim * kv_elem_bytes_device(t) + (kv_is_8bit(t) ? std::int64_t(sizeof(float)) : 0);
}

// The largest code magnitude: what amax maps to.
ANVIL_HOST_DEVICE inline float kv_code_max(kv_dtype t) { return t == kv_dtype::fp8 ? 448.f : 127.f; }

// E4M3 (bias 7, 3 mantissa bits, subnormals, no infinities) of x, saturating at ±448.
ANVIL_HOST_DEVICE inline std::uint8_t fp8_e4m3_encode(float x) {
  const std::uint8_t sign = x < 0.f ? 0x80 : 0x00;
  const float a = fabsf(x);
  if (!(a < 448.f)) return std::uint8_t(sign | (a != a ? 0x7F : 0x7E));  // NaN stays NaN; the rest saturates
  if (a < 0.015625f) {                                                  // 2^-6: subnormal, steps of 2^-9
    return std::uint8_t(sign | std::uint8_t(rintf(a * 512.f)));          // 8 rounds up to the first normal, 0x08
  }
  int e = 0;
  const float f = frexpf(a, &e);                  // a = f 2^e, f in [0.5, 1): exponent e - 1, 1.m = 2f
  int m = int(rintf((2.f * f - 1.f) * 8.f));      // 0..8; exact: 2f - 1 has 24 bits at most
  int ex = e - 1 + 7;
  if (m == 8) {
    m = 0;
    ++ex;
  }
  const int bits = (ex << 3) | m;
  return std::uint8_t(sign | (bits > 0x7E ? 0x7E : bits));
}

ANVIL_HOST_DEVICE inline float fp8_e4m3_decode(std::uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  const float mag = e == 0 ? float(m) * 0.001953125f : ldexpf(float(8 + m), e - 10);  // 2^-9 m, (8 + m) 2^(e-10)
  return (b & 0x80) ? -mag : mag;
}

// Four E4M3 codes (little-endian bytes of w) as four IEEE half bit patterns, in two words (codes
// 0, 1 in lo; 2, 3 in hi), each worth the code's value times 2^-8: the sign, exponent and
// mantissa bits move as they are, which is exact for every finite code (subnormals included);
// the reader folds the 2^8 into the row's scale. The cheap decode of the attention kernels.
ANVIL_HOST_DEVICE inline void fp8x4_to_half2x2(std::uint32_t w, std::uint32_t& lo, std::uint32_t& hi) {
  const auto half_of = [](std::uint32_t b) { return ((b & 0x7Fu) << 7) | ((b & 0x80u) << 8); };
  lo = half_of(w & 0xFFu) | (half_of((w >> 8) & 0xFFu) << 16);
  hi = half_of((w >> 16) & 0xFFu) | (half_of(w >> 24) << 16);
}
inline constexpr float fp8_half_decode_factor = 256.f;

// One row: its scale and its codes (int8 as two's complement bytes).
ANVIL_HOST_DEVICE inline std::uint8_t kv_encode(float x, float inv_scale, kv_dtype t) {
  const float y = x * inv_scale;
  if (t == kv_dtype::fp8) return fp8_e4m3_encode(y);
  const float r = fminf(fmaxf(rintf(y), -127.f), 127.f);
  return std::uint8_t(std::int8_t(r));
}
ANVIL_HOST_DEVICE inline float kv_decode(std::uint8_t code, kv_dtype t) {
  return t == kv_dtype::fp8 ? fp8_e4m3_decode(code) : float(std::int8_t(code));
}
// The row's scale from its largest magnitude (NaN-propagating: a NaN amax gives a NaN scale), and
// the factor the encoder multiplies by (0 for an all-zero row, whose codes are then all 0).
ANVIL_HOST_DEVICE inline float kv_scale_of(float amax, kv_dtype t) { return amax / kv_code_max(t); }
ANVIL_HOST_DEVICE inline float kv_inv_scale(float scale) { return scale > 0.f ? 1.f / scale : 0.f; }
ANVIL_HOST_DEVICE inline float kv_amax_step(float amax, float x) {
  const float a = fabsf(x);
  return a > amax || a != a ? a : amax;
}

// Host: quantizes n values into codes and returns the scale.
inline float kv_quantize_row(const float* x, std::int64_t n, kv_dtype t, std::uint8_t* codes) {
  float amax = 0.f;
  for (std::int64_t i = 0; i < n; ++i) amax = kv_amax_step(amax, x[i]);
  const float scale = kv_scale_of(amax, t), inv = kv_inv_scale(scale);
  for (std::int64_t i = 0; i < n; ++i) codes[i] = kv_encode(x[i], inv, t);
  return scale;
}

}  // namespace anvil::kernels
