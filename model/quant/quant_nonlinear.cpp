// The non-linear 4-bit types: IQ4_NL and IQ4_XS (a 16-level table, with one fp16 scale per 32
// elements, or per 256 with 6-bit sub-scales) and MXFP4 (FP4 E2M1 values under one power-of-two
// scale per 32 elements: gpt-oss's expert weights). Layouts as in quant_blocks.h.
//
// The quantizers are plain reference ones (the files people download come from llama.cpp's
// importance-weighted search): each block's scale maps its largest magnitude onto the table's
// end, then a least-squares refit of the scale for the levels chosen, and each element takes the
// nearest level.
#include <algorithm>
#include <cmath>

#include "model/quant/quant_blocks.h"

namespace anvil::model::quant_detail {
namespace {

// The table entry nearest to v (the first of two equally near).
int nearest_level(const std::int8_t (&levels)[16], float v) {
  int best = 0;
  float best_err = std::fabs(v - float(levels[0]));
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(v - float(levels[i]));
    if (err < best_err) best = i, best_err = err;
  }
  return best;
}

// Picks the IQ4 levels of n values for scale d, refits d by least squares, and picks again.
// Returns the refitted scale; q gets the level indices.
float fit_iq4(const float* x, int n, float d, std::uint8_t* q) {
  if (d == 0.f) {
    std::fill(q, q + n, std::uint8_t(nearest_level(iq4_levels, 0.f)));
    return 0.f;
  }
  for (int pass = 0; pass < 2; ++pass) {
    float sum_xl = 0.f, sum_ll = 0.f;
    for (int j = 0; j < n; ++j) {
      q[j] = std::uint8_t(nearest_level(iq4_levels, x[j] / d));
      const float l = iq4_levels[q[j]];
      sum_xl += x[j] * l;
      sum_ll += l * l;
    }
    if (pass == 0 && sum_ll > 0.f && sum_xl != 0.f) d = sum_xl / sum_ll;
  }
  return d;
}

void pack_nibbles(const std::uint8_t* q, std::uint8_t* qs) {
  for (int j = 0; j < qk / 2; ++j) qs[j] = std::uint8_t(q[j] | (q[j + 16] << 4));
}

}  // namespace

// ---- dequantize -----------------------------------------------------------------------------------

void dequantize_iq4_nl(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t nblocks) {
  for (std::int64_t i = 0; i < nblocks; ++i, src += iq4_nl_layout::bytes, dst += qk) {
    const float d = load_f16(src + iq4_nl_layout::d);
    const std::uint8_t* qs = src + iq4_nl_layout::qs;
    for (int j = 0; j < qk / 2; ++j) {
      dst[j] = d * float(iq4_levels[qs[j] & 0xF]);
      dst[j + 16] = d * float(iq4_levels[qs[j] >> 4]);
    }
  }
}

void dequantize_iq4_xs(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t nblocks) {
  for (std::int64_t i = 0; i < nblocks; ++i, src += iq4_xs_layout::bytes) {
    const float d = load_f16(src + iq4_xs_layout::d);
    std::uint16_t scales_h;
    std::memcpy(&scales_h, src + iq4_xs_layout::scales_h, sizeof scales_h);
    const std::uint8_t* scales_l = src + iq4_xs_layout::scales_l;
    const std::uint8_t* qs = src + iq4_xs_layout::qs;
    for (int ib = 0; ib < qk_k / qk; ++ib, qs += qk / 2, dst += qk) {
      const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d * float(ls - 32);
      for (int j = 0; j < qk / 2; ++j) {
        dst[j] = dl * float(iq4_levels[qs[j] & 0xF]);
        dst[j + 16] = dl * float(iq4_levels[qs[j] >> 4]);
      }
    }
  }
}

void dequantize_mxfp4(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t nblocks) {
  for (std::int64_t i = 0; i < nblocks; ++i, src += mxfp4_layout::bytes, dst += qk) {
    const float d = std::ldexp(1.f, int(src[mxfp4_layout::e]) - 128);  // exact for every e
    const std::uint8_t* qs = src + mxfp4_layout::qs;
    for (int j = 0; j < qk / 2; ++j) {
      dst[j] = d * float(fp4_levels[qs[j] & 0xF]);
      dst[j + 16] = d * float(fp4_levels[qs[j] >> 4]);
    }
  }
}

