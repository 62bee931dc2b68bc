// Integer dot products of GGUF weight blocks with activations quantized to 8 bits, for the GEMV
// (kernels/gemv.hip). Included only by .hip files.
//
// Activations (x8 below): each run of 16 consecutive elements of a token's x shares one scale:
// every 32-element block b has d = max|x| / 127 and q = rint(x / d) (int8, in xq[in]), and each
// half-block h (16 elements) stores {d, d * sum(q)} in ds[2b + h]. The weight formats then dot
// their integers with q using dp4a (gpu::dot4_i8) and apply the scales once per 16 or 32
// elements; the stored sums carry the constant parts of a weight (K-quant mins, Q4_0's -8,
// Q6_K's -32). The result is the exact dot product of the dequantized weight with the rounded
// activations, up to float rounding of the per-block terms.
//
// Each format splits a block into `slices`, one per lane and step:
//   load(block, s) -> w_t     the raw bytes (issued for every row and step before any math)
//   decode(w, s)   -> dec_t   unpacked integers and per-slice float scales (once per row)
//   load_x(x, blk, s) -> x_t  the activations the slice multiplies (once per token)
//   dot(dec, x)    -> float   the slice's contribution
// Q4_K/Q5_K/Q6_K slices are 32 bytes of packed quants (64 elements: two runs of 32 in different
// sub-blocks, four lanes per block); the 32-element block types' slices are whole blocks.
//
// Alignment: Q4_K and Q5_K blocks are 16-byte aligned (the launcher requires the matrix to be);
// Q8_0 (34 bytes), Q4_0 (18) and Q6_K (210) blocks only 2-byte aligned: load_a2 reads exactly
// the bytes asked for with 4-byte loads and one 2-byte load, without branching on the alignment.
#pragma once

#include "kernels/gpu_quant.h"

