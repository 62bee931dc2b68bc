// K-quant dequantization: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. A 256-element super-block holds
// sub-block scales quantized against one or two fp16 super-scales, and the quants interleaved
// for ggml's SIMD kernels. Where each element lives:
//
//   Q2_K, Q3_K: element e = 128*h + 32*j + l (h < 2, j < 4, l < 32) is bits 2j..2j+1 of
//               qs[32*h + l]; its sub-block (scale) is e / 16. Q3_K adds bit 2 from bit
//               (e / 32) of hmask[l], stored inverted: a clear bit subtracts 4.
//   Q4_K, Q5_K: element e = 64*c + 32*p + l (c < 4, p < 2) is the low (p = 0) or high (p = 1)
//               nibble of qs[32*c + l]; its sub-block is e / 32 = 2c + p. Q5_K adds bit 4 from
//               bit (e / 32) of qh[l].
//   Q6_K:       element e = 128*h + 32*g + l (g < 4) takes its low 4 bits from ql[64*h + 32*(g & 1)
//               + l] (low nibble for g < 2, high for g >= 2) and its high 2 bits from bits 2g..2g+1
//               of qh[32*h + l]; q - 32 is scaled by int8 scale e / 16.
//
// Float arithmetic follows ggml's (same products in the same order), so results are identical.
#include "model/quant/quant_blocks.h"

namespace anvil::model::quant_detail {
namespace {

// The 16 signed scales of a Q3_K block (6 bits stored with a bias of 32): scale j keeps its low
// 4 bits in byte j (j < 8, low nibble) or byte j - 8 (high nibble), and its top 2 bits in bits
// 2*(j/4) of byte 8 + j%4.
void q3_k_scales(const std::uint8_t* s, int* out) {
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
    const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = (low | (high << 4)) - 32;
  }
}

}  // namespace

void dequantize_q2_k(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t nblocks) {
  for (std::int64_t i = 0; i < nblocks; ++i, src += q2_k_layout::bytes, dst += qk_k) {
    const float d = load_f16(src + q2_k_layout::d);
    const float dmin = load_f16(src + q2_k_layout::dmin);
    for (int h = 0; h < 2; ++h) {
      const std::uint8_t* q = src + q2_k_layout::qs + 32 * h;
      for (int j = 0; j < 4; ++j) {
        for (int s = 0; s < 2; ++s) {
          const std::uint8_t sc = src[q2_k_layout::scales + 8 * h + 2 * j + s];
          const float dl = d * float(sc & 0xF);
          const float ml = dmin * float(sc >> 4);
          float* y = dst + 128 * h + 32 * j + 16 * s;
          for (int l = 0; l < 16; ++l) y[l] = dl * float((q[16 * s + l] >> (2 * j)) & 3) - ml;
        }
      }
    }
  }
}

void dequantize_q3_k(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t nblocks) {
  int scales[16];
  for (std::int64_t i = 0; i < nblocks; ++i, src += q3_k_layout::bytes, dst += qk_k) {
    const float d = load_f16(src + q3_k_layout::d);
    q3_k_scales(src + q3_k_layout::scales, scales);
    const std::uint8_t* hm = src + q3_k_layout::hmask;
    for (int h = 0; h < 2; ++h) {
      const std::uint8_t* q = src + q3_k_layout::qs + 32 * h;
      for (int j = 0; j < 4; ++j) {
        const int hbit = 4 * h + j;
        for (int s = 0; s < 2; ++s) {
          const float dl = d * float(scales[8 * h + 2 * j + s]);
          float* y = dst + 128 * h + 32 * j + 16 * s;
          for (int l = 0; l < 16; ++l) {
            const int low = (q[16 * s + l] >> (2 * j)) & 3;
            const int sub = ((hm[16 * s + l] >> hbit) & 1) ? 0 : 4;
            y[l] = dl * float(low - sub);
          }
        }
      }
    }
  }
}

void dequantize_q4_k(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t nblocks) {
  for (std::int64_t i = 0; i < nblocks; ++i, src += q4_k_layout::bytes, dst += qk_k) {
    const float d = load_f16(src + q4_k_layout::d);
    const float dmin = load_f16(src + q4_k_layout::dmin);
    for (int c = 0; c < 4; ++c) {
      const std::uint8_t* q = src + q4_k_layout::qs + 32 * c;
      const scale_min lo = k4_scale_min(src + q4_k_layout::scales, 2 * c);
      const scale_min hi = k4_scale_min(src + q4_k_layout::scales, 2 * c + 1);
      const float d1 = d * float(lo.scale), m1 = dmin * float(lo.min);
      const float d2 = d * float(hi.scale), m2 = dmin * float(hi.min);
      float* y = dst + 64 * c;
      for (int l = 0; l < 32; ++l) y[l] = d1 * float(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) y[32 + l] = d2 * float(q[l] >> 4) - m2;
    }
  }
}

void dequantize_q5_k(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t nblocks) {
  for (std::int64_t i = 0; i < nblocks; ++i, src += q5_k_layout::bytes, dst += qk_k) {
    const float d = load_f16(src + q5_k_layout::d);
    const float dmin = load_f16(src + q5_k_layout::dmin);
    const std::uint8_t* qh = src + q5_k_layout::qh;
    for (int c = 0; c < 4; ++c) {
      const std::uint8_t* q = src + q5_k_layout::qs + 32 * c;
      const scale_min lo = k4_scale_min(src + q5_k_layout::scales, 2 * c);
      const scale_min hi = k4_scale_min(src + q5_k_layout::scales, 2 * c + 1);
      const float d1 = d * float(lo.scale), m1 = dmin * float(lo.min);
      const float d2 = d * float(hi.scale), m2 = dmin * float(hi.min);
      float* y = dst + 64 * c;
      for (int l = 0; l < 32; ++l) y[l] = d1 * float((q[l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4)) - m1;
      for (int l = 0; l < 32; ++l) y[32 + l] = d2 * float((q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) - m2;
    }
  }
}

void dequantize_q6_k(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t nblocks) {
  for (std::int64_t i = 0; i < nblocks; ++i, src += q6_k_layout::bytes, dst += qk_k) {
    const float d = load_f16(src + q6_k_layout::d);
    for (int h = 0; h < 2; ++h) {
      const std::uint8_t* qh = src + q6_k_layout::qh + 32 * h;
      for (int g = 0; g < 4; ++g) {
        const std::uint8_t* ql = src + q6_k_layout::ql + 64 * h + 32 * (g & 1);
        const int low_shift = 4 * (g >> 1);
        for (int s = 0; s < 2; ++s) {
          const float dl = d * float(std::int8_t(src[q6_k_layout::scales + 8 * h + 2 * g + s]));
          float* y = dst + 128 * h + 32 * g + 16 * s;
          for (int l = 16 * s; l < 16 * s + 16; ++l) {
            const int q = ((ql[l] >> low_shift) & 0xF) | (((qh[l] >> (2 * g)) & 3) << 4);
            y[l - 16 * s] = dl * float(q - 32);
          }
        }
      }
    }
  }
}

}  // namespace anvil::model::quant_detail
