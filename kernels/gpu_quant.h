// Device-side decoding of GGUF weight rows, shared by the GEMV, dequantize and embedding kernels.
// Included only by .hip files. The block layouts are model/quant/quant_blocks.h's, bit for bit; the
// values are the ones model::dequantize_row produces (same float operations, one rounding each).
//
// A row is cut into *chunks*: the piece of a row one thread decodes in one step, into registers.
// A chunk is `runs` runs of `run_len` consecutive elements (so that the activations it multiplies
// load as float4s); run_start(sub, k) is where run k of chunk `sub` starts inside its block.
//   F32/F16/BF16: 8 elements, 16 or 32 bytes, one run of 8.
//   Q8_0: half a block (16 int8), one run of 16.
//   Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4: half the nibble bytes (8 bytes): low nibbles are run 0,
//              high nibbles run 1 (8 each).
//   IQ4_XS: as Q4_0 inside each 32-element sub-block (two chunks per sub-block).
//   Q2_K/Q3_K: 8 bytes of a 128-element half's qs hold elements l..l+7 of its four 32-element
//              groups (bit pairs 0..3); a chunk decodes two groups: run 0 is group 2p, run 1 2p+1.
//   Q4_K/Q5_K: 8 of the 32 bytes of a 64-element pair: low nibbles feed sub-block 2p (run 0),
//              high nibbles sub-block 2p+1 (run 1).
//   Q6_K: 8 bytes of ql: run 0 is group j, run 1 group j+2 of the same half (see quant_k.cpp).
//
// Alignment: the launchers require the matrix base to be 16-byte aligned. F32/F16/BF16 rows
// (in % 8 == 0), Q4_K rows (144-byte blocks) and Q5_K rows (176) are then 16-byte aligned, and
// their loads are 8 or 16 bytes wide; Q5_1 (24) and IQ4_XS (136) blocks are 8-byte aligned, Q4_1
// (20) and Q2_K (84) 4-byte aligned. Q8_0 (34), Q4_0 (18), Q5_0 (22), IQ4_NL (18), Q3_K (110) and
// Q6_K (210) blocks are only 2-byte aligned: their bytes come through load8_a2 / load16_a2, which
// read 4-byte words where the address allows and 2-byte ends where it does not, and never touch a
// byte outside the range. MXFP4 blocks (17 bytes) are byte aligned: their bytes load one by one.
#pragma once

#include <cstdint>

#include "kernels/gpu_runtime.h"
#include "model/quant/quant.h"
#include "model/quant/quant_blocks.h"