namespace anvil::kernels::gpu_quant {

using i8 = std::int8_t;

// One token's quantized activations: xq[in] and ds[in / 16] (see above).
struct x8_view {
  const i8* xq;
  const float2* ds;
};

// Rounds activations to the x8 form above, four consecutive elements per lane: lanes work in
// aligned groups of 8 that hold one 32-element block together (lane % 8 holds elements
// 4 * (lane % 8) .. of it), so `i`, the row index of v.x, must satisfy (i / 4) % 8 == lane % 8.
// Every lane of the warp must call it (it shuffles); a group with `valid` false stores nothing.
// The kernels that produce a GEMV's input (RMSNorm, SwiGLU) call it so that the GEMV need not
// quantize; quantize_x_kernel (gemv.hip) is it on its own.
__device__ __forceinline__ void quantize_x8(float4 v, std::int64_t i, bool valid, i8* xq, float2* ds) {
  if (!valid) v = make_float4(0.f, 0.f, 0.f, 0.f);
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
  amax = fmaxf(amax, gpu::shfl_xor(amax, 1));
  amax = fmaxf(amax, gpu::shfl_xor(amax, 2));
  amax = fmaxf(amax, gpu::shfl_xor(amax, 4));
  const float d = amax / 127.f;
  const float id = d > 0.f ? 1.f / d : 0.f;
  const int q0 = int(rintf(v.x * id)), q1 = int(rintf(v.y * id)), q2 = int(rintf(v.z * id)), q3 = int(rintf(v.w * id));
  int sum = q0 + q1 + q2 + q3;
  sum += gpu::shfl_xor(sum, 1);
  sum += gpu::shfl_xor(sum, 2);
  if (!valid) return;
  *reinterpret_cast<u32*>(xq + i) = (u32(q0) & 0xFFu) | ((u32(q1) & 0xFFu) << 8) | ((u32(q2) & 0xFFu) << 16) | (u32(q3) << 24);
  if ((i / 4) % 4 == 0) ds[i / 16] = make_float2(d, d * float(sum));
}

// The 4N + 2 bytes at the 2-byte aligned p as N + 1 words (the last holds 2 bytes).
template <int N>
__device__ __forceinline__ void load_a2(const u8* p, u32 (&o)[N + 1]) {
  const bool mis = (reinterpret_cast<std::uintptr_t>(p) & 2u) != 0;
  const u32* w = reinterpret_cast<const u32*>(p + (mis ? 2 : 0));
  const u32 h = ld_u16(mis ? p : p + 4 * N);
  u32 r[N];
#pragma unroll
  for (int k = 0; k < N; ++k) r[k] = w[k];
  // Aligned: the bytes are r[0..N-1] then h; misaligned: h then r[0..N-1].
  o[0] = mis ? (h | (r[0] << 16)) : r[0];
#pragma unroll
  for (int k = 1; k < N; ++k) o[k] = mis ? ((r[k - 1] >> 16) | (r[k] << 16)) : r[k];
  o[N] = mis ? (r[N - 1] >> 16) : h;
}

// Word k of the bytes starting 2 bytes into o (o as load_a2 returns it).
template <int N>
__device__ __forceinline__ u32 word_at2(const u32 (&o)[N + 1], int k) {
  return (o[k] >> 16) | (o[k + 1] << 16);
}

__device__ __forceinline__ int dot16(const u32 (&w)[4], int4 x) {
  int s = gpu::dot4_i8(int(w[0]), x.x, 0);
  s = gpu::dot4_i8(int(w[1]), x.y, s);
  s = gpu::dot4_i8(int(w[2]), x.z, s);
  return gpu::dot4_i8(int(w[3]), x.w, s);
}

__device__ __forceinline__ int4 ld_i4(const i8* p) { return *reinterpret_cast<const int4*>(p); }

// Activations of two runs of 16 (element offsets e0, e1, multiples of 16).
struct x_two_runs {
  int4 q0, q1;
  float2 s0, s1;  // {d, d * sum(q)} of each run
};
__device__ __forceinline__ x_two_runs load_two_runs(x8_view x, std::int64_t e0, std::int64_t e1) {
  return {ld_i4(x.xq + e0), ld_i4(x.xq + e1), x.ds[e0 / 16], x.ds[e1 / 16]};
}

// The 32-element block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4): a slice is a
// block, its activations the block's two runs of 16; codes lo[] are elements 0..15, hi[] 16..31.
struct block32 {
  static constexpr int block_elems = 32, slices = 1;
  __device__ static x_two_runs load_x(x8_view x, std::int64_t blk, int) { return load_two_runs(x, 32 * blk, 32 * blk + 16); }
};
__device__ __forceinline__ int dot_codes32(const u32 (&lo)[4], const u32 (&hi)[4], const x_two_runs& x) {
  return dot16(lo, x.q0) + dot16(hi, x.q1);
}

// Q8_0: value = q * d. Slice = block.
struct dot_q8_0 : block32 {
  static constexpr int block_bytes = 34;
  struct w_t { u32 o[9]; };
  struct dec_t { u32 lo[4], hi[4]; float d; };
  __device__ static w_t load(const u8* b, int) { w_t w; load_a2<8>(b, w.o); return w; }
  __device__ static dec_t decode(const w_t& w, int) {
    dec_t r;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      r.lo[k] = word_at2<8>(w.o, k);
      r.hi[k] = word_at2<8>(w.o, k + 4);
    }
    r.d = f16(u16(w.o[0] & 0xFFFFu));
    return r;
  }
  __device__ static float dot(const dec_t& w, const x_two_runs& x) {
    return w.d * (x.s0.x * float(dot_codes32(w.lo, w.hi, x)));  // s0.x == s1.x: one block
  }
};

