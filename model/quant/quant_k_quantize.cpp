// K-quant reference quantizers: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. Each super-block is quantized in
// three steps, as ggml's quantize_row_*_ref does:
//   1. fit every sub-block on its own: a scale (and for the "type-1" formats a min) chosen by a
//      small search that minimises a weighted error, not just the plain min/max range;
//   2. quantize those scales and mins against the largest of them (4, 6 or 8 bits);
//   3. requantize every element with the scale it will actually be decoded with.
// Step 3 matters: the levels from step 1 belong to the unquantized scale.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/quant/quant_blocks.h"

namespace anvil::model::quant_detail {
namespace {

// Round half to even, as ggml's nearest_int (default rounding mode).
int nearest_int(float v) { return int(std::nearbyint(v)); }

int clamp_int(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }

// Candidate inverse scales for fit_scale_min: (nmax + rmin + rdelta * k) / (max - min) for
// k = 0..nstep, tried after the plain nmax / (max - min).
struct affine_search {
  int nmax;        // levels 0..nmax
  float rmin;      // offset of the first candidate, in levels
  float rdelta;    // step between candidates, in levels
  int nstep;       // candidates after the first
  bool abs_error;  // minimise the weighted |error| rather than the weighted squared error
};

float weighted_error(const float* x, const float* w, const std::uint8_t* q, int n, float scale, float offset,
                     bool abs_error) {
  float err = 0.f;
  for (int i = 0; i < n; ++i) {
    const float diff = scale * float(q[i]) + offset - x[i];
    err += w[i] * (abs_error ? std::fabs(diff) : diff * diff);
  }
  return err;
}

// Fits x[i] ~= scale * q[i] - min with q[i] in [0, nmax] and min >= 0, so zero stays in range.
// For each candidate inverse scale, rounds to levels and then solves the weighted least-squares
// problem for (scale, min) given those levels; keeps the candidate with the smallest error.
// Returns the scale; writes the min and the levels. (ggml's make_qkx2_quants.)
float fit_scale_min(const float* x, const float* w, int n, const affine_search& p, std::uint8_t* q,
                    float* min_out) {
  float lo = x[0], hi = x[0], sum_w = 0.f, sum_x = 0.f;
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  lo = std::min(lo, 0.f);
  if (hi == lo) {  // constant block: the min alone reproduces it
    std::fill(q, q + n, std::uint8_t{0});
    *min_out = -lo;
    return 0.f;
  }
  const auto levels = [&](float iscale, std::uint8_t* out) {
    for (int i = 0; i < n; ++i) out[i] = std::uint8_t(clamp_int(nearest_int(iscale * (x[i] - lo)), 0, p.nmax));
  };
  float scale = (hi - lo) / float(p.nmax), offset = lo;
  levels(float(p.nmax) / (hi - lo), q);
  float best = weighted_error(x, w, q, n, scale, offset, p.abs_error);
  std::uint8_t cand[qk];
  for (int k = 0; k <= p.nstep; ++k) {
    levels((float(p.nmax) + p.rmin + p.rdelta * float(k)) / (hi - lo), cand);
    float sum_l = 0.f, sum_l2 = 0.f, sum_xl = 0.f;
    for (int i = 0; i < n; ++i) {
      const float l = cand[i];
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det <= 0.f) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_offset = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_offset > 0.f) {  // a positive offset cannot be stored: refit the scale through zero
      this_offset = 0.f;
      this_scale = sum_xl / sum_l2;
    }
    const float err = weighted_error(x, w, cand, n, this_scale, this_offset, p.abs_error);
    if (err < best) {
      std::copy(cand, cand + n, q);
      best = err;
      scale = this_scale;
      offset = this_offset;
    }
  }
  *min_out = -offset;
  return scale;
}

// Fits x[i] ~= scale * q[i] with q[i] in [-nmax, nmax - 1], weighting each error by x[i]^2
// (large values matter most). The value of largest magnitude goes to -nmax, the side with the
// extra level, so the scale's sign is opposite to that value's. Tries 19 inverse scales around
// nmax / absmax and keeps the one whose least-squares scale explains most of the weighted
// energy. Returns the scale; writes q[i] + nmax. (ggml's make_qx_quants, rmse_type 1.)
float fit_symmetric(const float* x, int n, int nmax, std::int8_t* q) {
  float amax = 0.f, max = 0.f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < 1e-15f) {
    std::fill(q, q + n, std::int8_t{0});
    return 0.f;
  }
  const auto sums = [&](float iscale, float& sum_lx, float& sum_l2) {
    sum_lx = sum_l2 = 0.f;
    for (int i = 0; i < n; ++i) {
      const float l = float(clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
      const float w = x[i] * x[i];
      sum_lx += w * x[i] * l;
      sum_l2 += w * l * l;
    }
  };
  float best_iscale = -float(nmax) / max, sum_lx, sum_l2;
  sums(best_iscale, sum_lx, sum_l2);
  float scale = sum_l2 > 0.f ? sum_lx / sum_l2 : 0.f;
  float best = scale * sum_lx;
  for (int k = -9; k <= 9; ++k) {
    if (k == 0) continue;
    const float iscale = -(float(nmax) + 0.1f * float(k)) / max;
    sums(iscale, sum_lx, sum_l2);
    if (sum_l2 > 0.f && sum_lx * sum_lx > best * sum_l2) {
      best_iscale = iscale;
      scale = sum_lx / sum_l2;
      best = scale * sum_lx;
    }
  }
  for (int i = 0; i < n; ++i) q[i] = std::int8_t(nmax + clamp_int(nearest_int(best_iscale * x[i]), -nmax, nmax - 1));
  return scale;
}

// Element e = 128*h + 32*j + l into bits 2j..2j+1 of qs[32*h + l] (Q2_K and Q3_K).
void pack_2bit(const std::uint8_t* L, std::uint8_t* qs) {
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const std::uint8_t* e = L + 128 * h + l;
      qs[32 * h + l] = std::uint8_t(e[0] | (e[32] << 2) | (e[64] << 4) | (e[96] << 6));
    }
  }
}

