// Quant formats: the GGML tensor element types as they lie in a GGUF file, bit-exact with
// ggml/llama.cpp, because anvil reads the files people download. For each type: its name and
// block geometry (type_info), the bytes a row takes (row_bytes), dequantization to float, the
// reference quantizers (for writing GGUF files and for tests), and vec_dot_row, the dot product
// of one quantized row with a float vector that the CPU forward pass runs for every matmul.
//
// A quantized row is a sequence of blocks; each block holds block_elems elements in block_bytes
// bytes (scales first or last, then packed integers). Rows are read as bytes, so they need no
// alignment. Host byte order must be little-endian, like the files. Nothing here keeps state:
// every function may be called from any number of threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace anvil::model {

// The values are GGUF's on-disk numbers and must never change. Gaps (4, 5, 31..33, 36..38) are
// types ggml has removed; find_type() answers nullptr for them.
enum class ggml_type : std::uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  // The i-quants with grid codebooks, the ternary and the integer types are known so that a
  // loader can name them in its error; anvil cannot dequantize them. IQ4_NL, IQ4_XS and MXFP4
  // (table-of-levels types) it can.
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

struct type_info {
  std::string_view name;     // "F32", "Q4_K", ... as gguf-dump prints them
  std::int64_t block_elems;  // elements per block (1 for F32/F16/BF16, 32 for Q8_0/Q4_0, 256 for K-quants)
  std::size_t block_bytes;   // bytes per block
  bool supported;            // anvil can dequantize it (and so vec_dot_row it)
};

// nullptr for values GGUF does not define.
const type_info* find_type(std::uint32_t raw) noexcept;

// Precondition: t is a known type (throws std::invalid_argument otherwise).
const type_info& info(ggml_type t);

// Bytes taken by n elements of type t: nullopt if t is unknown, n < 0, n is not a multiple of
// the block, or the size overflows size_t.
std::optional<std::size_t> row_bytes(ggml_type t, std::int64_t n) noexcept;

// Supported types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
// n must be >= 0 and a multiple of the block; a violation is a caller bug and throws
// std::invalid_argument naming the type and n (the GGUF loader validates before calling).
void dequantize_row(ggml_type t, const void* src, float* dst, std::int64_t n);

// dot(dequantize(row), x) without allocating: dequantizes 256 elements at a time into a stack
// buffer and multiplies-adds them into float lanes; chunk sums are added in double. Same types
// and preconditions as dequantize_row.
float vec_dot_row(ggml_type t, const void* row, const float* x, std::int64_t n);

// Reference quantizers, deterministic, in the manner of ggml's quantize_row_*_ref: F16, BF16,
// Q8_0 and the legacy types give ggml's bytes; Q2_K, Q4_K, Q5_K and Q6_K search each sub-block's
// scale (and min) the way ggml does; Q3_K uses Q6_K's weighted search where ggml iterates
// per element. Available for every supported type (has_quantizer() says which); same
// preconditions as dequantize_row, and src must be finite.
bool has_quantizer(ggml_type t) noexcept;
void quantize_row(ggml_type t, const float* src, void* dst, std::int64_t n);

// IEEE binary16 <-> binary32. f32_to_f16 rounds to nearest even, overflows to infinity, produces
// subnormals, and keeps NaNs NaN (payload kept where it fits, quiet bit set if it would be lost).
float f16_to_f32(std::uint16_t h) noexcept;
std::uint16_t f32_to_f16(float f) noexcept;

// bfloat16 (the top half of a binary32) <-> binary32. f32_to_bf16 rounds to nearest even and
// turns any NaN into a quiet NaN (as ggml does), never into infinity.
float bf16_to_f32(std::uint16_t h) noexcept;
std::uint16_t f32_to_bf16(float f) noexcept;

}  // namespace anvil::model