// Q4_0: value = (q - 8) * d; byte j holds element j (low nibble) and j + 16 (high). Slice = block.
struct dot_q4_0 : block32 {
  static constexpr int block_bytes = 18;
  struct w_t { u32 o[5]; };
  struct dec_t { u32 lo[4], hi[4]; float d; };
  __device__ static w_t load(const u8* b, int) { w_t w; load_a2<4>(b, w.o); return w; }
  __device__ static dec_t decode(const w_t& w, int) {
    dec_t r;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const u32 q = word_at2<4>(w.o, k);
      r.lo[k] = q & 0x0F0F0F0Fu;
      r.hi[k] = (q >> 4) & 0x0F0F0F0Fu;
    }
    r.d = f16(u16(w.o[0] & 0xFFFFu));
    return r;
  }
  __device__ static float dot(const dec_t& w, const x_two_runs& x) {
    return w.d * (x.s0.x * float(dot_codes32(w.lo, w.hi, x)) - 8.f * (x.s0.y + x.s1.y));
  }
};

// Q4_1: value = q * d + m (nibbles as Q4_0); m enters through the activations' sums. Slice =
// block; blocks are 4-byte aligned (20 bytes).
struct dot_q4_1 : block32 {
  static constexpr int block_bytes = 20;
  struct w_t { u32 o[5]; };
  struct dec_t { u32 lo[4], hi[4]; float d, m; };
  __device__ static w_t load(const u8* b, int) {
    w_t w;
#pragma unroll
    for (int k = 0; k < 5; ++k) w.o[k] = ld_u32(b + 4 * k);
    return w;
  }
  __device__ static dec_t decode(const w_t& w, int) {
    dec_t r;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      r.lo[k] = w.o[1 + k] & 0x0F0F0F0Fu;
      r.hi[k] = (w.o[1 + k] >> 4) & 0x0F0F0F0Fu;
    }
    r.d = f16(u16(w.o[0] & 0xFFFFu));
    r.m = f16(u16(w.o[0] >> 16));
    return r;
  }
  __device__ static float dot(const dec_t& w, const x_two_runs& x) {
    return w.d * x.s0.x * float(dot_codes32(w.lo, w.hi, x)) + w.m * (x.s0.y + x.s1.y);
  }
};

// Bit 4 of four consecutive elements' codes: bits 0..3 of `bits` into bit 4 of bytes 0..3.
__device__ __forceinline__ u32 spread_bit4(u32 bits) {
  return ((bits & 1u) << 4) | ((bits & 2u) << 11) | ((bits & 4u) << 18) | ((bits & 8u) << 25);
}

// Q5_0 / Q5_1 codes: nibbles as Q4_0, bit j of qh is bit 4 of element j.
__device__ __forceinline__ void q5_codes(u32 qh, const u32 (&qs)[4], u32 (&lo)[4], u32 (&hi)[4]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    lo[k] = (qs[k] & 0x0F0F0F0Fu) | spread_bit4((qh >> (4 * k)) & 0xFu);
    hi[k] = ((qs[k] >> 4) & 0x0F0F0F0Fu) | spread_bit4((qh >> (16 + 4 * k)) & 0xFu);
  }
}

// Q5_0: value = (q - 16) * d. Slice = block (22 bytes, 2-byte aligned).
struct dot_q5_0 : block32 {
  static constexpr int block_bytes = 22;
  struct w_t { u32 o[6]; };
  struct dec_t { u32 lo[4], hi[4]; float d; };
  __device__ static w_t load(const u8* b, int) { w_t w; load_a2<5>(b, w.o); return w; }
  __device__ static dec_t decode(const w_t& w, int) {
    dec_t r;
    const u32 qs[4] = {word_at2<5>(w.o, 1), word_at2<5>(w.o, 2), word_at2<5>(w.o, 3), word_at2<5>(w.o, 4)};
    q5_codes(word_at2<5>(w.o, 0), qs, r.lo, r.hi);
    r.d = f16(u16(w.o[0] & 0xFFFFu));
    return r;
  }
  __device__ static float dot(const dec_t& w, const x_two_runs& x) {
    return w.d * (x.s0.x * float(dot_codes32(w.lo, w.hi, x)) - 16.f * (x.s0.y + x.s1.y));
  }
};

