// The legacy 32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0. Each block is one fp16
// scale (and for the _1 types an fp16 offset) over 32 small integers; "type-0" blocks decode
// as d * q, "type-1" blocks as d * q + m. The quantizers reproduce ggml's reference arithmetic
// (same rounding, same clamps), so a row quantized here is byte-identical to ggml's.
#include <algorithm>
#include <cmath>
#include <limits>

#include "model/quant/quant_blocks.h"

namespace anvil::model::quant_detail {
namespace {

std::uint32_t load_u32(const std::uint8_t* p) {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
void store_u32(std::uint8_t* p, std::uint32_t v) { std::memcpy(p, &v, sizeof v); }

struct min_max {
  float min, max;
};
min_max block_min_max(const float* x) {
  min_max r{std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()};
  for (int j = 0; j < qk; ++j) {
    r.min = std::min(r.min, x[j]);
    r.max = std::max(r.max, x[j]);
  }
  return r;
}

// Packs 32 5-bit quants: low nibbles into qs (halves), bit 4 of element j into bit j of qh.
void pack_5bit(const std::uint8_t* q, std::uint8_t* qs, std::uint8_t* qh_bytes) {
  std::uint32_t qh = 0;
  for (int j = 0; j < qk / 2; ++j) {
    qs[j] = std::uint8_t((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    qh |= std::uint32_t(q[j] >> 4) << j;
    qh |= std::uint32_t(q[j + 16] >> 4) << (j + 16);
  }
  store_u32(qh_bytes, qh);
}

// Unpacks the 5-bit quants of a Q5_0/Q5_1 block into q[0..31].
void unpack_5bit(const std::uint8_t* __restrict qs, std::uint32_t qh, int* __restrict q) {
  for (int j = 0; j < qk / 2; ++j) {
    q[j] = (qs[j] & 0xF) | int(((qh >> j) & 1u) << 4);
    q[j + 16] = (qs[j] >> 4) | int(((qh >> (j + 16)) & 1u) << 4);
  }
}

}  // namespace

// ---- dequantize -----------------------------------------------------------------------------------

void dequantize_q4_0(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t nblocks) {
  for (std::int64_t i = 0; i < nblocks; ++i, src += q4_0_layout::bytes, dst += qk) {
    const float d = load_f16(src + q4_0_layout::d);
    const std::uint8_t* qs = src + q4_0_layout::qs;
    for (int j = 0; j < qk / 2; ++j) {
      dst[j] = float((qs[j] & 0xF) - 8) * d;
      dst[j + 16] = float((qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t nblocks) {
  for (std::int64_t i = 0; i < nblocks; ++i, src += q4_1_layout::bytes, dst += qk) {
    const float d = load_f16(src + q4_1_layout::d);
    const float m = load_f16(src + q4_1_layout::m);
    const std::uint8_t* qs = src + q4_1_layout::qs;
    for (int j = 0; j < qk / 2; ++j) {
      dst[j] = float(qs[j] & 0xF) * d + m;
      dst[j + 16] = float(qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_q5_0(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t nblocks) {
  int q[qk];
  for (std::int64_t i = 0; i < nblocks; ++i, src += q5_0_layout::bytes, dst += qk) {
    const float d = load_f16(src + q5_0_layout::d);
    unpack_5bit(src + q5_0_layout::qs, load_u32(src + q5_0_layout::qh), q);
    for (int j = 0; j < qk; ++j) dst[j] = float(q[j] - 16) * d;
  }
}

void dequantize_q5_1(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t nblocks) {
  int q[qk];
  for (std::int64_t i = 0; i < nblocks; ++i, src += q5_1_layout::bytes, dst += qk) {
    const float d = load_f16(src + q5_1_layout::d);
    const float m = load_f16(src + q5_1_layout::m);
    unpack_5bit(src + q5_1_layout::qs, load_u32(src + q5_1_layout::qh), q);
    for (int j = 0; j < qk; ++j) dst[j] = float(q[j]) * d + m;
  }
}

void dequantize_q8_0(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t nblocks) {
  for (std::int64_t i = 0; i < nblocks; ++i, src += q8_0_layout::bytes, dst += qk) {
    const float d = load_f16(src + q8_0_layout::d);
    const std::uint8_t* qs = src + q8_0_layout::qs;
    for (int j = 0; j < qk; ++j) dst[j] = float(std::int8_t(qs[j])) * d;
  }
}

// ---- quantize -------------------------------------------------------------------------------------
// The block's scale maps its largest-magnitude value onto the most negative level (-8 or -16),
// which has one more step than the positive side. Levels are rounded half-up by truncating
// x / d + offset + 0.5, as ggml does.

void quantize_q4_0(const float* src, std::uint8_t* dst, std::int64_t nblocks) {
  for (std::int64_t i = 0; i < nblocks; ++i, src += qk, dst += q4_0_layout::bytes) {
    const float d = signed_absmax(src) / -8;
    const float id = d != 0.f ? 1.f / d : 0.f;
    store_f16(dst + q4_0_layout::d, d);
    std::uint8_t* qs = dst + q4_0_layout::qs;
    for (int j = 0; j < qk / 2; ++j) {
      const int lo = std::min(15, int(src[j] * id + 8.5f));
      const int hi = std::min(15, int(src[j + 16] * id + 8.5f));
      qs[j] = std::uint8_t(lo | (hi << 4));
    }
  }
}

void quantize_q4_1(const float* src, std::uint8_t* dst, std::int64_t nblocks) {
  for (std::int64_t i = 0; i < nblocks; ++i, src += qk, dst += q4_1_layout::bytes) {
    const min_max r = block_min_max(src);
    const float d = (r.max - r.min) / 15;
    const float id = d != 0.f ? 1.f / d : 0.f;
    store_f16(dst + q4_1_layout::d, d);
    store_f16(dst + q4_1_layout::m, r.min);
    std::uint8_t* qs = dst + q4_1_layout::qs;
    for (int j = 0; j < qk / 2; ++j) {
      const int lo = std::min(15, int((src[j] - r.min) * id + 0.5f));
      const int hi = std::min(15, int((src[j + 16] - r.min) * id + 0.5f));
      qs[j] = std::uint8_t(lo | (hi << 4));
    }
  }
}

void quantize_q5_0(const float* src, std::uint8_t* dst, std::int64_t nblocks) {
  std::uint8_t q[qk];
  for (std::int64_t i = 0; i < nblocks; ++i, src += qk, dst += q5_0_layout::bytes) {
    const float d = signed_absmax(src) / -16;
    const float id = d != 0.f ? 1.f / d : 0.f;
    store_f16(dst + q5_0_layout::d, d);
    for (int j = 0; j < qk; ++j) q[j] = std::uint8_t(std::min(31, int(src[j] * id + 16.5f)));
    pack_5bit(q, dst + q5_0_layout::qs, dst + q5_0_layout::qh);
  }
}

void quantize_q5_1(const float* src, std::uint8_t* dst, std::int64_t nblocks) {
  std::uint8_t q[qk];
  for (std::int64_t i = 0; i < nblocks; ++i, src += qk, dst += q5_1_layout::bytes) {
    const min_max r = block_min_max(src);
    const float d = (r.max - r.min) / 31;
    const float id = d != 0.f ? 1.f / d : 0.f;
    store_f16(dst + q5_1_layout::d, d);
    store_f16(dst + q5_1_layout::m, r.min);
    for (int j = 0; j < qk; ++j) q[j] = std::uint8_t(std::min(31, int((src[j] - r.min) * id + 0.5f)));
    pack_5bit(q, dst + q5_1_layout::qs, dst + q5_1_layout::qh);
  }
}

// Symmetric: d = absmax / 127, levels rounded half away from zero.
void quantize_q8_0(const float* src, std::uint8_t* dst, std::int64_t nblocks) {
  for (std::int64_t i = 0; i < nblocks; ++i, src += qk, dst += q8_0_layout::bytes) {
    float amax = 0.f;
    for (int j = 0; j < qk; ++j) amax = std::max(amax, std::fabs(src[j]));
    const float d = amax / 127;
    const float id = d != 0.f ? 1.f / d : 0.f;
    store_f16(dst + q8_0_layout::d, d);
    for (int j = 0; j < qk; ++j) dst[q8_0_layout::qs + j] = std::uint8_t(std::int8_t(std::round(src[j] * id)));
  }
}

}  // namespace anvil::model::quant_detail
