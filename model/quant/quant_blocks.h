// Internal to anvil_quant (not for other parts): the GGML block layouts as byte offsets, and the
// per-type kernels quant.cpp dispatches to. The offsets are ggml-common.h's structs written out,
// because GGUF rows of 18-, 22- or 210-byte blocks are not aligned for a struct cast: blocks are
// read as bytes, and the fp16 fields through memcpy.
//
// Every kernel works on whole blocks, `nblocks` of them; the hot loops run over fixed counts
// (16, 32) on __restrict pointers so that GCC auto-vectorises them at -O2.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "model/quant/quant.h"

namespace anvil::model::quant_detail {

static_assert(std::endian::native == std::endian::little, "GGUF data is little-endian");

inline constexpr int qk = 32;     // elements per legacy block (Q4_0 .. Q8_0)
inline constexpr int qk_k = 256;  // elements per K-quant super-block

// f16_to_f32, inline for the row loops. Branch-free so that they vectorise: shift exponent and
// mantissa into place and rebias; infinities and NaNs get the rest of the exponent; zeros and
// subnormals are rebuilt as float(1.mant * 2^-14) - 2^-14, which is exact. Masks, not ?:, keep
// it straight-line code for GCC's -O2 vectoriser.
inline float decode_f16(std::uint16_t h) noexcept {
  const std::uint32_t shifted = std::uint32_t(h & 0x7fffu) << 13;
  const std::uint32_t exp = shifted & 0x0f800000u;
  const std::uint32_t normal = shifted + (112u << 23);
  const std::uint32_t inf_nan = normal + (112u << 23);
  const float sub = std::bit_cast<float>(normal + (1u << 23)) - 0x1p-14f;
  const std::uint32_t is_inf_nan = 0u - std::uint32_t(exp == 0x0f800000u);
  const std::uint32_t is_sub = 0u - std::uint32_t(exp == 0);
  const std::uint32_t mag = (normal & ~(is_inf_nan | is_sub)) | (inf_nan & is_inf_nan) |
                            (std::bit_cast<std::uint32_t>(sub) & is_sub);
  return std::bit_cast<float>(mag | (std::uint32_t(h & 0x8000u) << 16));
}

inline float load_f16(const std::uint8_t* p) noexcept {
  std::uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return decode_f16(h);
}
inline void store_f16(std::uint8_t* p, float v) noexcept {
  const std::uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, sizeof h);
}

