// GEMM on Q4_K, Q5_K and Q6_K blocks with tensor cores (kernels/gemm_quant.h).
//
// Which product index carries which element: a sum does not care, so each thread's share of a
// 256-element super-block is chosen to make its loads whole. Lane (g, c) = (lane / 4, lane % 4)
// owns bytes [32c, 32c + 32) of the 128 code bytes of its rows, that is elements [64c, 64c + 64):
// sub-block 2c in the low nibbles, 2c + 1 in the high ones. Word u (0..7) of those bytes holds
// elements 4u .. 4u+3 (low) and 32 + 4u .. 32 + 4u+3 (high, all relative to 64c), and one mask
// gives two of them as an f16 pair: elements (0, 2) of the word from the word, (1, 3) from the word
// shifted by 8. Product step (u, low) takes (0, 2) as A's columns 2c, 2c+1 and (1, 3) as its
// columns 2c+8, 2c+9; step (u, high) the same from the high nibbles. B must then hold activations
// (4u, 4u+2) and (4u+1, 4u+3) in the same places: the activations are written to the workspace in
// f16 with each group of four stored as 0, 2, 1, 3, so that both pairs are one 8-byte read (two
// product steps, one 16-byte read).
//
// Shared memory per stage: the block's rows' super-blocks as stored (144 or 176 bytes each: the
// 16-byte head of d, dmin and the 12 scale bytes, Q5_K's fifth bits, then the codes), and the
// tokens' 256 activations (f16, 576 bytes each with padding, laid out as x_offset says so that
// reads do not collide in the banks) with their sums per 32.
#include "kernels/gemm_quant.h"

#include <algorithm>
#include <span>

#include "kernels/gpu_quant.h"
#if defined(ANVIL_GPU_CUDA)
#include "kernels/tensor_core.h"
#endif

namespace anvil::kernels {
namespace {

using namespace gpu_quant;

constexpr int super_elems = 256;        // elements per stage: a K-quant super-block, 8 MXFP4 blocks

// The two block formats (quant_blocks.h): the same 16-byte head (d, dmin, 12 scale bytes), 4-bit
// codes at `codes`; Q5_K adds each code's fifth bit in qh[32] at byte 16 (bit 2j of qh[l] for
// element l of sub-block 2j, bit 2j + 1 for sub-block 2j + 1).
// Q6_K (210-byte blocks: ql[128], qh[64], 16 int8 scales, d) has no mins and 6-bit codes less 32;
// its blocks are only 2-byte aligned, so a stage holds each row's block inside the 16-byte aligned
// 224-byte window around it (slot_bytes), read at the block's offset in the window.
// MXFP4 (the experts' form only): a stage is 8 blocks of 17 bytes (an E8M0 scale byte, then 16
// bytes of e2m1 codes: element j in the low nibble of byte j, j + 16 in the high one), any byte
// alignment, held in a 160-byte window; rows need only be whole blocks, so a row's last stage may
// be part-filled (its missing blocks get scale 0 and its missing activations are zero-filled).
struct q4k_format {
  static constexpr int block_bytes = 144, slot_bytes = 144, codes = 16;
  static constexpr bool high_bits = false, q6 = false, mx = false, windowed = false;
};
struct q5k_format {
  static constexpr int block_bytes = 176, slot_bytes = 176, codes = 48;
  static constexpr bool high_bits = true, q6 = false, mx = false, windowed = false;
};
struct q6k_format {
  static constexpr int block_bytes = 210, slot_bytes = 224;
  static constexpr bool q6 = true, mx = false, windowed = true;
};
struct mxfp4_format {
  static constexpr int block_bytes = 136, slot_bytes = 160;
  static constexpr bool q6 = false, mx = true, windowed = true;
};
// A token's 256 activations in a stage: four chunks of 64 (one per lane c), each 8 units of 16
// bytes, chunks 9 units apart (rows 36 units, 576 bytes): a quarter-warp's reads (lanes g = 0, 1
// or 2, 3 and c = 0..3, the same unit w of their chunk) fall on units 36g + 9c + w, eight
// different bank groups, and every lane's address is its base plus a constant.
constexpr int x_chunk_units = 9;
constexpr int x_row_bytes = 16 * 4 * x_chunk_units;
__device__ __forceinline__ int x_offset(int n, int u) { return n * x_row_bytes + 16 * (x_chunk_units * (u / 8) + u % 8); }
constexpr int max_splits = 16;
// Tile counters of a split reduction: a fixed region of the workspace (a split grid has fewer
// blocks than the device has multiprocessors, far fewer than this).
constexpr int max_counters = 1024;

// A block of W warps computes (16 * MT * W) rows of W for (8 * NT) tokens, through S stages. Every
// launch uses MT = 1: two m-tiles per warp measured slower (255 registers, spills).
template <class F, int W, int MT, int NT, int S>
struct tile {
  static constexpr int threads = 32 * W;
  static constexpr int rows = 16 * MT * W;
  static constexpr int tokens = 8 * NT;
  static constexpr int stages = S;
  static constexpr int w_bytes = rows * F::slot_bytes;
  static constexpr int sum_offset = w_bytes + tokens * x_row_bytes;  // each token's 8 sums, 16 bytes
  static constexpr int stage_bytes = sum_offset + tokens * 16;
  static constexpr int smem = stages * stage_bytes;
};

// f32 activations -> f16, each group of four stored as elements 0, 2, 1, 3, and the f16 sum of
// every 32 consecutive activations (n a multiple of 256: four lanes hold one sum's 32); also
// zeroes the tile counters (each GEMM leaves them zero again, for the next on the same x).
__global__ void __launch_bounds__(256) convert_pairs_kernel(const float* __restrict__ src, std::uint16_t* __restrict__ dst,
                                                            std::uint16_t* __restrict__ sums, std::int64_t n,
                                                            unsigned* __restrict__ counters, int n_counters) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  if (blockIdx.x == 0) {
    for (int i = int(threadIdx.x); i < n_counters; i += 256) counters[i] = 0;
  }
  const std::int64_t n8 = n / 8;  // a multiple of 32: the four lanes of a sum pass or stop together
  for (std::int64_t i = std::int64_t(blockIdx.x) * 256 + threadIdx.x; i < n8; i += std::int64_t(gridDim.x) * 256) {
    const float4 a = reinterpret_cast<const float4*>(src)[2 * i], b = reinterpret_cast<const float4*>(src)[2 * i + 1];
    gpu::store16(dst + 8 * i, make_uint4(gpu::floats_to_half2_bits(a.x, a.z), gpu::floats_to_half2_bits(a.y, a.w),
                                         gpu::floats_to_half2_bits(b.x, b.z), gpu::floats_to_half2_bits(b.y, b.w)));
    float sum = ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w));
    sum += gpu::shfl_xor(sum, 1);
    sum += gpu::shfl_xor(sum, 2);
    if ((i & 3) == 0) sums[i / 4] = gpu::float_to_half_bits(sum);
  }
}