// Q5_1: value = q * d + m. Slice = block (24 bytes, 8-byte aligned).
struct dot_q5_1 : block32 {
  static constexpr int block_bytes = 24;
  struct w_t { uint2 head, q0, q1; };
  struct dec_t { u32 lo[4], hi[4]; float d, m; };
  __device__ static w_t load(const u8* b, int) { return {ld_8(b), ld_8(b + 8), ld_8(b + 16)}; }
  __device__ static dec_t decode(const w_t& w, int) {
    dec_t r;
    const u32 qs[4] = {w.q0.x, w.q0.y, w.q1.x, w.q1.y};
    q5_codes(w.head.y, qs, r.lo, r.hi);
    r.d = f16(u16(w.head.x & 0xFFFFu));
    r.m = f16(u16(w.head.x >> 16));
    return r;
  }
  __device__ static float dot(const dec_t& w, const x_two_runs& x) {
    return w.d * x.s0.x * float(dot_codes32(w.lo, w.hi, x)) + w.m * (x.s0.y + x.s1.y);
  }
};

// IQ4_NL and MXFP4: nibbles as Q4_0 through a table of 16 int8 levels (gpu_quant.h), times the
// block's scale. Slice = block.
struct levels_dec {
  u32 lo[4], hi[4];
  float d;
};
__device__ __forceinline__ void decode_level_words(const level_table& t, const u32 (&qs)[4], levels_dec& r) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    r.lo[k] = lookup_levels(t, qs[k] & 0x0F0F0F0Fu);
    r.hi[k] = lookup_levels(t, (qs[k] >> 4) & 0x0F0F0F0Fu);
  }
}

struct dot_iq4_nl : block32 {
  static constexpr int block_bytes = 18;
  struct w_t { u32 o[5]; };
  using dec_t = levels_dec;
  __device__ static w_t load(const u8* b, int) { w_t w; load_a2<4>(b, w.o); return w; }
  __device__ static dec_t decode(const w_t& w, int) {
    dec_t r;
    const u32 qs[4] = {word_at2<4>(w.o, 0), word_at2<4>(w.o, 1), word_at2<4>(w.o, 2), word_at2<4>(w.o, 3)};
    decode_level_words(iq4_table(), qs, r);
    r.d = f16(u16(w.o[0] & 0xFFFFu));
    return r;
  }
  __device__ static float dot(const dec_t& w, const x_two_runs& x) {
    return w.d * x.s0.x * float(dot_codes32(w.lo, w.hi, x));
  }
};

// MXFP4 blocks (17 bytes) are byte aligned: the five aligned words holding the block's bytes load
// whole and shift into place (17 byte loads took four times as long on the 20B experts). The last
// of them may hold up to 3 bytes past the block: a buffer of MXFP4 rows must be readable up to the
// next multiple of 4 bytes, as the worker's weights and the tests' buffers are.
struct dot_mxfp4 : block32 {
  static constexpr int block_bytes = 17;
  struct w_t { u32 e, qs[4]; };
  using dec_t = levels_dec;
  __device__ static w_t load(const u8* b, int) {
    const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(b);
    const u8* base = reinterpret_cast<const u8*>(a & ~std::uintptr_t(3));
    const unsigned sh = unsigned(a & 3u) * 8u;
    u32 r[5];
#pragma unroll
    for (int k = 0; k < 5; ++k) r[k] = ld_u32(base + 4 * k);
    u32 o[5];  // o[k]: bytes b[4k .. 4k + 3] (o[4]: b[16] in its low byte)
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] = u32(((std::uint64_t(r[k + 1]) << 32) | r[k]) >> sh);
    o[4] = r[4] >> sh;
    w_t w;
    w.e = o[0] & 0xFFu;
#pragma unroll
    for (int k = 0; k < 4; ++k) w.qs[k] = (o[k] >> 8) | (o[k + 1] << 24);
    return w;
  }
  __device__ static dec_t decode(const w_t& w, int) {
    dec_t r;
    decode_level_words(fp4_table(), w.qs, r);
    r.d = e8m0_half(w.e);
    return r;
  }
  __device__ static float dot(const dec_t& w, const x_two_runs& x) {
    return w.d * x.s0.x * float(dot_codes32(w.lo, w.hi, x));
  }
};