// Q4_K/Q5_K scale packing, the inverse of k4_scale_min().
void pack_k4_scales(const int* ls, const int* lm, std::uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = std::uint8_t(ls[j] | ((ls[j + 4] >> 4) << 6));
    s[j + 4] = std::uint8_t(lm[j] | ((lm[j + 4] >> 4) << 6));
    s[j + 8] = std::uint8_t((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
  }
}

// Steps 1-3 for one Q4_K/Q5_K super-block: levels 0..nmax into L, scales into the block.
template <class layout>
void quantize_k4_levels(const float* x, std::uint8_t* block, const affine_search& search, std::uint8_t* L) {
  float scales[8], mins[8], weights[32];
  float max_scale = 0.f, max_min = 0.f;
  for (int j = 0; j < 8; ++j) {
    const float* xj = x + 32 * j;
    float sum_x2 = 0.f;
    for (int l = 0; l < 32; ++l) sum_x2 += xj[l] * xj[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xj[l]);
    scales[j] = fit_scale_min(xj, weights, 32, search, L + 32 * j, &mins[j]);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0.f ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0.f ? 63.f / max_min : 0.f;
  int ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = clamp_int(nearest_int(inv_scale * scales[j]), 0, 63);
    lm[j] = clamp_int(nearest_int(inv_min * mins[j]), 0, 63);
  }
  pack_k4_scales(ls, lm, block + layout::scales);
  store_f16(block + layout::d, max_scale / 63.f);
  store_f16(block + layout::dmin, max_min / 63.f);
  const float d = load_f16(block + layout::d), dmin = load_f16(block + layout::dmin);
  for (int j = 0; j < 8; ++j) {
    const scale_min sm = k4_scale_min(block + layout::scales, j);
    const float dj = d * float(sm.scale);
    if (dj == 0.f) continue;  // the sub-block decodes to -min whatever its levels
    const float mj = dmin * float(sm.min);
    for (int l = 0; l < 32; ++l) {
      L[32 * j + l] = std::uint8_t(clamp_int(nearest_int((x[32 * j + l] + mj) / dj), 0, search.nmax));
    }
  }
}

}  // namespace