namespace anvil::kernels::gpu_quant {

using u8 = std::uint8_t;
using u16 = std::uint16_t;
using u32 = std::uint32_t;

// ---- loads -------------------------------------------------------------------------------------

__device__ __forceinline__ u16 ld_u16(const u8* p) { return *reinterpret_cast<const u16*>(p); }
__device__ __forceinline__ u32 ld_u32(const u8* p) { return *reinterpret_cast<const u32*>(p); }
__device__ __forceinline__ uint2 ld_8(const u8* p) { return *reinterpret_cast<const uint2*>(p); }
__device__ __forceinline__ uint4 ld_16(const u8* p) { return *reinterpret_cast<const uint4*>(p); }

// 8 bytes from a 2-byte aligned address.
__device__ __forceinline__ uint2 load8_a2(const u8* p) {
  if ((reinterpret_cast<std::uintptr_t>(p) & 3u) == 0) return make_uint2(ld_u32(p), ld_u32(p + 4));
  const u32 a = ld_u16(p), b = ld_u32(p + 2), c = ld_u16(p + 6);
  return make_uint2(a | (b << 16), (b >> 16) | (c << 16));
}

// 16 bytes from a 2-byte aligned address.
__device__ __forceinline__ uint4 load16_a2(const u8* p) {
  if ((reinterpret_cast<std::uintptr_t>(p) & 3u) == 0) {
    return make_uint4(ld_u32(p), ld_u32(p + 4), ld_u32(p + 8), ld_u32(p + 12));
  }
  const u32 a = ld_u16(p), b = ld_u32(p + 2), c = ld_u32(p + 6), d = ld_u32(p + 10), e = ld_u16(p + 14);
  return make_uint4(a | (b << 16), (b >> 16) | (c << 16), (c >> 16) | (d << 16), (d >> 16) | (e << 16));
}

// ---- small integers to float without the (quarter-rate) integer converter -----------------------
// 0x4B000000 is 2^23: OR-ing an integer below 2^23 into its mantissa and subtracting 2^23 is exact.
__device__ __forceinline__ float u8_to_float(u32 v) { return __uint_as_float(0x4B000000u | v) - 8388608.f; }
// Byte `i` (0..3) of w as a float.
__device__ __forceinline__ float byte_f(u32 w, int i) { return u8_to_float((w >> (8 * i)) & 0xFFu); }
// Signed byte `i` of w as a float: (b ^ 0x80) - 128.
__device__ __forceinline__ float sbyte_f(u32 w, int i) {
  return __uint_as_float(0x4B000000u | (((w >> (8 * i)) & 0xFFu) ^ 0x80u)) - 8388736.f;
}
__device__ __forceinline__ float f16(u16 h) { return anvil::gpu::half_bits_to_float(h); }
__device__ __forceinline__ float bf16(u32 h) { return __uint_as_float(h << 16); }

__device__ __forceinline__ u32 word_of(uint2 v, int i) { return i == 0 ? v.x : v.y; }
__device__ __forceinline__ u32 word_of(uint4 v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// The 6-bit (scale, min) of sub-block j (0..7) from the 12 scale bytes of a Q4_K/Q5_K block,
// given as the last three words of the block's first 16 bytes (quant_blocks.h k4_scale_min).
__device__ __forceinline__ u32 scale_byte(uint4 head, int k) {  // byte k of the 12 scale bytes
  const u32 w = k < 4 ? head.y : k < 8 ? head.z : head.w;
  return (w >> (8 * (k & 3))) & 0xFFu;
}
__device__ __forceinline__ void k4_scale_min(uint4 head, int j, float& sc, float& mn) {
  if (j < 4) {
    sc = u8_to_float(scale_byte(head, j) & 63u);
    mn = u8_to_float(scale_byte(head, j + 4) & 63u);
  } else {
    sc = u8_to_float((scale_byte(head, j + 4) & 0xFu) | ((scale_byte(head, j - 4) >> 6) << 4));
    mn = u8_to_float((scale_byte(head, j + 4) >> 4) | ((scale_byte(head, j) >> 6) << 4));
  }
}

// ---- formats -------------------------------------------------------------------------------------
// Each: block_elems, block_bytes, chunks (per block), runs, run_len, run_start(sub, k), and
// decode(block, sub, v) writing runs * run_len floats (run 0 first).

struct fmt_f32 {
  static constexpr int block_elems = 8, block_bytes = 32, chunks = 1, runs = 1, run_len = 8;
  __device__ static int run_start(int, int) { return 0; }
  __device__ static void decode(const u8* b, int, float* v) {
    const float4 a = *reinterpret_cast<const float4*>(b), c = *reinterpret_cast<const float4*>(b + 16);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = c.x; v[5] = c.y; v[6] = c.z; v[7] = c.w;
  }
};

struct fmt_f16 {
  static constexpr int block_elems = 8, block_bytes = 16, chunks = 1, runs = 1, run_len = 8;
  __device__ static int run_start(int, int) { return 0; }
  __device__ static void decode(const u8* b, int, float* v) {
    const uint4 q = ld_16(b);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = f16(u16(word_of(q, i / 2) >> (16 * (i & 1))));
  }
};

struct fmt_bf16 {
  static constexpr int block_elems = 8, block_bytes = 16, chunks = 1, runs = 1, run_len = 8;
  __device__ static int run_start(int, int) { return 0; }
  __device__ static void decode(const u8* b, int, float* v) {
    const uint4 q = ld_16(b);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = bf16((word_of(q, i / 2) >> (16 * (i & 1))) & 0xFFFFu);
  }
};

// Q8_0: fp16 d, 32 int8; value = q * d. Chunk = half a block.
struct fmt_q8_0 {
  static constexpr int block_elems = 32, block_bytes = 34, chunks = 2, runs = 1, run_len = 16;
  __device__ static int run_start(int sub, int) { return 16 * sub; }
  __device__ static void decode(const u8* b, int sub, float* v) {
    const float d = f16(ld_u16(b));
    const uint4 q = load16_a2(b + 2 + 16 * sub);
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = sbyte_f(word_of(q, i / 4), i & 3) * d;
  }
};

// Q4_0: fp16 d, 16 bytes; byte j holds element j (low nibble) and j+16 (high); value = (q-8)*d.
struct fmt_q4_0 {
  static constexpr int block_elems = 32, block_bytes = 18, chunks = 2, runs = 2, run_len = 8;
  __device__ static int run_start(int sub, int k) { return 8 * sub + 16 * k; }
  __device__ static void decode(const u8* b, int sub, float* v) {
    const float d = f16(ld_u16(b));
    const uint2 q = load8_a2(b + 2 + 8 * sub);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const u32 byte = (word_of(q, i / 4) >> (8 * (i & 3))) & 0xFFu;
      v[i] = (u8_to_float(byte & 0xFu) - 8.f) * d;
      v[8 + i] = (u8_to_float(byte >> 4) - 8.f) * d;
    }
  }
};

// Q4_K: 144 bytes: d, dmin, 12 scale bytes, 128 bytes of nibbles (32 per 64-element pair p:
// low nibbles are sub-block 2p, high nibbles 2p+1); value = d*sc*q - dmin*m.
// Chunk sub (0..15): pair p = sub/4, bytes 8*(sub%4) .. +8 of the pair.
struct fmt_q4_k {
  static constexpr int block_elems = 256, block_bytes = 144, chunks = 16, runs = 2, run_len = 8;
  __device__ static int run_start(int sub, int k) { return 64 * (sub >> 2) + 32 * k + 8 * (sub & 3); }
  __device__ static void decode(const u8* b, int sub, float* v) {
    const uint4 head = ld_16(b);
    const int p = sub >> 2;
    const uint2 q = ld_8(b + 16 + 32 * p + 8 * (sub & 3));
    const float d = f16(u16(head.x & 0xFFFFu)), dmin = f16(u16(head.x >> 16));
    float sc0, m0, sc1, m1;
    k4_scale_min(head, 2 * p, sc0, m0);
    k4_scale_min(head, 2 * p + 1, sc1, m1);
    const float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const u32 byte = (word_of(q, i / 4) >> (8 * (i & 3))) & 0xFFu;
      v[i] = d0 * u8_to_float(byte & 0xFu) - mm0;
      v[8 + i] = d1 * u8_to_float(byte >> 4) - mm1;
    }
  }
};