// Q4_K / Q5_K: 16-byte head (d, dmin, 12 scale bytes), [Q5_K: 32 bytes qh], 128 bytes of
// nibbles, 32 per 64-element pair p (byte l: element 64p + l in its low nibble, sub-block 2p;
// element 64p + 32 + l in its high nibble, sub-block 2p + 1). Slice s = pair s (0..3).
struct k4_dec {
  u32 lo[8], hi[8];      // sub-block 2p (elements 64p + 4k..), sub-block 2p + 1
  float d0, d1, m0, m1;  // d * scale and dmin * min of the two sub-blocks
};
// The 6-bit scales and mins of sub-blocks 2p and 2p + 1 (quant_blocks.h k4_scale_min), two at a
// time: bytes 2q, 2q + 1 (q = p % 2) of each scale word hold what the pair needs.
__device__ __forceinline__ void k4_scales(uint4 head, int p, k4_dec& r) {
  const int shift = 16 * (p & 1);
  const u32 a = head.y >> shift, b = head.z >> shift, c = head.w >> shift;  // scales[0..3], [4..7], [8..11]
  const u32 sc = p < 2 ? (a & 0x3F3Fu) : ((c & 0x0F0Fu) | ((a >> 2) & 0x3030u));
  const u32 mn = p < 2 ? (b & 0x3F3Fu) : (((c >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u));
  const float d = f16(u16(head.x & 0xFFFFu)), dmin = f16(u16(head.x >> 16));
  r.d0 = d * u8_to_float(sc & 0xFFu), r.d1 = d * u8_to_float((sc >> 8) & 0xFFu);
  r.m0 = dmin * u8_to_float(mn & 0xFFu), r.m1 = dmin * u8_to_float((mn >> 8) & 0xFFu);
}

// Activations of two runs of 32 (element offsets e0, e1, multiples of 32).
struct x_two_runs32 {
  int4 q[4];      // run 0: q[0], q[1]; run 1: q[2], q[3]
  float4 s0, s1;  // {d, d * sum(q)} of each half of run 0, of run 1
};
__device__ __forceinline__ x_two_runs32 load_two_runs32(x8_view x, std::int64_t e0, std::int64_t e1) {
  const float4* ds = reinterpret_cast<const float4*>(x.ds);
  return {{ld_i4(x.xq + e0), ld_i4(x.xq + e0 + 16), ld_i4(x.xq + e1), ld_i4(x.xq + e1 + 16)}, ds[e0 / 32], ds[e1 / 32]};
}

__device__ __forceinline__ int dot32(const u32 (&w)[8], int4 x0, int4 x1) {
  int s = 0;
  s = gpu::dot4_i8(int(w[0]), x0.x, s);
  s = gpu::dot4_i8(int(w[1]), x0.y, s);
  s = gpu::dot4_i8(int(w[2]), x0.z, s);
  s = gpu::dot4_i8(int(w[3]), x0.w, s);
  s = gpu::dot4_i8(int(w[4]), x1.x, s);
  s = gpu::dot4_i8(int(w[5]), x1.y, s);
  s = gpu::dot4_i8(int(w[6]), x1.z, s);
  return gpu::dot4_i8(int(w[7]), x1.w, s);
}

__device__ __forceinline__ x_two_runs32 k4_load_x(x8_view x, std::int64_t blk, int p) {
  const std::int64_t e = 256 * blk + 64 * p;
  return load_two_runs32(x, e, e + 32);
}
__device__ __forceinline__ float k4_dot(const k4_dec& w, const x_two_runs32& x) {
  return w.d0 * x.s0.x * float(dot32(w.lo, x.q[0], x.q[1])) + w.d1 * x.s1.x * float(dot32(w.hi, x.q[2], x.q[3])) -
         (w.m0 * (x.s0.y + x.s0.w) + w.m1 * (x.s1.y + x.s1.w));
}

struct dot_q4_k {
  static constexpr int block_elems = 256, block_bytes = 144, slices = 4;
  struct w_t { uint4 head, qs0, qs1; };
  using dec_t = k4_dec;
  __device__ static w_t load(const u8* b, int p) { return {ld_16(b), ld_16(b + 16 + 32 * p), ld_16(b + 32 + 32 * p)}; }
  __device__ static dec_t decode(const w_t& w, int p) {
    dec_t r;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const u32 q = k < 4 ? word_of(w.qs0, k) : word_of(w.qs1, k - 4);
      r.lo[k] = q & 0x0F0F0F0Fu;
      r.hi[k] = (q >> 4) & 0x0F0F0F0Fu;
    }
    k4_scales(w.head, p, r);
    return r;
  }
  __device__ static x_two_runs32 load_x(x8_view x, std::int64_t blk, int p) { return k4_load_x(x, blk, p); }
  __device__ static float dot(const dec_t& w, const x_two_runs32& x) { return k4_dot(w, x); }
};

