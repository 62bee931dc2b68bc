// The type table, half-precision conversions, and the row-level entry points: each validates
// its arguments, then hands whole blocks to the per-type kernels in quant_legacy.cpp and
// quant_k*.cpp (dispatched through one table indexed by the GGUF type number).
#include "model/quant/quant.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "model/quant/quant_blocks.h"

namespace anvil::model {
namespace {

using namespace quant_detail;

// ---- float formats as one-element "blocks" ----------------------------------------------------

void dequantize_f32(const std::uint8_t* src, float* dst, std::int64_t n) {
  std::memcpy(dst, src, std::size_t(n) * sizeof(float));
}
// The F16/BF16 loops go 16 at a time (a fixed count GCC's -O2 cost model vectorises), then
// finish one at a time.
constexpr int float_run = 16;

std::uint16_t load_u16(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return h;
}
void dequantize_f16(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + float_run <= n; i += float_run) {
    for (int k = 0; k < float_run; ++k) dst[i + k] = decode_f16(load_u16(src + 2 * (i + k)));
  }
  for (; i < n; ++i) dst[i] = decode_f16(load_u16(src + 2 * i));
}
void dequantize_bf16(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + float_run <= n; i += float_run) {
    for (int k = 0; k < float_run; ++k) dst[i + k] = bf16_to_f32(load_u16(src + 2 * (i + k)));
  }
  for (; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
}
void quantize_f32(const float* src, std::uint8_t* dst, std::int64_t n) {
  std::memcpy(dst, src, std::size_t(n) * sizeof(float));
}
void quantize_f16(const float* __restrict src, std::uint8_t* __restrict dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) store_f16(dst + 2 * i, src[i]);
}
void quantize_bf16(const float* __restrict src, std::uint8_t* __restrict dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint16_t h = f32_to_bf16(src[i]);
    std::memcpy(dst + 2 * i, &h, sizeof h);
  }
}

// ---- the table ----------------------------------------------------------------------------------

struct type_entry {
  type_info info;
  dequantize_fn dequantize = nullptr;  // null: not supported
  quantize_fn quantize = nullptr;      // null: no reference quantizer
};

constexpr std::size_t type_table_size = 40;  // one past the largest GGUF type number listed