struct gemm_quant_args {
  const u8* w;
  const u8* w_end;           // one past the weight's last byte (Q6_K's windows stop there)
  std::size_t row_bytes;
  const std::uint16_t* x16;  // [n_tokens][in], pairs as convert_pairs_kernel writes them
  const std::uint16_t* xsum; // [n_tokens][in / 32], the f16 sums of each 32 activations
  const float* bias;         // [out] or null
  float* y;                  // [n_tokens][out]
  float* partial;            // splitting: [splits][n_tokens][out], each split's sums
  unsigned* counters;        // splitting: one per (token tile, row tile), zero at the start and the end
  int in, out, n_tokens;
  int supers_per_split;      // super-blocks each blockIdx.z reduces
  // The experts' form (launch_gemm_quant_experts) only: w, y and bias are the first matrix's stack
  // (bias [n_expert][out]), w1, y1 and bias1 the second's (blockIdx.z picks); expert e's matrix
  // starts e * stride bytes in; the pairs come grouped by expert as launch_moe_route leaves them,
  // pair p reading row p / x_div of x16 and xsum and writing row p of y.
  const u8* w1;
  float* y1;
  const float* bias1;
  std::size_t stride;
  const std::int32_t* offsets;
  const std::int32_t* sorted;
  const std::int32_t* active;
  int x_div;
};

// Experts' form: which expert and which of its pairs block `b` of the grid's x computes. Each
// active expert's pairs make ceil(count / tokens) tiles, the tiles of all of them numbered in the
// active list's order; blocks past the last tile get expert -1. Every thread of the block calls
// it (block-wide scans of the tile counts, `Threads` experts a round).
struct expert_tile {
  int expert, first, count;  // first: the tile's first place in `sorted`; count: its pairs
};
template <int Threads>
__device__ expert_tile find_expert_tile(const gemm_quant_args& a, int b, int tokens) {
  __shared__ expert_tile found;
  const int tid = int(threadIdx.x);
  if (tid == 0) found = {-1, 0, 0};
  const int n_active = a.active[0];
  int base = 0;  // tiles of the rounds before
  for (int j0 = 0; j0 < n_active; j0 += Threads) {
    const int j = j0 + tid;
    int e = 0, start = 0, count = 0;
    if (j < n_active) {
      e = a.active[1 + j];
      start = a.offsets[e];
      count = a.offsets[e + 1] - start;
    }
    const int tiles = (count + tokens - 1) / tokens;
    int total = 0;
    const int first_tile = base + gpu::block_exclusive_scan<Threads>(tiles, total);
    if (b >= first_tile && b < first_tile + tiles) {
      const int t = b - first_tile;
      found = {e, start + t * tokens, min(tokens, count - t * tokens)};
    }
    base += total;
    __syncthreads();  // `found` is seen by all
    if (b < base) break;
  }
  __syncthreads();
  return found;
}