// Q5_K: bit 2p of qh[l] is bit 4 of low-nibble element l of pair p, bit 2p + 1 that of the high one.
struct dot_q5_k {
  static constexpr int block_elems = 256, block_bytes = 176, slices = 4;
  struct w_t { uint4 head, qh0, qh1, qs0, qs1; };
  using dec_t = k4_dec;
  __device__ static w_t load(const u8* b, int p) {
    return {ld_16(b), ld_16(b + 16), ld_16(b + 32), ld_16(b + 48 + 32 * p), ld_16(b + 64 + 32 * p)};
  }
  __device__ static dec_t decode(const w_t& w, int p) {
    dec_t r;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const u32 q = k < 4 ? word_of(w.qs0, k) : word_of(w.qs1, k - 4);
      const u32 h = (k < 4 ? word_of(w.qh0, k) : word_of(w.qh1, k - 4)) >> (2 * p);
      r.lo[k] = (q & 0x0F0F0F0Fu) | ((h & 0x01010101u) << 4);
      r.hi[k] = ((q >> 4) & 0x0F0F0F0Fu) | (((h >> 1) & 0x01010101u) << 4);
    }
    k4_scales(w.head, p, r);
    return r;
  }
  __device__ static x_two_runs32 load_x(x8_view x, std::int64_t blk, int p) { return k4_load_x(x, blk, p); }
  __device__ static float dot(const dec_t& w, const x_two_runs32& x) { return k4_dot(w, x); }
};