// Q5_K: 176 bytes: as Q4_K, plus 32 bytes qh (bit 2p of qh[l] is bit 4 of the low-nibble
// element l of pair p, bit 2p+1 that of the high-nibble one) before the nibbles.
struct fmt_q5_k {
  static constexpr int block_elems = 256, block_bytes = 176, chunks = 16, runs = 2, run_len = 8;
  __device__ static int run_start(int sub, int k) { return 64 * (sub >> 2) + 32 * k + 8 * (sub & 3); }
  __device__ static void decode(const u8* b, int sub, float* v) {
    const uint4 head = ld_16(b);
    const int p = sub >> 2;
    const uint2 hb = ld_8(b + 16 + 8 * (sub & 3));
    const uint2 q = ld_8(b + 48 + 32 * p + 8 * (sub & 3));
    const float d = f16(u16(head.x & 0xFFFFu)), dmin = f16(u16(head.x >> 16));
    float sc0, m0, sc1, m1;
    k4_scale_min(head, 2 * p, sc0, m0);
    k4_scale_min(head, 2 * p + 1, sc1, m1);
    const float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const u32 byte = (word_of(q, i / 4) >> (8 * (i & 3))) & 0xFFu;
      const u32 h = (word_of(hb, i / 4) >> (8 * (i & 3))) >> (2 * p);
      v[i] = d0 * u8_to_float((byte & 0xFu) | ((h & 1u) << 4)) - mm0;
      v[8 + i] = d1 * u8_to_float((byte >> 4) | (((h >> 1) & 1u) << 4)) - mm1;
    }
  }
};