#if defined(ANVIL_GPU_CUDA)
__device__ __forceinline__ u32 sub_f16x2(u32 a, u32 b) {
  u32 r;
  asm("sub.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ u32 fma_f16x2(u32 a, u32 b, u32 c) {
  u32 r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// (a & b) | c in one instruction (the compiler spends two when b and c are both constants).
__device__ __forceinline__ u32 and_or(u32 a, u32 b, u32 c) {
  u32 r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// Two f16 codes-times-scale of one row from word q: the low nibbles of bytes 0 and 2 (High false)
// or their high nibbles (High true). 0x6400 is 1024 in f16 with a mantissa step of 1, so (nibble |
// 0x6400) is 1024 + nibble; 0x5400 is 64 with a step of 1/16, so (nibble << 4 | 0x5400) is 64 +
// nibble. One fma with the scale and minus the scale times that exact offset (a power of two:
// exact too) leaves code x scale, rounded once. The sub-block's min is not subtracted here: the
// kernel adds minus min x (sum of the sub-block's activations) as a product of its own.
template <bool High>
__device__ __forceinline__ u32 dequant_pair(u32 q, u32 fifth, u32 scale, u32 neg_offset) {
  return fma_f16x2(and_or(q, High ? 0x00F000F0u : 0x000F000Fu, (High ? 0x54005400u : 0x64006400u) | fifth), scale,
                   neg_offset);
}

// Q5_K: the fifth bits of the pair dequant_pair<High> takes from word q (Odd false) or q >> 8 (Odd
// true), moved to 16 in the code's units (bit 4 of each half under 0x6400, bit 8 under 0x5400).
// `bits` is the qh word of the same bytes shifted right by 2c (low nibbles) or 2c + 1 (high).
template <bool High, bool Odd>
__device__ __forceinline__ u32 fifth_bits(u32 bits) {
  if constexpr (High) return (Odd ? bits : bits << 8) & 0x01000100u;
  return (Odd ? bits >> 4 : bits << 4) & 0x00100010u;
}

// One row's scales for lane c's share of a super-block: those of sub-blocks 2c (low nibbles) and
// 2c+1 (high) as pairs, minus each scale times its nibble offset, and (-dmin m) of the two.
struct row_scales {
  u32 scale[2], neg_offset[2];
  u32 neg_mins;  // (-dmin m_2c, -dmin m_2c+1)
};

__device__ __forceinline__ u32 mul_f16x2(u32 a, u32 b) {
  u32 r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// Lane c's rows need sub-blocks 2c and 2c + 1: bytes 2(c & 1) and 2(c & 1) + 1 of the scale words
// (quant_blocks.h k4_scale_min: sub-blocks 0-3 keep 6 bits in bytes 0-3 (scales) and 4-7 (mins);
// 4-7 keep 4 bits in bytes 8-11 and their top 2 bits in the top bits of bytes 0-7). d sc and
// dmin m are products of an f16 and an integer below 64, rounded once: the values dequantize_row's
// f32 products round to.
__device__ __forceinline__ row_scales load_scales(const u8* row, int c) {
  row_scales r;
  const uint4 head = *reinterpret_cast<const uint4*>(row);
  const int sh = 16 * (c & 1);
  const u32 y = head.y >> sh, z = head.z >> sh, w = head.w >> sh;
  const u32 upper = c >= 2 ? ~0u : 0u;  // sub-blocks 4..7: 4 low bits apart, 2 high bits in bytes 0-7
  const u32 sc = (upper & ((w & 0x0F0Fu) | ((y >> 2) & 0x3030u))) | (~upper & y & 0x3F3Fu);  // two 6-bit scales
  const u32 mn = (upper & (((w >> 4) & 0x0F0Fu) | ((z >> 2) & 0x3030u))) | (~upper & z & 0x3F3Fu);
  // Each byte pair as two halves ((byte | 0x6400) - 1024), times (d, d) and (-dmin, -dmin).
  const u32 d2 = __byte_perm(head.x, 0, 0x1010), neg_dmin2 = __byte_perm(head.x, 0, 0x3232) ^ 0x80008000u;
  const u32 scale = mul_f16x2(sub_f16x2(__byte_perm(sc, 0x64646464u, 0x4140), 0x64006400u), d2);
  r.neg_mins = mul_f16x2(sub_f16x2(__byte_perm(mn, 0x64646464u, 0x4140), 0x64006400u), neg_dmin2);
  r.scale[0] = __byte_perm(scale, 0, 0x1010);
  r.scale[1] = __byte_perm(scale, 0, 0x3232);
  r.neg_offset[0] = mul_f16x2(r.scale[0], 0xE400E400u);  // -1024 s
  r.neg_offset[1] = mul_f16x2(r.scale[1], 0xD400D400u);  // -64 s
  return r;
}

// Lane c's code words 2v and 2v + 1 of a row, and (Q5_K) the qh words of the same bytes.
template <class F>
__device__ __forceinline__ uint2 code_words(const u8* row, int c, int v) {
  return *reinterpret_cast<const uint2*>(row + F::codes + 32 * c + 8 * v);
}
__device__ __forceinline__ uint2 high_words(const u8* row, int v) { return *reinterpret_cast<const uint2*>(row + 16 + 8 * v); }

// Q6_K: the words at a 2-byte aligned shared address p (a block inside its window): aligned
// words around it, funnel-shifted by 0 or 16 bits.
__device__ __forceinline__ u32 q6_word(const u8* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const u32* w = reinterpret_cast<const u32*>(a & ~std::uintptr_t(3));
  return __funnelshift_r(w[0], w[1], unsigned(a & 3) * 8);
}
__device__ __forceinline__ uint2 q6_words2(const u8* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const u32* w = reinterpret_cast<const u32*>(a & ~std::uintptr_t(3));
  const unsigned sh = unsigned(a & 3) * 8;
  const u32 w0 = w[0], w1 = w[1], w2 = w[2];
  return make_uint2(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh));
}

// Q6_K: lane c's four scales, scales[4c .. 4c + 3] (sub-blocks of 16: low group first and second
// half, high group first and second half), times d, each as an f16 pair (d sc rounded once).
struct q6_scales {
  u32 s[4];
};
__device__ __forceinline__ q6_scales q6_load_scales(const u8* blk, int c) {
  const u32 sc = q6_word(blk + 192 + 4 * c) ^ 0x80808080u;  // int8 -> offset binary
  const u32 d = *reinterpret_cast<const std::uint16_t*>(blk + 208);
  const u32 d2 = d | (d << 16);
  const u32 lo = mul_f16x2(sub_f16x2(__byte_perm(sc, 0x64646464u, 0x4140), 0x64806480u), d2);  // 0x6480: 1152
  const u32 hi = mul_f16x2(sub_f16x2(__byte_perm(sc, 0x64646464u, 0x4342), 0x64806480u), d2);
  return {{__byte_perm(lo, 0, 0x1010), __byte_perm(lo, 0, 0x3232), __byte_perm(hi, 0, 0x1010), __byte_perm(hi, 0, 0x3232)}};
}

// Q6_K: two f16 weights from the ql word `lo4` (its nibbles of bytes 0 and 2 at bits 0-3 and
// 16-19) and the qh word `hi2` (their two high bits at 0-1 and 16-17): (code | 0x6400) - 1056 is
// the code less 32, exactly; times the scale, rounded once.
__device__ __forceinline__ u32 q6_pair(u32 lo4, u32 hi2, u32 scale) {
  const u32 v = and_or(lo4, 0x000F000Fu, and_or(hi2 << 4, 0x00300030u, 0x64006400u));
  return mul_f16x2(sub_f16x2(v, 0x64206420u), scale);
}

// MXFP4: the four code words of a block whose codes start at shared address p (any alignment).
__device__ __forceinline__ uint4 mx_words(const u8* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const u32* w = reinterpret_cast<const u32*>(a & ~std::uintptr_t(3));
  const unsigned sh = unsigned(a & 3) * 8;
  const u32 w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3], w4 = w[4];
  return make_uint4(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh), __funnelshift_r(w2, w3, sh),
                    __funnelshift_r(w3, w4, sh));
}

// MXFP4: a block's scale 2^(E - 127) times 2^14 as an f16 pair, or 0 for a block past the row's
// end: exact for E in 89..128; below, 0; above, inf (the products are exact from E = 104 on:
// kernels/gemm_quant.h).
__device__ __forceinline__ u32 mx_scale(u32 e, bool valid) {
  const u32 h = !valid || e < 89 ? 0u : e <= 98 ? 1u << (e - 89) : e <= 128 ? (e - 98) << 10 : 0x7C00u;
  return h | (h << 16);
}

// MXFP4: the e2m1 codes in the low nibbles of bytes 0 and 2 of q as an f16 pair, each its value
// times 2^-14: the sign to bit 15, exponent and mantissa bits to bits 11-9 (exponent 0 lands on
// f16's subnormals, 0.5 x 2^-14 for code 1). Times mx_scale: the weight, rounded once (exact while
// it stays a normal f16).
__device__ __forceinline__ u32 mx_pair(u32 q, u32 scale) {
  return mul_f16x2(and_or(q << 12, 0x80008000u, (q << 9) & 0x0E000E00u), scale);
}
#endif

// G: the experts' form (gemm_quant_args' last fields): the block's tokens are one expert's pairs,
// gathered; no split.
template <class F, int W, int MT, int NT, int S, bool G = false>
__global__ void __launch_bounds__(32 * W) gemm_kq_kernel(gemm_quant_args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using T = tile<F, W, MT, NT, S>;
  constexpr int block_bytes = F::block_bytes;
  constexpr int threads = T::threads;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
  const int t0 = G ? 0 : int(blockIdx.x) * T::tokens;
  const int row0 = int(blockIdx.y) * T::rows;
  // The matrix, its bias and output, and the block's tokens: rows t0 .. of x and y, or (G) the
  // pairs sorted[first .. first + count) of one expert, which the kernel before this one wrote.
  const u8* w_mat = a.w;
  const u8* w_end = a.w_end;
  float* y_mat = a.y;
  const float* bias = a.bias;
  const std::int32_t* pairs = nullptr;
  int n_rows = a.n_tokens - t0;  // tokens of this block, at most T::tokens used
  if constexpr (G) {
    gpu::dependency_wait();  // launched with gpu::launch_dependent_smem
    gpu::allow_dependents();
    const expert_tile et = find_expert_tile<threads>(a, int(blockIdx.x), T::tokens);
    if (et.expert < 0) return;
    const bool second = blockIdx.z == 1;
    w_mat = (second ? a.w1 : a.w) + std::size_t(et.expert) * a.stride;
    w_end = w_mat + std::size_t(a.out) * a.row_bytes;
    y_mat = second ? a.y1 : a.y;
    bias = second ? a.bias1 : a.bias;
    if (bias != nullptr) bias += std::size_t(et.expert) * std::size_t(a.out);
    pairs = a.sorted + et.first;
    n_rows = et.count;
  }
  // Token n of the block (0 <= n < T::tokens): the row of x it reads (past the block's tokens, the
  // last one's) and the row of y it writes (-1 past them).
  const auto x_row = [&](int n) -> int {
    const int i = min(n, n_rows - 1);
    return G ? pairs[i] / a.x_div : t0 + i;
  };
  const auto y_row = [&](int n) -> int { return n >= n_rows ? -1 : G ? pairs[n] : t0 + n; };
  const int n_super = (a.in + super_elems - 1) / super_elems;  // MXFP4 rows may end inside a stage
  const int kb0 = G ? 0 : int(blockIdx.z) * a.supers_per_split;  // G: blockIdx.z is the matrix
  const int kb_end = min(n_super, kb0 + a.supers_per_split);
  const int steps = kb_end - kb0;
  const unsigned w_misalign = unsigned(reinterpret_cast<std::uintptr_t>(w_mat) & 15u);  // windowed experts' stacks

  // This lane's share of every stage's copies, fixed but for the super-block: units of the rows'
  // blocks and of the tokens' activations (rows and tokens past the end repeat the last one).
  constexpr int w_units = T::rows * (F::slot_bytes / 16), w_copies = (w_units + threads - 1) / threads;
  constexpr int x_units = T::tokens * (super_elems / 8), x_copies = x_units / threads;
  static_assert(x_units % threads == 0, "every lane copies as many activation units");
  // Byte offsets from the block's first row and token (below 2^31: launch_gemm_quant's limits).
  const u8* const w_base = w_mat + std::size_t(row0) * a.row_bytes + std::size_t(kb0) * block_bytes;
  // Windowed formats (Q6_K, MXFP4): w_src is the row's offset and w_unit the unit of its blocks' window.
  unsigned w_src[w_copies], w_dst[w_copies], w_unit[w_copies];
#pragma unroll
  for (int k = 0; k < w_copies; ++k) {
    const int i = min(tid + k * threads, w_units - 1);  // a lane past the end repeats the last copy
    const int r = i / (F::slot_bytes / 16), u = i % (F::slot_bytes / 16);
    const unsigned row_off = unsigned(min(r, a.out - 1 - row0)) * unsigned(a.row_bytes);
    w_src[k] = F::windowed ? row_off : row_off + 16u * unsigned(u);
    w_unit[k] = unsigned(u);
    w_dst[k] = unsigned(r * F::slot_bytes + 16 * u);
  }
  const std::uint16_t* const x_base = a.x16 + std::size_t(kb0) * super_elems;
  unsigned x_src[x_copies], x_dst[x_copies], x_col[x_copies];
#pragma unroll
  for (int k = 0; k < x_copies; ++k) {
    const int i = tid + k * threads, n = i / (super_elems / 8), u = i % (super_elems / 8);
    x_src[k] = unsigned(x_row(n)) * unsigned(a.in) + 8u * unsigned(u);  // elements
    x_dst[k] = unsigned(T::w_bytes + x_offset(n, u));
    x_col[k] = 8u * unsigned(u);
  }
  static_assert(T::tokens <= threads, "one lane per token copies its sums");
  const std::uint16_t* sum_src =
      a.xsum + std::size_t(x_row(min(tid, T::tokens - 1))) * std::size_t(a.in / 32) + std::size_t(kb0) * 8;
  const auto load_weights = [&](int step) {
    unsigned char* st = smem + (step % T::stages) * T::stage_bytes;
#pragma unroll
    for (int k = 0; k < w_copies; ++k) {
      if constexpr (F::windowed) {
        // Unit w_unit of the 16-byte aligned window around the row's blocks; bytes past the
        // weight's end are not read.
        const std::uintptr_t blk = reinterpret_cast<std::uintptr_t>(w_base) + w_src[k] + std::uintptr_t(step) * block_bytes;
        const u8* src = reinterpret_cast<const u8*>((blk & ~std::uintptr_t(15)) + 16u * w_unit[k]);
        const std::ptrdiff_t left = w_end - src;
        tc::cp_async16_n(st + w_dst[k], src, unsigned(left <= 0 ? 0 : left >= 16 ? 16 : left));
      } else {
        tc::cp_async16(st + w_dst[k], w_base + w_src[k] + std::size_t(step) * block_bytes, true);
      }
    }
  };
  const auto load_activations = [&](int step) {
    unsigned char* st = smem + (step % T::stages) * T::stage_bytes;
    if constexpr (!F::mx) {  // MXFP4 has no mins
      if (tid < T::tokens) tc::cp_async16(st + T::sum_offset + 16 * tid, sum_src + std::size_t(step) * 8, true);
    }
#pragma unroll
    for (int k = 0; k < x_copies; ++k) {
      // Past the row's end (MXFP4's last stage) the activations are zero-filled.
      const bool in_row = !F::mx || unsigned(kb0 + step) * super_elems + x_col[k] < unsigned(a.in);
      tc::cp_async16(st + x_dst[k], x_base + x_src[k] + (in_row ? std::size_t(step) * super_elems : 0), in_row);
    }
  };

  // The first stages' weights are requested before the kernel before this one has finished (they
  // do not depend on it: gpu::dependency_wait; G waited above, its expert comes from that kernel);
  // the activations after. The first commit group then holds every prologue weight: the first wait
  // covers them all.
#pragma unroll
  for (int s = 0; s < T::stages - 1; ++s) {
    if (s < steps) load_weights(s);
  }
  if constexpr (!G) {
    gpu::dependency_wait();  // launched with gpu::launch_dependent_smem
    gpu::allow_dependents();
  }
  float acc[MT][NT][4] = {};
#pragma unroll
  for (int s = 0; s < T::stages - 1; ++s) {
    if (s < steps) load_activations(s);
    tc::cp_async_commit();
  }
  for (int step = 0; step < steps; ++step) {
    tc::cp_async_wait<T::stages - 2>();
    __syncthreads();  // this stage has landed for every lane; the one refilled below is consumed
    if (step + T::stages - 1 < steps) {
      load_weights(step + T::stages - 1);
      load_activations(step + T::stages - 1);
    }
    tc::cp_async_commit();

    const unsigned char* st = smem + (step % T::stages) * T::stage_bytes;
    const unsigned char* xs = st + T::w_bytes + x_offset(g, 8 * c);  // this lane's chunk of token g
    // Rows g and g + 8 of each m-tile: Q4_K/Q5_K blocks as stored; Q6_K and MXFP4 blocks at their
    // offset in the window (the address modulo 16: the matrix's own, plus the row's and the stage's
    // offsets modulo 16; 210 = 2 and 136 = 8 mod 16). MXFP4: blocks 2c and 2c + 1 of the stage
    // (h), their code words and scales.
    const unsigned char* blk[MT][2];
    row_scales rs[MT][2];
    q6_scales qs6[MT][2];
    uint4 mxq[MT][2][2];
    u32 mxs[MT][2][2];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int rloc = 16 * (warp * MT + m) + 8 * r + g;
        blk[m][r] = st + rloc * F::slot_bytes;
        if constexpr (F::windowed) {
          const unsigned row = unsigned(min(row0 + rloc, a.out - 1));
          const unsigned stage_off = unsigned(F::block_bytes & 15) * unsigned(kb0 + step);
          blk[m][r] += (w_misalign + row * unsigned(a.row_bytes & 15) + stage_off) & 15u;
        }
        if constexpr (F::q6) {
          qs6[m][r] = q6_load_scales(blk[m][r], c);
        } else if constexpr (F::mx) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const u8* b = blk[m][r] + 17 * (2 * c + h);
            mxq[m][r][h] = mx_words(b + 1);
            mxs[m][r][h] = mx_scale(*b, (kb0 + step) * (super_elems / 32) + 2 * c + h < a.in / 32);
          }
        } else {
          rs[m][r] = load_scales(blk[m][r], c);
        }
      }
    }
    if constexpr (!F::q6 && !F::mx) {
      // Minus the mins: rows (g, g + 8) x (-dmin m) of sub-blocks 2c, 2c+1 against token g's sums
      // of the same sub-blocks, the other half of the product's reduction zero.
      const unsigned char* sums = st + T::sum_offset + 16 * g + 4 * c;
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const unsigned am[4] = {rs[m][0].neg_mins, rs[m][1].neg_mins, 0u, 0u};
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          tc::mma_16816(acc[m][j], am, *reinterpret_cast<const u32*>(sums + 16 * 8 * j), 0u);
        }
      }
    }
    const int q6_half = c / 2, nib_shift = 4 * (c % 2);  // Q6_K: lane c's half of the block, nibble
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      // Words 2v, 2v + 1 of rows g and g + 8: Q4_K/Q5_K codes (q) and Q5_K fifth bits (hq);
      // Q6_K ql of the low group (q), of the high group (q_hi), and qh (hq).
      uint2 q[MT][2], q_hi[MT][2], hq[MT][2];