void quantize_q2_k(const float* src, std::uint8_t* dst, std::int64_t nblocks) {
  std::uint8_t L[qk_k];
  for (std::int64_t i = 0; i < nblocks; ++i, src += qk_k, dst += q2_k_layout::bytes) {
    float scales[16], mins[16], weights[16], max_scale = 0.f, max_min = 0.f;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(src[16 * j + l]);
      // Two bits leave few levels: minimise the absolute error, which outliers sway less.
      scales[j] = fit_scale_min(src + 16 * j, weights, 16, {3, -0.5f, 0.1f, 15, true}, L + 16 * j, &mins[j]);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    // 4-bit scales (low nibble) and mins (high nibble), each against its own super-scale.
    const float inv_scale = max_scale > 0.f ? 15.f / max_scale : 0.f;
    const float inv_min = max_min > 0.f ? 15.f / max_min : 0.f;
    std::uint8_t* sc = dst + q2_k_layout::scales;
    for (int j = 0; j < 16; ++j) {
      const int ls = clamp_int(nearest_int(inv_scale * scales[j]), 0, 15);
      const int lm = clamp_int(nearest_int(inv_min * mins[j]), 0, 15);
      sc[j] = std::uint8_t(ls | (lm << 4));
    }
    store_f16(dst + q2_k_layout::d, max_scale / 15.f);
    store_f16(dst + q2_k_layout::dmin, max_min / 15.f);
    const float d = load_f16(dst + q2_k_layout::d), dmin = load_f16(dst + q2_k_layout::dmin);
    for (int j = 0; j < 16; ++j) {
      const float dj = d * float(sc[j] & 0xF);
      if (dj == 0.f) continue;
      const float mj = dmin * float(sc[j] >> 4);
      for (int l = 0; l < 16; ++l) {
        L[16 * j + l] = std::uint8_t(clamp_int(nearest_int((src[16 * j + l] + mj) / dj), 0, 3));
      }
    }
    pack_2bit(L, dst + q2_k_layout::qs);
  }
}