// ---- quantize -------------------------------------------------------------------------------------

void quantize_iq4_nl(const float* src, std::uint8_t* dst, std::int64_t nblocks) {
  std::uint8_t q[qk];
  for (std::int64_t i = 0; i < nblocks; ++i, src += qk, dst += iq4_nl_layout::bytes) {
    // The largest magnitude onto the -127 level, the table's widest.
    const float d = fit_iq4(src, qk, signed_absmax(src) / float(iq4_levels[0]), q);
    store_f16(dst + iq4_nl_layout::d, d);
    // Levels for the scale as stored (rounded to fp16).
    fit_iq4(src, qk, load_f16(dst + iq4_nl_layout::d), q);
    pack_nibbles(q, dst + iq4_nl_layout::qs);
  }
}

void quantize_iq4_xs(const float* src, std::uint8_t* dst, std::int64_t nblocks) {
  std::uint8_t q[qk];
  for (std::int64_t i = 0; i < nblocks; ++i, src += qk_k, dst += iq4_xs_layout::bytes) {
    // Each sub-block's own scale, then one super-scale that puts the largest of them at -32.
    float sub[qk_k / qk];
    float widest = 0.f;
    for (int ib = 0; ib < qk_k / qk; ++ib) {
      sub[ib] = fit_iq4(src + ib * qk, qk, signed_absmax(src + ib * qk) / float(iq4_levels[0]), q);
      if (std::fabs(sub[ib]) > std::fabs(widest)) widest = sub[ib];
    }
    store_f16(dst + iq4_xs_layout::d, widest / -32.f);
    const float d = load_f16(dst + iq4_xs_layout::d);
    std::uint16_t scales_h = 0;
    std::uint8_t* scales_l = dst + iq4_xs_layout::scales_l;
    std::fill(scales_l, scales_l + 4, std::uint8_t(0));
    for (int ib = 0; ib < qk_k / qk; ++ib) {
      const int ls = d == 0.f ? 32 : std::clamp(int(std::nearbyint(sub[ib] / d)) + 32, 0, 63);
      scales_l[ib / 2] = std::uint8_t(scales_l[ib / 2] | ((ls & 0xF) << (4 * (ib % 2))));
      scales_h = std::uint16_t(scales_h | ((ls >> 4) << (2 * ib)));
      // The levels for the sub-scale as stored, without refitting it.
      const float dl = d * float(ls - 32);
      for (int j = 0; j < qk; ++j) q[j] = std::uint8_t(nearest_level(iq4_levels, dl != 0.f ? src[ib * qk + j] / dl : 0.f));
      pack_nibbles(q, dst + iq4_xs_layout::qs + std::size_t(ib) * (qk / 2));
    }
    std::memcpy(dst + iq4_xs_layout::scales_h, &scales_h, sizeof scales_h);
  }
}

void quantize_mxfp4(const float* src, std::uint8_t* dst, std::int64_t nblocks) {
  std::uint8_t q[qk];
  for (std::int64_t i = 0; i < nblocks; ++i, src += qk, dst += mxfp4_layout::bytes) {
    float amax = 0.f;
    for (int j = 0; j < qk; ++j) amax = std::max(amax, std::fabs(src[j]));
    // The smallest power of two that keeps the largest magnitude within the table's 12 levels.
    int e = 0;
    if (amax > 0.f) e = std::clamp(int(std::ceil(std::log2(amax / 12.f))) + 128, 0, 254);
    const float d = std::ldexp(1.f, e - 128);
    dst[mxfp4_layout::e] = std::uint8_t(e);
    for (int j = 0; j < qk; ++j) q[j] = std::uint8_t(nearest_level(fp4_levels, src[j] / d));
    pack_nibbles(q, dst + mxfp4_layout::qs);
  }
}

}  // namespace anvil::model::quant_detail