#pragma unroll
      for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if constexpr (F::q6) {
            q[m][r] = q6_words2(blk[m][r] + 64 * q6_half + 8 * v);
            q_hi[m][r] = q6_words2(blk[m][r] + 64 * q6_half + 32 + 8 * v);
            hq[m][r] = q6_words2(blk[m][r] + 128 + 32 * q6_half + 8 * v);
          } else if constexpr (!F::mx) {
            q[m][r] = code_words<F>(blk[m][r], c, v);
            hq[m][r] = F::high_bits ? high_words(blk[m][r], v) : make_uint2(0u, 0u);
          }
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint4 b[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          b[j] = *reinterpret_cast<const uint4*>(xs + 8 * j * x_row_bytes + 16 * (4 * h + v));
        }
#pragma unroll
        for (int e = 0; e < 2; ++e) {
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            unsigned af[4];
            if constexpr (F::q6) {
              // Low group (h = 0): ql words of the first 32 bytes of the half, qh bits 4n' + 0-1;
              // high group: the next 32 bytes, bits 4n' + 2-3 (n' the nibble: 0 even c, 1 odd).
              const uint2& l0 = h ? q_hi[m][0] : q[m][0];
              const uint2& l1 = h ? q_hi[m][1] : q[m][1];
              const u32 a0 = (e ? l0.y : l0.x) >> nib_shift, a1 = (e ? l1.y : l1.x) >> nib_shift;
              const u32 h0 = (e ? hq[m][0].y : hq[m][0].x) >> (nib_shift + 2 * h);
              const u32 h1 = (e ? hq[m][1].y : hq[m][1].x) >> (nib_shift + 2 * h);
              const int k = 2 * h + (v >= 2 ? 1 : 0);  // sub-blocks of 16: words 0-3, 4-7
              af[0] = q6_pair(a0, h0, qs6[m][0].s[k]);
              af[1] = q6_pair(a1, h1, qs6[m][1].s[k]);
              af[2] = q6_pair(a0 >> 8, h0 >> 8, qs6[m][0].s[k]);
              af[3] = q6_pair(a1 >> 8, h1 >> 8, qs6[m][1].s[k]);
            } else if constexpr (F::mx) {
              // Elements 8v + 4e .. + 3 of block h: the low nibbles of code word 2v + e (v < 2), the
              // high nibbles of word 2(v - 2) + e.
              const int word = 2 * (v & 1) + e, sh = 4 * (v >> 1);
              const uint4& w0 = mxq[m][0][h];
              const uint4& w1 = mxq[m][1][h];
              const u32 a0 = (word == 0 ? w0.x : word == 1 ? w0.y : word == 2 ? w0.z : w0.w) >> sh;
              const u32 a1 = (word == 0 ? w1.x : word == 1 ? w1.y : word == 2 ? w1.z : w1.w) >> sh;
              af[0] = mx_pair(a0, mxs[m][0][h]);
              af[1] = mx_pair(a1, mxs[m][1][h]);
              af[2] = mx_pair(a0 >> 8, mxs[m][0][h]);
              af[3] = mx_pair(a1 >> 8, mxs[m][1][h]);
            } else {
              const row_scales& r0 = rs[m][0];
              const row_scales& r1 = rs[m][1];
              const u32 q0 = e ? q[m][0].y : q[m][0].x, q1 = e ? q[m][1].y : q[m][1].x;
              // Q5_K: lane c's fifth bits, sub-block 2c + h, at bit 0 of each byte.
              const u32 b0 = (e ? hq[m][0].y : hq[m][0].x) >> (2 * c + h);
              const u32 b1 = (e ? hq[m][1].y : hq[m][1].x) >> (2 * c + h);
              if (h == 0) {
                af[0] = dequant_pair<false>(q0, fifth_bits<false, false>(b0), r0.scale[0], r0.neg_offset[0]);
                af[1] = dequant_pair<false>(q1, fifth_bits<false, false>(b1), r1.scale[0], r1.neg_offset[0]);
                af[2] = dequant_pair<false>(q0 >> 8, fifth_bits<false, true>(b0), r0.scale[0], r0.neg_offset[0]);
                af[3] = dequant_pair<false>(q1 >> 8, fifth_bits<false, true>(b1), r1.scale[0], r1.neg_offset[0]);
              } else {
                af[0] = dequant_pair<true>(q0, fifth_bits<true, false>(b0), r0.scale[1], r0.neg_offset[1]);
                af[1] = dequant_pair<true>(q1, fifth_bits<true, false>(b1), r1.scale[1], r1.neg_offset[1]);
                af[2] = dequant_pair<true>(q0 >> 8, fifth_bits<true, true>(b0), r0.scale[1], r0.neg_offset[1]);
                af[3] = dequant_pair<true>(q1 >> 8, fifth_bits<true, true>(b1), r1.scale[1], r1.neg_offset[1]);
              }
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
              tc::mma_16816(acc[m][j], af, e ? b[j].z : b[j].x, e ? b[j].w : b[j].y);
            }
          }
        }
      }
    }
  }
  tc::cp_async_wait<0>();

  // acc[m][j]: rows (g, g + 8) of m-tile m, tokens (2c, 2c + 1) of n-tile j. Unsplit, they are the
  // result; split, each block leaves its sums in `partial` and the last block of a tile to finish
  // adds them up in split order (the same order whichever block finishes last).
  const bool split = !G && gridDim.z > 1;
  float* const y = split ? a.partial + std::size_t(blockIdx.z) * std::size_t(a.n_tokens) * std::size_t(a.out) : y_mat;
  int out_rows[NT][2];  // the y row of each of this lane's tokens, or -1
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int k = 0; k < 2; ++k) out_rows[j][k] = y_row(8 * j + 2 * c + k);
  }
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int o = row0 + 16 * (warp * MT + m) + g + 8 * half;
      if (o >= a.out) continue;
      const float b = !split && bias ? bias[o] : 0.f;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          if (out_rows[j][k] >= 0) y[std::size_t(out_rows[j][k]) * a.out + o] = acc[m][j][2 * half + k] + b;
        }
      }
    }
  }
  if (!split) return;
  __shared__ bool last;
  __threadfence();  // this block's sums are visible device-wide before it is counted
  __syncthreads();
  if (tid == 0) {
    const unsigned done = atomicAdd(&a.counters[blockIdx.y * gridDim.x + blockIdx.x], 1u);
    last = done == gridDim.z - 1;
  }
  __syncthreads();
  if (!last) return;
  if (tid == 0) a.counters[blockIdx.y * gridDim.x + blockIdx.x] = 0;  // zero again for the next GEMM
  __threadfence();
  // Each lane adds up the outputs it wrote itself, every split's loads of a round in flight at once.
  const std::size_t plane = std::size_t(a.n_tokens) * std::size_t(a.out);
  float total[MT][2][NT][2] = {};
  for (unsigned z = 0; z < gridDim.z; ++z) {
    const float* pz = a.partial + z * plane;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int o = min(row0 + 16 * (warp * MT + m) + g + 8 * half, a.out - 1);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            const int t = min(t0 + 8 * j + 2 * c + k, a.n_tokens - 1);
            total[m][half][j][k] += __ldcg(pz + std::size_t(t) * a.out + o);
          }
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int o = row0 + 16 * (warp * MT + m) + g + 8 * half;
      if (o >= a.out) continue;
      const float b = bias ? bias[o] : 0.f;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const int t = t0 + 8 * j + 2 * c + k;
          if (t < a.n_tokens) y_mat[std::size_t(t) * a.out + o] = total[m][half][j][k] + b;
        }
      }
    }
  }