constexpr std::array<type_entry, type_table_size> make_type_table() {
  std::array<type_entry, type_table_size> t{};
  // (`supported` is spelled out: comparing a function's address with null is not a constant
  // expression under the sanitizers.)
  auto supported = [&t](ggml_type ty, std::string_view name, std::int64_t elems, std::size_t bytes,
                        dequantize_fn dq, quantize_fn q) {
    t[std::size_t(ty)] = {{name, elems, bytes, true}, dq, q};
  };
  auto known = [&t](ggml_type ty, std::string_view name, std::int64_t elems, std::size_t bytes) {
    t[std::size_t(ty)] = {{name, elems, bytes, false}, nullptr, nullptr};
  };
  using enum ggml_type;
  supported(F32, "F32", 1, 4, dequantize_f32, quantize_f32);
  supported(F16, "F16", 1, 2, dequantize_f16, quantize_f16);
  supported(BF16, "BF16", 1, 2, dequantize_bf16, quantize_bf16);
  supported(Q4_0, "Q4_0", qk, q4_0_layout::bytes, dequantize_q4_0, quantize_q4_0);
  supported(Q4_1, "Q4_1", qk, q4_1_layout::bytes, dequantize_q4_1, quantize_q4_1);
  supported(Q5_0, "Q5_0", qk, q5_0_layout::bytes, dequantize_q5_0, quantize_q5_0);
  supported(Q5_1, "Q5_1", qk, q5_1_layout::bytes, dequantize_q5_1, quantize_q5_1);
  supported(Q8_0, "Q8_0", qk, q8_0_layout::bytes, dequantize_q8_0, quantize_q8_0);
  supported(Q2_K, "Q2_K", qk_k, q2_k_layout::bytes, dequantize_q2_k, quantize_q2_k);
  supported(Q3_K, "Q3_K", qk_k, q3_k_layout::bytes, dequantize_q3_k, quantize_q3_k);
  supported(Q4_K, "Q4_K", qk_k, q4_k_layout::bytes, dequantize_q4_k, quantize_q4_k);
  supported(Q5_K, "Q5_K", qk_k, q5_k_layout::bytes, dequantize_q5_k, quantize_q5_k);
  supported(Q6_K, "Q6_K", qk_k, q6_k_layout::bytes, dequantize_q6_k, quantize_q6_k);
  supported(IQ4_NL, "IQ4_NL", qk, iq4_nl_layout::bytes, dequantize_iq4_nl, quantize_iq4_nl);
  supported(IQ4_XS, "IQ4_XS", qk_k, iq4_xs_layout::bytes, dequantize_iq4_xs, quantize_iq4_xs);
  supported(MXFP4, "MXFP4", qk, mxfp4_layout::bytes, dequantize_mxfp4, quantize_mxfp4);
  // Known, not supported: the dot-product intermediates (never in model files), the i-quants
  // with grid codebooks, the ternary types, and the integer and F64 tensors.
  known(Q8_1, "Q8_1", qk, 36);  // fp16 d, fp16 s = d * sum(q), 32 int8
  known(Q8_K, "Q8_K", qk_k, 292);  // f32 d, 256 int8, 16 int16 block sums
  known(IQ2_XXS, "IQ2_XXS", qk_k, 66);
  known(IQ2_XS, "IQ2_XS", qk_k, 74);
  known(IQ3_XXS, "IQ3_XXS", qk_k, 98);
  known(IQ1_S, "IQ1_S", qk_k, 50);
  known(IQ3_S, "IQ3_S", qk_k, 110);
  known(IQ2_S, "IQ2_S", qk_k, 82);
  known(IQ1_M, "IQ1_M", qk_k, 56);
  known(TQ1_0, "TQ1_0", qk_k, 54);
  known(TQ2_0, "TQ2_0", qk_k, 66);
  known(I8, "I8", 1, 1);
  known(I16, "I16", 1, 2);
  known(I32, "I32", 1, 4);
  known(I64, "I64", 1, 8);
  known(F64, "F64", 1, 8);
  return t;
}

constexpr std::array<type_entry, type_table_size> type_table = make_type_table();

const type_entry* find_entry(std::uint32_t raw) noexcept {
  if (raw >= type_table.size() || type_table[raw].info.name.empty()) return nullptr;
  return &type_table[raw];
}

std::string type_name(ggml_type t) {
  const type_entry* e = find_entry(std::uint32_t(t));
  return e ? std::string(e->info.name) : "type " + std::to_string(std::uint32_t(t));
}

// The checks every row entry point makes; returns the entry. `what` names the caller.
const type_entry& checked_entry(const char* what, ggml_type t, std::int64_t n, bool need_quantizer) {
  const type_entry* e = find_entry(std::uint32_t(t));
  const bool usable = e && (need_quantizer ? e->quantize != nullptr : e->dequantize != nullptr);
  if (!usable) {
    throw std::invalid_argument(std::string(what) + ": " + type_name(t) + " is not supported (n=" +
                                std::to_string(n) + ")");
  }
  if (n < 0 || n % e->info.block_elems != 0) {
    throw std::invalid_argument(std::string(what) + ": n=" + std::to_string(n) + " is not a multiple of the " +
                                type_name(t) + " block (" + std::to_string(e->info.block_elems) + ")");
  }
  return *e;
}

// ---- dot product ----------------------------------------------------------------------------------

constexpr std::int64_t dot_chunk_elems = qk_k;  // elements dequantized per step of vec_dot_row

// Sixteen independent float lanes: the inner loop is a plain multiply-add per lane, which GCC
// vectorises without -ffast-math (no reassociation of a single accumulator needed).
float dot_f32(const float* __restrict a, const float* __restrict b, std::int64_t n) {
  constexpr int lanes = 16;
  float acc[lanes] = {};
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
#pragma GCC unroll 16
    for (int k = 0; k < lanes; ++k) acc[k] += a[i + k] * b[i + k];
  }
  float tail = 0.f;
  for (; i < n; ++i) tail += a[i] * b[i];
  for (int w = lanes / 2; w > 0; w /= 2) {
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  }
  return acc[0] + tail;
}

}  // namespace