void quantize_q3_k(const float* src, std::uint8_t* dst, std::int64_t nblocks) {
  std::int8_t L[qk_k];
  for (std::int64_t i = 0; i < nblocks; ++i, src += qk_k, dst += q3_k_layout::bytes) {
    std::memset(dst, 0, q3_k_layout::bytes);
    float scales[16], max_scale = 0.f, max_abs = 0.f;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_symmetric(src + 16 * j, 16, 4, L + 16 * j);
      if (std::fabs(scales[j]) > max_abs) {
        max_abs = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    if (max_abs < 1e-15f) continue;  // all zero: d = 0 decodes every element to 0
    // 6-bit signed scales, the largest mapped to -32; see q3_k_scales() for the packing.
    const float iscale = -32.f / max_scale;
    store_f16(dst + q3_k_layout::d, 1.f / iscale);
    const float d = load_f16(dst + q3_k_layout::d);
    std::uint8_t* s = dst + q3_k_layout::scales;
    for (int j = 0; j < 16; ++j) {
      const int sc = clamp_int(nearest_int(iscale * scales[j]), -32, 31);
      const int biased = sc + 32;
      s[j % 8] = std::uint8_t(s[j % 8] | ((biased & 0xF) << (j < 8 ? 0 : 4)));
      s[8 + j % 4] = std::uint8_t(s[8 + j % 4] | ((biased >> 4) << (2 * (j / 4))));
      const float dj = d * float(sc);
      if (dj == 0.f) continue;
      for (int l = 0; l < 16; ++l) {
        L[16 * j + l] = std::int8_t(4 + clamp_int(nearest_int(src[16 * j + l] / dj), -4, 3));
      }
    }
    // Bit 2 of element e goes to bit e / 32 of hmask[e % 32]; the low two bits as Q2_K.
    std::uint8_t low[qk_k];
    std::uint8_t* hm = dst + q3_k_layout::hmask;
    for (int e = 0; e < qk_k; ++e) {
      hm[e % 32] = std::uint8_t(hm[e % 32] | ((L[e] >> 2) << (e / 32)));
      low[e] = std::uint8_t(L[e] & 3);
    }
    pack_2bit(low, dst + q3_k_layout::qs);
  }
}

void quantize_q4_k(const float* src, std::uint8_t* dst, std::int64_t nblocks) {
  std::uint8_t L[qk_k];
  for (std::int64_t i = 0; i < nblocks; ++i, src += qk_k, dst += q4_k_layout::bytes) {
    quantize_k4_levels<q4_k_layout>(src, dst, {15, -1.f, 0.1f, 20, false}, L);
    std::uint8_t* qs = dst + q4_k_layout::qs;
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) qs[32 * c + l] = std::uint8_t(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
  }
}

void quantize_q5_k(const float* src, std::uint8_t* dst, std::int64_t nblocks) {
  std::uint8_t L[qk_k];
  for (std::int64_t i = 0; i < nblocks; ++i, src += qk_k, dst += q5_k_layout::bytes) {
    quantize_k4_levels<q5_k_layout>(src, dst, {31, -0.5f, 0.1f, 15, false}, L);
    std::uint8_t* qs = dst + q5_k_layout::qs;
    std::uint8_t* qh = dst + q5_k_layout::qh;
    std::memset(qh, 0, 32);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
        qs[32 * c + l] = std::uint8_t((lo & 0xF) | ((hi & 0xF) << 4));
        qh[l] = std::uint8_t(qh[l] | ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
    }
  }
}

void quantize_q6_k(const float* src, std::uint8_t* dst, std::int64_t nblocks) {
  std::int8_t L[qk_k];
  for (std::int64_t i = 0; i < nblocks; ++i, src += qk_k, dst += q6_k_layout::bytes) {
    float scales[16], max_scale = 0.f, max_abs = 0.f;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_symmetric(src + 16 * j, 16, 32, L + 16 * j);
      if (std::fabs(scales[j]) > max_abs) {
        max_abs = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    if (max_abs < 1e-15f) {  // all zero
      std::memset(dst, 0, q6_k_layout::bytes);
      continue;
    }
    // The largest scale maps to -128; the int8 scales keep the sign of each sub-block's fit.
    const float iscale = -128.f / max_scale;
    store_f16(dst + q6_k_layout::d, 1.f / iscale);
    const float d = load_f16(dst + q6_k_layout::d);
    for (int j = 0; j < 16; ++j) {
      const int sc = std::min(127, nearest_int(iscale * scales[j]));
      dst[q6_k_layout::scales + j] = std::uint8_t(std::int8_t(sc));
      const float dj = d * float(sc);
      if (dj == 0.f) continue;
      for (int l = 0; l < 16; ++l) {
        L[16 * j + l] = std::int8_t(32 + clamp_int(nearest_int(src[16 * j + l] / dj), -32, 31));
      }
    }
    std::uint8_t* ql = dst + q6_k_layout::ql;
    std::uint8_t* qh = dst + q6_k_layout::qh;
    for (int h = 0; h < 2; ++h) {
      for (int l = 0; l < 32; ++l) {
        const int q0 = L[128 * h + l], q1 = L[128 * h + 32 + l], q2 = L[128 * h + 64 + l], q3 = L[128 * h + 96 + l];
        ql[64 * h + l] = std::uint8_t((q0 & 0xF) | ((q2 & 0xF) << 4));
        ql[64 * h + 32 + l] = std::uint8_t((q1 & 0xF) | ((q3 & 0xF) << 4));
        qh[32 * h + l] = std::uint8_t((q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4) | ((q3 >> 4) << 6));
      }
    }
  }
}

}  // namespace anvil::model::quant_detail