#else
  (void)a;
#endif
}

// One launch's shape: warps, m-tiles and n-tiles per block, the grid, and the reduction split.
struct plan {
  int warps = 4, mt = 1, nt = 1;
  int token_tiles = 1, row_tiles = 1;
  int splits = 1, supers_per_split = 1;
  std::size_t partial_bytes(std::int64_t n_tokens, std::int64_t out) const {
    return splits > 1 ? std::size_t(splits) * std::size_t(n_tokens) * std::size_t(out) * sizeof(float) : 0;
  }
};

plan plan_for(std::int64_t n_tokens, std::int64_t in, std::int64_t out) {
  plan p;
  p.nt = n_tokens <= 8 ? 1 : n_tokens <= 16 ? 2 : n_tokens <= 32 ? 4 : 8;
  // 8 warps (128 rows) share a block's activations for 64 tokens and for tall weights; 4 (64 rows)
  // keep more blocks in flight for the rest (measured, as the split below).
  p.warps = p.nt == 8 || out >= 8192 ? 8 : 4;
  p.token_tiles = int((n_tokens + 8 * p.nt - 1) / (8 * p.nt));
  p.row_tiles = int((out + 16 * p.mt * p.warps - 1) / (16 * p.mt * p.warps));
  const int n_super = int((in + super_elems - 1) / super_elems);
  // Split the reduction (each part four super-blocks at least) while the grid is smaller than the
  // device: up to one block per multiprocessor for 64-token tiles (a block fills one), at least one
  // for the smaller tiles (several share one). Measured on the H200 against two blocks per
  // multiprocessor and against no split (gpu_roofline --quant-gemm, session 12 notes).
  const std::int64_t blocks = std::int64_t(p.token_tiles) * p.row_tiles, sms = gpu::multiprocessors();
  const std::int64_t by_grid = p.nt == 8 ? sms / blocks : (sms + blocks - 1) / blocks;
  const std::int64_t splits = std::clamp<std::int64_t>(std::min<std::int64_t>(by_grid, n_super / 4), 1, max_splits);
  p.splits = blocks < max_counters ? int(splits) : 1;
  p.supers_per_split = (n_super + p.splits - 1) / p.splits;
  p.splits = (n_super + p.supers_per_split - 1) / p.supers_per_split;  // none empty
  return p;
}