// Q6_K: ql[128], qh[64], 16 int8 scales, fp16 d; value = d * scale * (q - 32). Element
// 128h + 32g + l takes ql[64h + 32(g&1) + l] (low nibble for g < 2, high for g >= 2), bits
// 2g..2g+1 of qh[32h + l], scale 8h + 2g + l/16. Slice s (0..3): ql bytes 32s..32s+31, i.e.
// h = s/2, j = s%2: run 0 is group g = j, run 1 group j + 2 (32 elements each, two scales each).
struct dot_q6_k {
  static constexpr int block_elems = 256, block_bytes = 210, slices = 4;
  struct w_t { u32 ql[9], qh[9]; u32 sc01, sc23, d; };
  struct dec_t { u32 lo[8], hi[8]; float d0, d1, d2, d3; };  // d * scale of lo[0..3], lo[4..7], hi[0..3], hi[4..7]
  __device__ static w_t load(const u8* b, int s) {
    const int h = s >> 1, j = s & 1;
    w_t w;
    load_a2<8>(b + 32 * s, w.ql);        // reads 2 bytes past the run: still ql, or qh
    load_a2<8>(b + 128 + 32 * h, w.qh);  // 2 bytes past: qh, or the scales
    w.sc01 = ld_u16(b + 192 + 8 * h + 2 * j);
    w.sc23 = ld_u16(b + 196 + 8 * h + 2 * j);
    w.d = ld_u16(b + 208);
    return w;
  }
  __device__ static dec_t decode(const w_t& w, int s) {
    const int j = s & 1;
    dec_t r;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const u32 q = w.ql[k], h = w.qh[k] >> (2 * j);
      r.lo[k] = (q & 0x0F0F0F0Fu) | ((h & 0x03030303u) << 4);
      r.hi[k] = ((q >> 4) & 0x0F0F0F0Fu) | (((h >> 4) & 0x03030303u) << 4);
    }
    const float d = f16(u16(w.d));
    r.d0 = d * float(static_cast<std::int8_t>(w.sc01 & 0xFFu));
    r.d1 = d * float(static_cast<std::int8_t>(w.sc01 >> 8));
    r.d2 = d * float(static_cast<std::int8_t>(w.sc23 & 0xFFu));
    r.d3 = d * float(static_cast<std::int8_t>(w.sc23 >> 8));
    return r;
  }
  __device__ static x_two_runs32 load_x(x8_view x, std::int64_t blk, int s) {
    const std::int64_t e = 256 * blk + 128 * (s >> 1) + 32 * (s & 1);
    return load_two_runs32(x, e, e + 64);
  }
  __device__ static float dot(const dec_t& w, const x_two_runs32& x) {
    const u32(&lo)[8] = w.lo;
    const u32(&hi)[8] = w.hi;
    const u32 l0[4] = {lo[0], lo[1], lo[2], lo[3]}, l1[4] = {lo[4], lo[5], lo[6], lo[7]};
    const u32 h0[4] = {hi[0], hi[1], hi[2], hi[3]}, h1[4] = {hi[4], hi[5], hi[6], hi[7]};
    return w.d0 * (x.s0.x * float(dot16(l0, x.q[0])) - 32.f * x.s0.y) +
           w.d1 * (x.s0.z * float(dot16(l1, x.q[1])) - 32.f * x.s0.w) +
           w.d2 * (x.s1.x * float(dot16(h0, x.q[2])) - 32.f * x.s1.y) +
           w.d3 * (x.s1.z * float(dot16(h1, x.q[3])) - 32.f * x.s1.w);
  }
};

// Calls fn(dot_x{}) for the quantized types the integer GEMV handles; false for the others
// (F32, F16, BF16 stay on the float path, and so do Q2_K, Q3_K and IQ4_XS for now).
template <class Fn>
bool with_dot_format(model::ggml_type t, Fn&& fn) {
  using model::ggml_type;
  switch (t) {
    case ggml_type::Q8_0: fn(dot_q8_0{}); return true;
    case ggml_type::Q4_0: fn(dot_q4_0{}); return true;
    case ggml_type::Q4_K: fn(dot_q4_k{}); return true;
    case ggml_type::Q5_K: fn(dot_q5_k{}); return true;
    case ggml_type::Q6_K: fn(dot_q6_k{}); return true;
    case ggml_type::Q4_1: fn(dot_q4_1{}); return true;
    case ggml_type::Q5_0: fn(dot_q5_0{}); return true;
    case ggml_type::Q5_1: fn(dot_q5_1{}); return true;
    case ggml_type::IQ4_NL: fn(dot_iq4_nl{}); return true;
    case ggml_type::MXFP4: fn(dot_mxfp4{}); return true;
    default: return false;
  }
}

}  // namespace anvil::kernels::gpu_quant