// Q6_K: 210 bytes: ql[128], qh[64], 16 int8 scales, fp16 d; value = d * scale * (q - 32).
// Element 128h + 32g + l (l < 32) takes ql[64h + 32(g&1) + l] (low nibble for g < 2, high for
// g >= 2), bits 2g..2g+1 of qh[32h + l], and scale 8h + 2g + l/16.
// Chunk sub (0..15): half h = sub/8, j = (sub/4)%2, l = 8*(sub%4) .. +8; run 0 is g = j, run 1 g = j+2.
struct fmt_q6_k {
  static constexpr int block_elems = 256, block_bytes = 210, chunks = 16, runs = 2, run_len = 8;
  __device__ static int run_start(int sub, int k) {
    return 128 * (sub >> 3) + 32 * (((sub >> 2) & 1) + 2 * k) + 8 * (sub & 3);
  }
  __device__ static void decode(const u8* b, int sub, float* v) {
    const int h = sub >> 3, j = (sub >> 2) & 1, l0 = 8 * (sub & 3);
    const uint2 ql = load8_a2(b + 64 * h + 32 * j + l0);
    const uint2 qh = load8_a2(b + 128 + 32 * h + l0);
    const float d = f16(ld_u16(b + 208));
    const int s = 192 + 8 * h + (l0 >> 4);
    const float d0 = d * float(static_cast<std::int8_t>(b[s + 2 * j]));
    const float d1 = d * float(static_cast<std::int8_t>(b[s + 2 * (j + 2)]));
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const u32 lo = (word_of(ql, i / 4) >> (8 * (i & 3))) & 0xFFu;
      const u32 hi = (word_of(qh, i / 4) >> (8 * (i & 3))) & 0xFFu;
      v[i] = d0 * (u8_to_float((lo & 0xFu) | (((hi >> (2 * j)) & 3u) << 4)) - 32.f);
      v[8 + i] = d1 * (u8_to_float((lo >> 4) | (((hi >> (2 * j + 4)) & 3u) << 4)) - 32.f);
    }
  }
};

// Q4_1: fp16 d, fp16 m, 16 bytes as Q4_0; value = q * d + m.
struct fmt_q4_1 {
  static constexpr int block_elems = 32, block_bytes = 20, chunks = 2, runs = 2, run_len = 8;
  __device__ static int run_start(int sub, int k) { return 8 * sub + 16 * k; }
  __device__ static void decode(const u8* b, int sub, float* v) {
    const u32 dm = ld_u32(b);
    const float d = f16(u16(dm & 0xFFFFu)), m = f16(u16(dm >> 16));
    const uint2 q = make_uint2(ld_u32(b + 4 + 8 * sub), ld_u32(b + 8 + 8 * sub));
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const u32 byte = (word_of(q, i / 4) >> (8 * (i & 3))) & 0xFFu;
      v[i] = u8_to_float(byte & 0xFu) * d + m;
      v[8 + i] = u8_to_float(byte >> 4) * d + m;
    }
  }
};

// The fifth bits of a Q5_0/Q5_1 chunk: bit j of qh is bit 4 of element j (j < 32); the chunk's
// run 0 is elements 8 sub.., run 1 16 + 8 sub...
__device__ __forceinline__ void q5_decode(u32 qh, uint2 q, int sub, float d, float m, float offset, float* v) {
  const u32 h0 = qh >> (8 * sub), h1 = qh >> (16 + 8 * sub);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const u32 byte = (word_of(q, i / 4) >> (8 * (i & 3))) & 0xFFu;
    v[i] = (u8_to_float((byte & 0xFu) | (((h0 >> i) & 1u) << 4)) - offset) * d + m;
    v[8 + i] = (u8_to_float((byte >> 4) | (((h1 >> i) & 1u) << 4)) - offset) * d + m;
  }
}

// Q5_0: fp16 d, uint32 qh, 16 bytes of low nibbles as Q4_0; value = (q - 16) * d.
struct fmt_q5_0 {
  static constexpr int block_elems = 32, block_bytes = 22, chunks = 2, runs = 2, run_len = 8;
  __device__ static int run_start(int sub, int k) { return 8 * sub + 16 * k; }
  __device__ static void decode(const u8* b, int sub, float* v) {
    const float d = f16(ld_u16(b));
    const u32 qh = u32(ld_u16(b + 2)) | (u32(ld_u16(b + 4)) << 16);
    q5_decode(qh, load8_a2(b + 6 + 8 * sub), sub, d, 0.f, 16.f, v);
  }
};