std::size_t round_up(std::size_t n) { return (n + 255) / 256 * 256; }

template <class F, int W, int MT, int NT, int S>
hipError_t launch_tile(const plan& pl, const gemm_quant_args& a, hipStream_t stream) {
#if defined(ANVIL_GPU_CUDA)
  using T = tile<F, W, MT, NT, S>;
  gpu::allow_dynamic_smem<gemm_kq_kernel<F, W, MT, NT, S>>(T::smem);
  const dim3 grid(unsigned(pl.token_tiles), unsigned(pl.row_tiles), unsigned(pl.splits));
  gpu::launch_dependent_smem(gemm_kq_kernel<F, W, MT, NT, S>, grid, dim3(T::threads), T::smem, stream, a);
  return hipGetLastError();
#else
  (void)pl, (void)a, (void)stream;
  return hipErrorNotSupported;
#endif
}

// Stages: four while a stage is small, three from 32 tokens on 8 warps (46 KB) and for 64 tokens (55 KB).
template <class F>
hipError_t launch_planned(const plan& pl, const gemm_quant_args& a, hipStream_t stream) {
  switch (pl.nt) {
    case 1: return pl.warps == 8 ? launch_tile<F, 8, 1, 1, 4>(pl, a, stream) : launch_tile<F, 4, 1, 1, 4>(pl, a, stream);
    case 2: return pl.warps == 8 ? launch_tile<F, 8, 1, 2, 4>(pl, a, stream) : launch_tile<F, 4, 1, 2, 4>(pl, a, stream);
    case 4: return pl.warps == 8 ? launch_tile<F, 8, 1, 4, 3>(pl, a, stream) : launch_tile<F, 4, 1, 4, 4>(pl, a, stream);
    default: return launch_tile<F, 8, 1, 8, 3>(pl, a, stream);
  }
}