// ---- type queries -----------------------------------------------------------------------------

const type_info* find_type(std::uint32_t raw) noexcept {
  const type_entry* e = find_entry(raw);
  return e ? &e->info : nullptr;
}

const type_info& info(ggml_type t) {
  const type_info* i = find_type(std::uint32_t(t));
  if (!i) throw std::invalid_argument("info: unknown ggml type " + std::to_string(std::uint32_t(t)));
  return *i;
}

std::optional<std::size_t> row_bytes(ggml_type t, std::int64_t n) noexcept {
  const type_info* i = find_type(std::uint32_t(t));
  if (!i || n < 0 || n % i->block_elems != 0) return std::nullopt;
  const auto blocks = std::uint64_t(n / i->block_elems);
  if (blocks > std::numeric_limits<std::size_t>::max() / i->block_bytes) return std::nullopt;
  return std::size_t(blocks) * i->block_bytes;
}

bool has_quantizer(ggml_type t) noexcept {
  const type_entry* e = find_entry(std::uint32_t(t));
  return e && e->quantize;
}

// ---- rows -----------------------------------------------------------------------------------------

void dequantize_row(ggml_type t, const void* src, float* dst, std::int64_t n) {
  const type_entry& e = checked_entry("dequantize_row", t, n, false);
  if (n == 0) return;  // src and dst may be null
  e.dequantize(static_cast<const std::uint8_t*>(src), dst, n / e.info.block_elems);
}

void quantize_row(ggml_type t, const float* src, void* dst, std::int64_t n) {
  const type_entry& e = checked_entry("quantize_row", t, n, true);
  if (n == 0) return;
  e.quantize(src, static_cast<std::uint8_t*>(dst), n / e.info.block_elems);
}

float vec_dot_row(ggml_type t, const void* row, const float* x, std::int64_t n) {
  const type_entry& e = checked_entry("vec_dot_row", t, n, false);
  // Every block size (1, 32, 256) divides the chunk, so a chunk is whole blocks.
  const std::int64_t blocks_per_chunk = dot_chunk_elems / e.info.block_elems;
  const auto* src = static_cast<const std::uint8_t*>(row);
  float buf[dot_chunk_elems];
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; i += dot_chunk_elems) {
    const std::int64_t elems = std::min(dot_chunk_elems, n - i);
    const std::int64_t blocks = elems / e.info.block_elems;
    e.dequantize(src, buf, blocks);
    sum += double(dot_f32(buf, x + i, elems));
    src += std::size_t(blocks_per_chunk) * e.info.block_bytes;
  }
  return float(sum);
}

// ---- half precision -------------------------------------------------------------------------------

float f16_to_f32(std::uint16_t h) noexcept { return quant_detail::decode_f16(h); }

std::uint16_t f32_to_f16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = std::uint16_t((x >> 16) & 0x8000u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: keep the payload's top bits; if none survive, set the quiet bit
    const std::uint32_t payload = (abs >> 13) & 0x3ffu;
    return std::uint16_t(sign | 0x7c00u | (payload ? payload : 0x200u));
  }
  // 65520 is half-way between 65504 (the largest half, odd mantissa) and 2^16: it and anything
  // above round to infinity.
  if (abs >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);
  if (abs >= 0x38800000u) {  // normal half: round the 13 dropped bits to nearest even, rebias
    const std::uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
    return std::uint16_t(sign | ((rounded - (112u << 23)) >> 13));
  }
  // Subnormal half (or zero): the result counts units of 2^-24. Below 2^-25 that is 0.
  const std::uint32_t exp = abs >> 23;
  if (exp < 102) return sign;
  const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126 - exp;  // 14..24
  std::uint32_t q = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1);
  const std::uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into the smallest normal: right
  return std::uint16_t(sign | q);
}

float bf16_to_f32(std::uint16_t h) noexcept { return std::bit_cast<float>(std::uint32_t(h) << 16); }

std::uint16_t f32_to_bf16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((x >> 16) | 0x40u);  // quiet NaN
  return std::uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace anvil::model