// Q5_1: fp16 d, fp16 m, uint32 qh, 16 bytes of low nibbles; value = q * d + m.
struct fmt_q5_1 {
  static constexpr int block_elems = 32, block_bytes = 24, chunks = 2, runs = 2, run_len = 8;
  __device__ static int run_start(int sub, int k) { return 8 * sub + 16 * k; }
  __device__ static void decode(const u8* b, int sub, float* v) {
    const uint2 head = ld_8(b);
    const float d = f16(u16(head.x & 0xFFFFu)), m = f16(u16(head.x >> 16));
    q5_decode(head.y, ld_8(b + 8 + 8 * sub), sub, d, m, 0.f, v);
  }
};

// Q2_K / Q3_K chunks: sub (0..15) is half h = sub / 8, group pair p = (sub / 4) % 2 and bytes
// l0 = 8 (sub % 4) .. +8 of the half's 32 qs bytes; run k is group j = 2p + k (bits 2j, 2j + 1),
// elements 128 h + 32 j + l0 ..; its 16-element scale is 8 h + 2 j + l0 / 16.
struct k23_chunk {
  int h, p, l0;
  __device__ explicit k23_chunk(int sub) : h(sub >> 3), p((sub >> 2) & 1), l0(8 * (sub & 3)) {}
  __device__ int scale(int k) const { return 8 * h + 2 * (2 * p + k) + (l0 >> 4); }
};

// Q2_K: 16 scale bytes (low nibble scale, high nibble min), 64 qs bytes, fp16 d, fp16 dmin;
// value = d * scale * q - dmin * min.
struct fmt_q2_k {
  static constexpr int block_elems = 256, block_bytes = 84, chunks = 16, runs = 2, run_len = 8;
  __device__ static int run_start(int sub, int k) {
    const k23_chunk c(sub);
    return 128 * c.h + 32 * (2 * c.p + k) + c.l0;
  }
  __device__ static void decode(const u8* b, int sub, float* v) {
    const k23_chunk c(sub);
    const uint2 q = make_uint2(ld_u32(b + 16 + 32 * c.h + c.l0), ld_u32(b + 20 + 32 * c.h + c.l0));
    const u32 dd = ld_u32(b + 80);
    const float d = f16(u16(dd & 0xFFFFu)), dmin = f16(u16(dd >> 16));
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const u32 sc = b[c.scale(k)];
      const float dl = d * u8_to_float(sc & 0xFu), ml = dmin * u8_to_float(sc >> 4);
      const int shift = 2 * (2 * c.p + k);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const u32 byte = (word_of(q, i / 4) >> (8 * (i & 3))) & 0xFFu;
        v[8 * k + i] = dl * u8_to_float((byte >> shift) & 3u) - ml;
      }
    }
  }
};

// Q3_K: 32 hmask bytes (bit 4h + j of hmask[l]: bit 2 of element 128 h + 32 j + l, stored
// inverted: clear subtracts 4), 64 qs bytes (low 2 bits, as Q2_K), 12 bytes of 16 six-bit scales
// biased by 32, fp16 d; value = d * (scale - 32) * (low - 4 * !bit).
struct fmt_q3_k {
  static constexpr int block_elems = 256, block_bytes = 110, chunks = 16, runs = 2, run_len = 8;
  __device__ static int run_start(int sub, int k) { return fmt_q2_k::run_start(sub, k); }
  __device__ static void decode(const u8* b, int sub, float* v) {
    const k23_chunk c(sub);
    const uint2 q = load8_a2(b + 32 + 32 * c.h + c.l0);
    const uint2 hm = load8_a2(b + c.l0);
    const float d = f16(ld_u16(b + 108));
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int s = c.scale(k);
      const u32 low = s < 8 ? b[96 + s] & 0xFu : u32(b[96 + s - 8]) >> 4;
      const u32 high = (u32(b[104 + s % 4]) >> (2 * (s / 4))) & 3u;
      const float dl = d * (u8_to_float(low | (high << 4)) - 32.f);
      const int j = 2 * c.p + k, hbit = 4 * c.h + j;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const u32 byte = (word_of(q, i / 4) >> (8 * (i & 3))) & 0xFFu;
        const u32 hb = (word_of(hm, i / 4) >> (8 * (i & 3) + hbit)) & 1u;
        v[8 * k + i] = dl * (u8_to_float((byte >> (2 * j)) & 3u) - (hb ? 0.f : 4.f));
      }
    }
  }
};