// The experts' form: a block per (tile of one expert's pairs, 16 x W rows, matrix); no split.
template <class F, int W, int NT, int S>
hipError_t launch_experts_tile(const gemm_quant_args& a, std::int64_t n_pairs, std::int64_t n_expert, int mats,
                               hipStream_t stream) {
#if defined(ANVIL_GPU_CUDA)
  using T = tile<F, W, 1, NT, S>;
  gpu::allow_dynamic_smem<gemm_kq_kernel<F, W, 1, NT, S, true>>(T::smem);
  // Each active expert leaves at most one tile part-filled: the pairs' tiles plus one per expert
  // that can have pairs bound the count; blocks past the last tile return at once.
  const std::int64_t tiles = (n_pairs + T::tokens - 1) / T::tokens + std::min(n_expert, n_pairs);
  const dim3 grid(unsigned(tiles), unsigned((a.out + T::rows - 1) / T::rows), unsigned(mats));
  gpu::launch_dependent_smem(gemm_kq_kernel<F, W, 1, NT, S, true>, grid, dim3(T::threads), T::smem, stream, a);
  return hipGetLastError();
#else
  (void)a, (void)n_pairs, (void)n_expert, (void)mats, (void)stream;
  return hipErrorNotSupported;
#endif
}

// Pairs per tile from the mean pairs per expert that can have pairs (the route's spread is unknown
// here); 4 warps (64 rows) but for 64-pair tiles, as the dense plan.
template <class F>
hipError_t launch_experts(const gemm_quant_args& a, std::int64_t n_pairs, std::int64_t n_expert, int mats,
                          hipStream_t stream) {
  const std::int64_t mean = n_pairs / std::max<std::int64_t>(std::min(n_expert, n_pairs), 1);
  if (mean <= 8) return launch_experts_tile<F, 4, 1, 4>(a, n_pairs, n_expert, mats, stream);
  if (mean <= 16) return launch_experts_tile<F, 4, 2, 4>(a, n_pairs, n_expert, mats, stream);
  if (mean <= 32) return launch_experts_tile<F, 4, 4, 4>(a, n_pairs, n_expert, mats, stream);
  return launch_experts_tile<F, 8, 8, 3>(a, n_pairs, n_expert, mats, stream);
}

unsigned elementwise_blocks(std::int64_t n) { return unsigned(std::min<std::int64_t>((n + 255) / 256, 65536)); }

// A block's copy offsets are 32-bit: its rows' bytes and its tokens' activations below 2^31; the
// grid's rows (blocks of 64 rows at least) at most 65535.
bool shape_supported(std::int64_t in, std::int64_t out) {
  return in > 0 && in % super_elems == 0 && in < (std::int64_t(1) << 24) && out > 0 && out <= std::int64_t(65535) * 64;
}

bool format_supported(model::ggml_type type) {
  return type == model::ggml_type::Q4_K || type == model::ggml_type::Q5_K || type == model::ggml_type::Q6_K;
}

// The experts' form also takes MXFP4 (gpt-oss), whose rows need only be whole 32-element blocks.
bool experts_format_supported(model::ggml_type type) {
#if defined(ANVIL_GPU_CUDA)
  return (format_supported(type) || type == model::ggml_type::MXFP4) && tc::device_has_mma();
#else
  (void)type;
  return false;
#endif
}
bool experts_shape_supported(model::ggml_type type, std::int64_t in, std::int64_t out) {
  if (type != model::ggml_type::MXFP4) return shape_supported(in, out);
  return in > 0 && in % 32 == 0 && in < (std::int64_t(1) << 24) && out > 0 && out <= std::int64_t(65535) * 64;
}
// Where an expert's matrix may start: Q4_K/Q5_K blocks are copied as 16-byte units, Q6_K and
// MXFP4 blocks through 16-byte windows (2-byte and 1-byte aligned blocks).
std::size_t experts_align(model::ggml_type type) {
  return type == model::ggml_type::Q6_K ? 2 : type == model::ggml_type::MXFP4 ? 1 : 16;
}

}  // namespace

bool gemm_quant_supported(model::ggml_type type, std::int64_t n_tokens) {
#if defined(ANVIL_GPU_CUDA)
  return format_supported(type) && n_tokens >= 1 && n_tokens <= gemm_quant_max_tokens && tc::device_has_mma();
#else
  (void)type, (void)n_tokens;
  return false;
#endif
}

bool gemm_quant_preferred(model::ggml_type type, std::int64_t n_tokens, std::int64_t in, std::int64_t out) {
  return gemm_quant_supported(type, n_tokens) && shape_supported(in, out) && n_tokens <= gemm_quant_preferred_max_tokens &&
         out * in >= n_tokens * gemm_quant_min_weights_per_token;
}

bool gemm_quant_beats_gemv(model::ggml_type type, std::int64_t n_tokens, std::int64_t in, std::int64_t out) {
  const bool large = out * in >= gemm_quant_large_weight && type != model::ggml_type::Q6_K;
  const std::int64_t from = large ? gemm_quant_over_gemv_tokens_large : gemm_quant_over_gemv_tokens;
  return n_tokens >= from && gemm_quant_preferred(type, n_tokens, in, out);
}

// Workspace: [f16 activations][their sums per 32][tile counters][partial sums], each 256-byte aligned.
namespace {

std::size_t activation_bytes(std::int64_t n_tokens, std::int64_t in) {
  return round_up(std::size_t(n_tokens) * std::size_t(in) * 2) + round_up(std::size_t(n_tokens) * std::size_t(in / 32) * 2);
}
constexpr std::size_t counter_bytes = max_counters * sizeof(unsigned);

struct workspace_view {
  std::uint16_t* x16;
  std::uint16_t* xsum;
  unsigned* counters;
  float* partial;
};
workspace_view view(void* workspace, std::int64_t n_tokens, std::int64_t in) {
  auto* base = static_cast<unsigned char*>(workspace);
  return {.x16 = reinterpret_cast<std::uint16_t*>(base),
          .xsum = reinterpret_cast<std::uint16_t*>(base + round_up(std::size_t(n_tokens) * std::size_t(in) * 2)),
          .counters = reinterpret_cast<unsigned*>(base + activation_bytes(n_tokens, in)),
          .partial = reinterpret_cast<float*>(base + activation_bytes(n_tokens, in) + counter_bytes)};
}

bool valid(const matmul_params& p, const void* workspace, std::size_t workspace_bytes) {
  return gemm_quant_supported(p.w_type, p.n_tokens) && shape_supported(p.in, p.out) && p.x != nullptr && p.y != nullptr &&
         aligned16(p.w) && aligned16(p.x) && aligned16(workspace) &&
         workspace_bytes >= gemm_quant_workspace_bytes(p.w_type, p.in, p.out, p.n_tokens);
}

// x to f16 pairs and sums in the workspace; also zeroes the first n_counters tile counters (the
// experts' form splits nothing: 0, and its workspace has no counters).
hipError_t convert(const float* x, std::int64_t n_tokens, std::int64_t in, const workspace_view& ws, int n_counters,
                   hipStream_t stream) {
  const std::int64_t nx = n_tokens * in;
  gpu::launch_dependent(convert_pairs_kernel, dim3(elementwise_blocks(nx / 8)), dim3(256), stream, x, ws.x16, ws.xsum, nx,
                        ws.counters, n_counters);
  return hipGetLastError();
}

hipError_t multiply(const matmul_params& p, const workspace_view& ws, hipStream_t stream) {
  const plan pl = plan_for(p.n_tokens, p.in, p.out);
  const std::size_t row_bytes = *model::row_bytes(p.w_type, p.in);
  const gemm_quant_args a{.w = static_cast<const u8*>(p.w),
                          .w_end = static_cast<const u8*>(p.w) + std::size_t(p.out) * row_bytes,
                          .row_bytes = row_bytes,
                          .x16 = ws.x16,
                          .xsum = ws.xsum,
                          .bias = p.bias,
                          .y = p.y,
                          .partial = ws.partial,
                          .counters = ws.counters,
                          .in = int(p.in),
                          .out = int(p.out),
                          .n_tokens = int(p.n_tokens),
                          .supers_per_split = pl.supers_per_split};
  switch (p.w_type) {
    case model::ggml_type::Q5_K: return launch_planned<q5k_format>(pl, a, stream);
    case model::ggml_type::Q6_K: return launch_planned<q6k_format>(pl, a, stream);
    default: return launch_planned<q4k_format>(pl, a, stream);
  }
}

}  // namespace