// The signed value of largest magnitude in a 32-element block (the first one on ties), as ggml
// picks it: the quantizers map it onto their most negative level.
inline float signed_absmax(const float* x) noexcept {
  float amax = 0.f, max = 0.f;
  for (int j = 0; j < qk; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

// Field offsets in bytes. "Halves" below are the two 16-element runs of a 32-element block:
// byte j of qs holds element j in its low nibble and element j+16 in its high nibble.
struct q4_0_layout {
  static constexpr std::size_t d = 0;   // fp16 scale: value = (q - 8) * d
  static constexpr std::size_t qs = 2;  // 16 bytes of nibbles, halves as above
  static constexpr std::size_t bytes = 18;
};
struct q4_1_layout {
  static constexpr std::size_t d = 0;   // fp16 scale: value = q * d + m
  static constexpr std::size_t m = 2;   // fp16 offset (the block minimum)
  static constexpr std::size_t qs = 4;  // 16 bytes of nibbles, halves as above
  static constexpr std::size_t bytes = 20;
};
struct q5_0_layout {
  static constexpr std::size_t d = 0;   // fp16 scale: value = (q - 16) * d
  static constexpr std::size_t qh = 2;  // uint32 LE: bit j is bit 4 of element j
  static constexpr std::size_t qs = 6;  // low 4 bits, halves as above
  static constexpr std::size_t bytes = 22;
};
struct q5_1_layout {
  static constexpr std::size_t d = 0;   // fp16 scale: value = q * d + m
  static constexpr std::size_t m = 2;   // fp16 offset
  static constexpr std::size_t qh = 4;  // uint32 LE: bit j is bit 4 of element j
  static constexpr std::size_t qs = 8;  // low 4 bits, halves as above
  static constexpr std::size_t bytes = 24;
};
struct q8_0_layout {
  static constexpr std::size_t d = 0;   // fp16 scale: value = q * d
  static constexpr std::size_t qs = 2;  // 32 int8
  static constexpr std::size_t bytes = 34;
};

// K-quants: 256 elements in sub-blocks of 16 (Q2_K, Q3_K, Q6_K) or 32 (Q4_K, Q5_K).
struct q2_k_layout {
  static constexpr std::size_t scales = 0;  // 16 bytes: low nibble scale, high nibble min, per 16
  static constexpr std::size_t qs = 16;     // 64 bytes: 2-bit quants (see quant_k.cpp)
  static constexpr std::size_t d = 80;      // fp16 super-scale of the scales
  static constexpr std::size_t dmin = 82;   // fp16 super-scale of the mins
  static constexpr std::size_t bytes = 84;
};
struct q3_k_layout {
  static constexpr std::size_t hmask = 0;   // 32 bytes: bit 2 of each quant
  static constexpr std::size_t qs = 32;     // 64 bytes: low 2 bits, as Q2_K
  static constexpr std::size_t scales = 96; // 12 bytes: 16 six-bit scales, biased by 32
  static constexpr std::size_t d = 108;     // fp16 super-scale
  static constexpr std::size_t bytes = 110;
};
struct q4_k_layout {
  static constexpr std::size_t d = 0;       // fp16 super-scale of the 6-bit scales
  static constexpr std::size_t dmin = 2;    // fp16 super-scale of the 6-bit mins
  static constexpr std::size_t scales = 4;  // 12 bytes: 8 (scale, min) pairs, 6 bits each
  static constexpr std::size_t qs = 16;     // 128 bytes: 4-bit quants, 64 elements per 32 bytes
  static constexpr std::size_t bytes = 144;
};
struct q5_k_layout {
  static constexpr std::size_t d = 0;
  static constexpr std::size_t dmin = 2;
  static constexpr std::size_t scales = 4;  // as Q4_K
  static constexpr std::size_t qh = 16;     // 32 bytes: bit 4 of each quant
  static constexpr std::size_t qs = 48;     // 128 bytes: low 4 bits, as Q4_K
  static constexpr std::size_t bytes = 176;
};
struct q6_k_layout {
  static constexpr std::size_t ql = 0;        // 128 bytes: low 4 bits
  static constexpr std::size_t qh = 128;      // 64 bytes: high 2 bits
  static constexpr std::size_t scales = 192;  // 16 int8 scales, one per 16 elements
  static constexpr std::size_t d = 208;       // fp16 super-scale
  static constexpr std::size_t bytes = 210;
};

// Non-linear 4-bit types: each nibble indexes a 16-entry table of levels (halves as above).
struct iq4_nl_layout {
  static constexpr std::size_t d = 0;   // fp16 scale: value = d * iq4_levels[q]
  static constexpr std::size_t qs = 2;  // 16 bytes of nibbles
  static constexpr std::size_t bytes = 18;
};
struct iq4_xs_layout {
  static constexpr std::size_t d = 0;         // fp16 super-scale
  static constexpr std::size_t scales_h = 2;  // uint16 LE: bits 2ib, 2ib+1 are the top of scale ib
  static constexpr std::size_t scales_l = 4;  // 4 bytes: nibble ib % 2 of byte ib / 2 is the low part
  static constexpr std::size_t qs = 8;        // 128 bytes: 16 per 32-element sub-block, halves as above
  static constexpr std::size_t bytes = 136;   // value = d * (scale_ib - 32) * iq4_levels[q]
};
struct mxfp4_layout {
  static constexpr std::size_t e = 0;   // E8M0 shared exponent: value = 2^(e - 128) * fp4_levels[q]
  static constexpr std::size_t qs = 1;  // 16 bytes of nibbles
  static constexpr std::size_t bytes = 17;
};
// IQ4_NL / IQ4_XS levels, and the FP4 (E2M1) values doubled (so that they are integers).
inline constexpr std::int8_t iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
inline constexpr std::int8_t fp4_levels[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// The 6-bit (scale, min) of sub-block j (0..7) of a Q4_K/Q5_K block, from its 12 scale bytes:
// bytes 0..3 hold scales 0..3 and bytes 4..7 mins 0..3 in their low 6 bits; sub-blocks 4..7 keep
// their low 4 bits in the nibbles of bytes 8..11 and their top 2 bits in the top bits of 0..7.
struct scale_min {
  int scale;
  int min;
};
inline scale_min k4_scale_min(const std::uint8_t* s, int j) noexcept {
  if (j < 4) return {s[j] & 63, s[j + 4] & 63};
  return {(s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)};
}

using dequantize_fn = void (*)(const std::uint8_t* src, float* dst, std::int64_t nblocks);
using quantize_fn = void (*)(const float* src, std::uint8_t* dst, std::int64_t nblocks);

// quant_legacy.cpp
void dequantize_q4_0(const std::uint8_t* src, float* dst, std::int64_t nblocks);
void dequantize_q4_1(const std::uint8_t* src, float* dst, std::int64_t nblocks);
void dequantize_q5_0(const std::uint8_t* src, float* dst, std::int64_t nblocks);
void dequantize_q5_1(const std::uint8_t* src, float* dst, std::int64_t nblocks);
void dequantize_q8_0(const std::uint8_t* src, float* dst, std::int64_t nblocks);
void quantize_q4_0(const float* src, std::uint8_t* dst, std::int64_t nblocks);
void quantize_q4_1(const float* src, std::uint8_t* dst, std::int64_t nblocks);
void quantize_q5_0(const float* src, std::uint8_t* dst, std::int64_t nblocks);
void quantize_q5_1(const float* src, std::uint8_t* dst, std::int64_t nblocks);
void quantize_q8_0(const float* src, std::uint8_t* dst, std::int64_t nblocks);

// quant_nonlinear.cpp
void dequantize_iq4_nl(const std::uint8_t* src, float* dst, std::int64_t nblocks);
void dequantize_iq4_xs(const std::uint8_t* src, float* dst, std::int64_t nblocks);
void dequantize_mxfp4(const std::uint8_t* src, float* dst, std::int64_t nblocks);
void quantize_iq4_nl(const float* src, std::uint8_t* dst, std::int64_t nblocks);
void quantize_iq4_xs(const float* src, std::uint8_t* dst, std::int64_t nblocks);
void quantize_mxfp4(const float* src, std::uint8_t* dst, std::int64_t nblocks);

// quant_k.cpp
void dequantize_q2_k(const std::uint8_t* src, float* dst, std::int64_t nblocks);
void dequantize_q3_k(const std::uint8_t* src, float* dst, std::int64_t nblocks);
void dequantize_q4_k(const std::uint8_t* src, float* dst, std::int64_t nblocks);
void dequantize_q5_k(const std::uint8_t* src, float* dst, std::int64_t nblocks);
void dequantize_q6_k(const std::uint8_t* src, float* dst, std::int64_t nblocks);

// quant_k_quantize.cpp
void quantize_q2_k(const float* src, std::uint8_t* dst, std::int64_t nblocks);
void quantize_q3_k(const float* src, std::uint8_t* dst, std::int64_t nblocks);
void quantize_q4_k(const float* src, std::uint8_t* dst, std::int64_t nblocks);
void quantize_q5_k(const float* src, std::uint8_t* dst, std::int64_t nblocks);
void quantize_q6_k(const float* src, std::uint8_t* dst, std::int64_t nblocks);

}  // namespace anvil::model::quant_detail