// 16 signed levels as four words of bytes (level i is byte i % 4 of word i / 4).
struct level_table {
  u32 w[4];
};
constexpr u32 pack_levels(const std::int8_t* t, int i) {
  return u32(u8(t[i])) | (u32(u8(t[i + 1])) << 8) | (u32(u8(t[i + 2])) << 16) | (u32(u8(t[i + 3])) << 24);
}
// The levels at the four indices held in the low nibbles of q's bytes (q & 0x0F0F0F0F), as
// four int8 bytes: a byte permute picks from the table's first or second half, a mask from bit 3.
__device__ __forceinline__ u32 lookup_levels(const level_table& t, u32 q) {
  const u32 sel = (q & 0x7u) | ((q >> 4) & 0x70u) | ((q >> 8) & 0x700u) | ((q >> 12) & 0x7000u);
  const u32 lo = __byte_perm(t.w[0], t.w[1], sel), hi = __byte_perm(t.w[2], t.w[3], sel);
  const u32 mask = ((q & 0x08080808u) >> 3) * 0xFFu;
  return (lo & ~mask) | (hi & mask);
}
inline constexpr u32 iq4_w0 = pack_levels(model::quant_detail::iq4_levels, 0);
inline constexpr u32 iq4_w1 = pack_levels(model::quant_detail::iq4_levels, 4);
inline constexpr u32 iq4_w2 = pack_levels(model::quant_detail::iq4_levels, 8);
inline constexpr u32 iq4_w3 = pack_levels(model::quant_detail::iq4_levels, 12);
inline constexpr u32 fp4_w0 = pack_levels(model::quant_detail::fp4_levels, 0);
inline constexpr u32 fp4_w1 = pack_levels(model::quant_detail::fp4_levels, 4);
inline constexpr u32 fp4_w2 = pack_levels(model::quant_detail::fp4_levels, 8);
inline constexpr u32 fp4_w3 = pack_levels(model::quant_detail::fp4_levels, 12);
__device__ __forceinline__ level_table iq4_table() { return {{iq4_w0, iq4_w1, iq4_w2, iq4_w3}}; }
__device__ __forceinline__ level_table fp4_table() { return {{fp4_w0, fp4_w1, fp4_w2, fp4_w3}}; }

// Eight nibble bytes (two words) through a level table, scaled: v[i] the low nibble of byte i,
// v[8 + i] the high one.
__device__ __forceinline__ void decode_levels(const level_table& t, uint2 q, float d, float* v) {
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    const u32 word = word_of(q, w);
    const u32 lo = lookup_levels(t, word & 0x0F0F0F0Fu), hi = lookup_levels(t, (word >> 4) & 0x0F0F0F0Fu);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[4 * w + i] = d * sbyte_f(lo, i);
      v[8 + 4 * w + i] = d * sbyte_f(hi, i);
    }
  }
}

// IQ4_NL: fp16 d, 16 bytes of nibbles as Q4_0; value = d * iq4_levels[q].
struct fmt_iq4_nl {
  static constexpr int block_elems = 32, block_bytes = 18, chunks = 2, runs = 2, run_len = 8;
  __device__ static int run_start(int sub, int k) { return 8 * sub + 16 * k; }
  __device__ static void decode(const u8* b, int sub, float* v) {
    decode_levels(iq4_table(), load8_a2(b + 2 + 8 * sub), f16(ld_u16(b)), v);
  }
};