std::size_t gemm_quant_workspace_bytes(model::ggml_type type, std::int64_t in, std::int64_t out, std::int64_t max_tokens) {
  if (!format_supported(type) || in <= 0 || out <= 0 || max_tokens <= 0) return 0;
  const std::int64_t top = std::min(max_tokens, gemm_quant_max_tokens);
  std::size_t partial = 0;
  for (std::int64_t n = 1; n <= top; ++n) partial = std::max(partial, round_up(plan_for(n, in, out).partial_bytes(n, out)));
  return activation_bytes(top, in) + counter_bytes + partial;
}

hipError_t launch_gemm_quant(const matmul_params& p, void* workspace, std::size_t workspace_bytes, hipStream_t stream) {
  return launch_gemm_quant_group(std::span<const matmul_params>(&p, 1), workspace, workspace_bytes, stream);
}

hipError_t launch_gemm_quant_group(std::span<const matmul_params> ps, void* workspace, std::size_t workspace_bytes,
                                   hipStream_t stream) {
  if (ps.empty()) return hipSuccess;
  for (const matmul_params& p : ps) {
    if (!valid(p, workspace, workspace_bytes) || p.x != ps[0].x || p.n_tokens != ps[0].n_tokens || p.in != ps[0].in) {
      return hipErrorInvalidValue;
    }
  }
  const workspace_view ws = view(workspace, ps[0].n_tokens, ps[0].in);
  hipError_t e = convert(ps[0].x, ps[0].n_tokens, ps[0].in, ws, max_counters, stream);
  for (std::size_t i = 0; i < ps.size() && e == hipSuccess; ++i) e = multiply(ps[i], ws, stream);
  return e;
}

bool gemm_quant_experts_supported(model::ggml_type type, std::int64_t in, std::int64_t out, std::size_t stride) {
  return experts_format_supported(type) && experts_shape_supported(type, in, out) && stride % experts_align(type) == 0 &&
         stride >= *model::row_bytes(type, in) * std::size_t(out);
}

bool gemm_quant_experts_preferred(model::ggml_type type, std::int64_t n_pairs, std::int64_t n_expert, std::int64_t in,
                                  std::int64_t out) {
  return experts_format_supported(type) && experts_shape_supported(type, in, out) && n_expert > 0 &&
         n_pairs >= gemm_quant_experts_min_pairs;
}

std::size_t gemm_quant_experts_workspace_bytes(std::int64_t in, std::int64_t rows) {
  return in > 0 && rows > 0 ? activation_bytes(rows, in) : 0;
}

hipError_t launch_gemm_quant_experts(const moe_matmul_params& p, void* workspace, std::size_t workspace_bytes,
                                     hipStream_t stream) {
  if (!gemm_quant_experts_supported(p.w_type, p.in, p.out, p.stride) || p.n_mats < 1 || p.n_mats > 2 || p.x == nullptr ||
      !aligned16(p.x) || p.x_div < 1 || p.n_pairs < 0 || p.n_pairs % p.x_div != 0 || p.n_expert < 1 ||
      p.n_expert > moe_max_experts || p.offsets == nullptr || p.sorted == nullptr || p.active == nullptr ||
      !aligned16(workspace)) {
    return hipErrorInvalidValue;
  }
  const std::int64_t rows = p.n_pairs / p.x_div;
  // Element offsets of x inside a block are 32-bit.
  if (rows * p.in >= (std::int64_t(1) << 31) || workspace_bytes < gemm_quant_experts_workspace_bytes(p.in, rows)) {
    return hipErrorInvalidValue;
  }
  for (int m = 0; m < p.n_mats; ++m) {
    if (p.w[m] == nullptr || reinterpret_cast<std::uintptr_t>(p.w[m]) % experts_align(p.w_type) != 0 || p.y[m] == nullptr) {
      return hipErrorInvalidValue;
    }
  }
  if (p.n_pairs == 0) return hipSuccess;
  const workspace_view ws = view(workspace, rows, p.in);
  if (const hipError_t e = convert(p.x, rows, p.in, ws, 0, stream); e != hipSuccess) return e;
  const std::size_t row_bytes = *model::row_bytes(p.w_type, p.in);
  const bool two = p.n_mats > 1;
  const gemm_quant_args a{.w = static_cast<const u8*>(p.w[0]),
                          .w_end = nullptr,
                          .row_bytes = row_bytes,
                          .x16 = ws.x16,
                          .xsum = ws.xsum,
                          .bias = p.bias[0],
                          .y = p.y[0],
                          .partial = nullptr,
                          .counters = nullptr,
                          .in = int(p.in),
                          .out = int(p.out),
                          .n_tokens = int(p.n_pairs),
                          .supers_per_split = int((p.in + super_elems - 1) / super_elems),
                          .w1 = static_cast<const u8*>(two ? p.w[1] : p.w[0]),
                          .y1 = two ? p.y[1] : p.y[0],
                          .bias1 = two ? p.bias[1] : p.bias[0],
                          .stride = p.stride,
                          .offsets = p.offsets,
                          .sorted = p.sorted,
                          .active = p.active,
                          .x_div = int(p.x_div)};
  switch (p.w_type) {
    case model::ggml_type::Q5_K: return launch_experts<q5k_format>(a, p.n_pairs, p.n_expert, p.n_mats, stream);
    case model::ggml_type::Q6_K: return launch_experts<q6k_format>(a, p.n_pairs, p.n_expert, p.n_mats, stream);
    case model::ggml_type::MXFP4: return launch_experts<mxfp4_format>(a, p.n_pairs, p.n_expert, p.n_mats, stream);
    default: return launch_experts<q4k_format>(a, p.n_pairs, p.n_expert, p.n_mats, stream);
  }
}

}  // namespace anvil::kernels