// IQ4_XS: fp16 d, uint16 scales_h, 4 bytes scales_l, then 16 nibble bytes per 32-element
// sub-block ib (as Q4_0); value = d * (scale_ib - 32) * iq4_levels[q]. Chunk sub: ib = sub / 2,
// bytes 8 (sub % 2) .. +8 of its 16.
struct fmt_iq4_xs {
  static constexpr int block_elems = 256, block_bytes = 136, chunks = 16, runs = 2, run_len = 8;
  __device__ static int run_start(int sub, int k) { return 32 * (sub >> 1) + 8 * (sub & 1) + 16 * k; }
  __device__ static void decode(const u8* b, int sub, float* v) {
    const uint2 head = ld_8(b);
    const int ib = sub >> 1;
    const u32 ls = ((head.y >> (4 * ib)) & 0xFu) | (((head.x >> (16 + 2 * ib)) & 3u) << 4);
    const float d = f16(u16(head.x & 0xFFFFu)) * (u8_to_float(ls) - 32.f);
    decode_levels(iq4_table(), ld_8(b + 8 + 16 * ib + 8 * (sub & 1)), d, v);
  }
};

// 2^(e - 128) for an E8M0 exponent byte, exactly (e < 2: a subnormal).
__device__ __forceinline__ float e8m0_half(u32 e) { return __uint_as_float(e >= 2 ? (e - 1) << 23 : 0x00200000u << e); }

// MXFP4: an E8M0 exponent byte, 16 bytes of nibbles as Q4_0; value = 2^(e - 128) * fp4_levels[q]
// (the E2M1 values doubled). Byte-aligned blocks: the bytes load one by one.
struct fmt_mxfp4 {
  static constexpr int block_elems = 32, block_bytes = 17, chunks = 2, runs = 2, run_len = 8;
  __device__ static int run_start(int sub, int k) { return 8 * sub + 16 * k; }
  __device__ static void decode(const u8* b, int sub, float* v) {
    const u8* q = b + 1 + 8 * sub;
    const uint2 w = make_uint2(u32(q[0]) | (u32(q[1]) << 8) | (u32(q[2]) << 16) | (u32(q[3]) << 24),
                               u32(q[4]) | (u32(q[5]) << 8) | (u32(q[6]) << 16) | (u32(q[7]) << 24));
    decode_levels(fp4_table(), w, e8m0_half(b[0]), v);
  }
};

// ---- host-side dispatch ----------------------------------------------------------------------------

// Calls fn(fmt_x{}) for the format of `t` and returns true; false (fn not called) for a type the
// GPU kernels do not decode.
template <class Fn>
bool with_format(model::ggml_type t, Fn&& fn) {
  using model::ggml_type;
  switch (t) {
    case ggml_type::F32: fn(fmt_f32{}); return true;
    case ggml_type::F16: fn(fmt_f16{}); return true;
    case ggml_type::BF16: fn(fmt_bf16{}); return true;
    case ggml_type::Q8_0: fn(fmt_q8_0{}); return true;
    case ggml_type::Q4_0: fn(fmt_q4_0{}); return true;
    case ggml_type::Q4_K: fn(fmt_q4_k{}); return true;
    case ggml_type::Q5_K: fn(fmt_q5_k{}); return true;
    case ggml_type::Q6_K: fn(fmt_q6_k{}); return true;
    case ggml_type::Q4_1: fn(fmt_q4_1{}); return true;
    case ggml_type::Q5_0: fn(fmt_q5_0{}); return true;
    case ggml_type::Q5_1: fn(fmt_q5_1{}); return true;
    case ggml_type::Q2_K: fn(fmt_q2_k{}); return true;
    case ggml_type::Q3_K: fn(fmt_q3_k{}); return true;
    case ggml_type::IQ4_NL: fn(fmt_iq4_nl{}); return true;
    case ggml_type::IQ4_XS: fn(fmt_iq4_xs{}); return true;
    case ggml_type::MXFP4: fn(fmt_mxfp4{}); return true;
    default: return false;
  }
}

// Elements per format block (the row length must be a multiple), 0 for unsupported types.
inline std::int64_t gpu_block_elems(model::ggml_type t) {
  std::int64_t n = 0;
  with_format(t, [&](auto f) { n = decltype(f)::block_elems; });
  return n;
}

// The alignment a block start keeps in a 16-byte aligned matrix (gcd(block bytes, 16)): what the
// decoders assume, so a stack of matrices whose stride is a multiple of it decodes as one.
inline std::size_t gpu_block_align(model::ggml_type t) {
  std::size_t a = 0;
  with_format(t, [&](auto f) {
    a = 16;
    while (decltype(f)::block_bytes % a != 0) a /= 2;
  });
  return a;
}

using gpu::aligned16;

}  // namespace anvil::kernels::gpu_quant
