// Quantized GEMV for decode batches: y[t, o] = sum_i W[o, i] * x[t, i] (+ bias[o]) for 1..8
// tokens, with W a GGUF weight uploaded verbatim (matmul_params, kernels/matmul.h; the CPU
// reference is matmul_ref). One kernel reads each weight byte once for every token of the batch:
// warps own rows, lanes own slices of a row. For the quantized weights with an integer path
// (gpu_quant_dot.h: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, IQ4_NL, MXFP4) the activations
// are first quantized to 8 bits (32-element blocks, as llama.cpp's Q8_1)
// into the caller's workspace and the weights are dotted with them in integers
// (kernels/gpu_quant_dot.h): the result is exact for the rounded activations, whose rounding
// (half a step of max|x| / 127 per block) is the only difference from matmul_ref. F32, F16 and
// BF16 weights use f32 activations (exact but for summation order) and need no workspace.
// gemv_activations::f32 asks for the float path for the quantized types too: each weight is
// decoded to the float model::dequantize_row gives and multiplied with x as it is, so the result
// is matmul_ref's but for summation order (what conformance runs use; no workspace needed).
// A producer kernel may leave x in the 8-bit form in the workspace itself (gemv_x8_view), and
// several matrices on the same x can share one launch (launch_gemv_group).
// Larger batches go to launch_gemm (kernels/gemm.h). Nothing here allocates.
#pragma once

#include <cstddef>
#include <span>

#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {

inline constexpr std::int64_t gemv_max_tokens = 8;

// How the quantized types meet the activations: rounded to 8 bits and dotted in integers, or
// as f32 against the decoded weights (F32/F16/BF16 weights always take the f32 path).
enum class gemv_activations { int8, f32 };

// True when launch_gemv decodes `t`: F32, F16, BF16 and every quantized type the CPU reads
// (Q2_K, Q3_K and IQ4_XS on the float path only).
bool gemv_supports(model::ggml_type t);

// Scratch bytes launch_gemv needs for this weight type, row length and up to max_tokens tokens
// (0 for the types without an integer path).
std::size_t gemv_workspace_bytes(model::ggml_type w_type, std::int64_t in, std::int64_t max_tokens);

// The 8-bit activations of a quantized GEMV inside its workspace, for n_tokens rows of `in`:
// row t's int8 values at q + t * in and its {scale, scale * sum} pairs (one per 16 elements) at
// ds + 2 * t * (in / 16). launch_gemv writes them from x; a kernel that produces x can write them
// itself instead (rms_norm_residual_params::yq, swiglu_rows_params::yq) and the GEMV then reads
// them as they are (gemv_x8_source::workspace).
struct gemv_x8_rows {
  std::int8_t* q = nullptr;
  float* ds = nullptr;
};
gemv_x8_rows gemv_x8_view(void* workspace, std::int64_t in, std::int64_t n_tokens);
// The bytes gemv_x8_view lays out for n_rows rows of `in` (in % 16 == 0), for any row count
// (the experts' 8-bit rows, one per (token, expert) pair, are more than gemv_max_tokens).
std::size_t gemv_x8_bytes(std::int64_t in, std::int64_t n_rows);

// Rounds n_rows rows of `in` floats at x (in % 32 == 0, x 16-byte aligned) into the 8-bit form
// at `out` (a gemv_x8_view of n_rows rows, in a workspace of gemv_x8_bytes(in, n_rows)), for
// kernels that read it with more rows than a GEMV takes (the experts, kernels/moe.h).
// hipErrorInvalidValue and nothing launched otherwise.
hipError_t launch_gemv_quantize_x(const float* x, std::int64_t in, std::int64_t n_rows, gemv_x8_rows out,
                                  hipStream_t stream);

// Where a quantized GEMV's 8-bit activations come from: rounded from x by this launch, or already
// in the workspace (from a producer kernel, or from the previous GEMV on the same x and batch).
// Ignored by the float path (F32/F16/BF16 weights, gemv_activations::f32), which reads x.
enum class gemv_x8_source { quantize, workspace };

// Enqueues the GEMV on `stream`. Preconditions, checked (hipErrorInvalidValue, nothing launched):
// 0 <= n_tokens <= gemv_max_tokens (0 launches nothing), out >= 0, in > 0 and a multiple of 8
// (F32, F16, BF16), 32 (the 32-element block types) or 256 (K-quants, IQ4_XS), w and x 16-byte aligned, a supported type,
// and for quantized types a 16-byte aligned workspace of at least
// gemv_workspace_bytes(w_type, in, n_tokens) bytes (it may be null for F32, F16 and BF16; it is
// overwritten, so one workspace serves GEMVs on one stream in turn). bias may be null; y must
// not alias x, w or the workspace.
// With gemv_activations::f32 the workspace is not used (it may be null).
hipError_t launch_gemv(const matmul_params& p, void* workspace, std::size_t workspace_bytes, hipStream_t stream,
                       gemv_activations activations = gemv_activations::int8,
                       gemv_x8_source source = gemv_x8_source::quantize);

// Up to gemv_max_group GEMVs on the same x in one launch (q, k and v; gate and up), so that small
// matrices do not each pay a launch and a ramp. Every p must pass launch_gemv's checks and share
// w_type, in, n_tokens and x (else hipErrorInvalidValue, nothing launched); each has its own w,
// out, bias and y. One kernel launch on either path (plus the quantization of x, unless
// `source` says it is in the workspace).
inline constexpr int gemv_max_group = 3;
hipError_t launch_gemv_group(std::span<const matmul_params> ps, void* workspace, std::size_t workspace_bytes,
                             hipStream_t stream, gemv_activations activations = gemv_activations::int8,
                             gemv_x8_source source = gemv_x8_source::quantize);

// One token's x as the RMSNorm of a residual stream, computed by each block of the launch that
// reads it instead of by a launch of its own (launch_rms_norm_residual with yq): x = rms_norm(h +
// delta) * weight, rounded to 8 bits, bit for bit what that kernel writes for rows of up to
// gemv_norm_max_cols (kernels/norm_device.h), so a decode step of a small model saves two launches
// a layer. Every block reads h and delta, so the sum cannot go back into h: with h_out set, the
// launch stores h + delta there (not overlapping h or delta), for the next norm to read.
struct gemv_norm_input {
  const float* h = nullptr;       // [in], 16-byte aligned
  const float* delta = nullptr;   // [in] added to h first, or null (the norm of h itself)
  const float* weight = nullptr;  // [in] the norm's gain, 16-byte aligned
  float* h_out = nullptr;         // [in] receives h + delta (h without delta), or null
  float eps = 1e-6f;
};
inline constexpr std::int64_t gemv_norm_max_cols = 1024;

// launch_gemv_group for one token of a type with the integer path, x normed by every block from
// `norm` (x in ps is not read; no workspace). launch_gemv_group's checks, and in % 32 == 0,
// in <= gemv_norm_max_cols, the norm's pointers as above (else hipErrorInvalidValue, nothing
// launched). The outputs equal launch_rms_norm_residual's yq followed by launch_gemv_group with
// gemv_x8_source::workspace, bit for bit.
hipError_t launch_gemv_group_norm(std::span<const matmul_params> ps, const gemv_norm_input& norm, hipStream_t stream);

// Where one token's q, k and v of a plain attention layer go after their GEMV: q rotated in place
// of its output, k rotated and v as it is into the token's slot of an f16 cache, as
// launch_rope_kv_write does with them (kernels/rope_kv_write.h; no Q/K norms, query temperature or
// 8-bit cache: those need a whole head in one block).
struct gemv_rope_kv {
  const double* angles = nullptr;       // the token's rot_dim / 2 (sin, cos) pairs: launch_rope_angles
  std::int64_t head_dim = 0;            // even
  std::int64_t rot_dim = 0;             // even, <= head_dim
  rope_style style = rope_style::normal;
  paged_kv_device cache;                // f16, head_dim as above; its n_kv_heads * head_dim are k's and v's rows
  const std::int64_t* slot = nullptr;   // the token's slot (block_id * block_size + offset); < 0: not cached
};

// launch_gemv_group_norm on {q, k, v} (ps[0..2]) followed by launch_rope_kv_write on its outputs,
// in one launch: a warp's rows are rotary pairs, so each warp rotates what it computed and stores
// it where the attention reads it. ps[0].y receives the rotated q; k and v go to the cache only
// (ps[1].y and ps[2].y are not written). launch_gemv_group_norm's checks, and three matrices,
// ps[0].out a multiple of head_dim, ps[1].out == ps[2].out == cache.n_kv_heads * head_dim, the rope
// as gemv_rope_kv says (else hipErrorInvalidValue, nothing launched). Bit for bit what the two
// launches give; a decode step of a small model saves a launch a layer.
hipError_t launch_gemv_qkv_rope(std::span<const matmul_params> ps, const gemv_norm_input& norm,
                                const gemv_rope_kv& rope, hipStream_t stream);

// The same rotation and caching for rows of any width, on the 8-bit x of launch_gemv_group (rounded
// from ps[0].x by this launch, or already in the workspace: `source`): launch_gemv_group on one
// token's q/k/v followed by launch_rope_kv_write's work on them, in one launch. Where the three
// differ in weight type (a Q4_K_M file's Q6_K v), each run of one type is its own launch: ps holds
// parts first, first + 1, ... of {q, k, v} (0 q, 1 k, 2 v), q's output rotated into its y, k's and
// v's into the cache only. launch_gemv_group's checks (int8 activations), one token, first and the
// run inside {q, k, v}, and the shapes and rope launch_gemv_qkv_rope checks for the parts present
// (else hipErrorInvalidValue, nothing launched). Bit for bit what the two launches give; a decode
// step of a model too wide for the normed launches saves a launch a layer.
hipError_t launch_gemv_rope_run(std::span<const matmul_params> ps, int first, const gemv_rope_kv& rope, void* workspace,
                                std::size_t workspace_bytes, hipStream_t stream,
                                gemv_x8_source source = gemv_x8_source::quantize);

// The feed-forward's gate and up projections and their gated product in one launch, for batch-1
// decode: y[o] = act(W_gate[o] . x8, W_up[o] . x8) with act one of swiglu_ref's forms (limit,
// alpha, act as in swiglu_rows_params). What launch_gemv_group on {gate, up} followed by
// launch_swiglu gives, bit for bit, in one launch instead of two; with yq set, y is also rounded to
// 8 bits in the gemv_x8_view layout (as swiglu_rows_params::yq), so the down projection's GEMV
// reads it as it is. A block owns 32 rows of both matrices, so that it holds whole 8-bit groups:
// coarser than the GEMV's tiles, so larger matrices are faster as two launches
// (gemv_glu_preferred). Weights with the integer path only (gemv_glu_supports) on 8-bit x: rounded
// from x by this launch into the workspace, or already there (gemv_x8_source::workspace). No biases.
struct gemv_glu_params {
  const void* gate = nullptr;     // [out][row_bytes(w_type, in)], 16-byte aligned
  const void* up = nullptr;       // the same shape and type
  model::ggml_type w_type = model::ggml_type::Q8_0;
  std::int64_t in = 0;
  std::int64_t out = 0;
  const float* x = nullptr;       // [n_tokens, in]; read only with gemv_x8_source::quantize
  float* y = nullptr;             // [n_tokens, out]
  std::int64_t n_tokens = 0;
  float limit = 0.f;
  float alpha = 1.f;
  glu_activation act = glu_activation::silu;
  gemv_x8_rows yq{};              // optional (both or neither): out % 32 == 0, 16-byte aligned, not
                                  // overlapping the workspace's 8-bit x
  // Optional (norm.h set): x is the norm of a residual stream, computed by each block
  // (gemv_norm_input: in % 32 == 0, in <= gemv_norm_max_cols); x, the workspace and the source
  // are then not used (the workspace may be null).
  gemv_norm_input norm{};
};

// One token: with more, each warp's four row tiles spill their registers.
inline constexpr std::int64_t gemv_glu_max_tokens = 1;

// True for the weight types launch_gemv_glu takes: those with the integer path.
bool gemv_glu_supports(model::ggml_type t);

// Whether the worker takes the fused launch for `out` rows of a supported type: while its blocks of
// 32 rows fit in one wave (two a multiprocessor for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; one for the
// types whose decoders need more registers). Measured on the H200 (bench/GPU_NOTES.md session 37):
// 1.2-2.1x on the gate/up of 0.5B-1B widths alone; past one wave the K-quants lose (0.8x), and a
// whole llama3-8b Q8_0 decodes 3% slower with it although its gate/up alone gain 4%.
bool gemv_glu_preferred(model::ggml_type w_type, std::int64_t out);

// Preconditions, checked (hipErrorInvalidValue, nothing launched): gemv_glu_supports(w_type),
// 0 <= n_tokens <= gemv_glu_max_tokens (0 launches nothing), out >= 0, in > 0 a multiple of the
// type's block, 16-byte aligned weights (and x when quantized here), y set, a 16-byte aligned
// workspace of at least gemv_workspace_bytes(w_type, in, n_tokens) unless x is normed here (norm),
// yq as above, norm as gemv_norm_input says, and no limit with GeGLU. y must not alias x, the weights or the workspace.
hipError_t launch_gemv_glu(const gemv_glu_params& p, void* workspace, std::size_t workspace_bytes, hipStream_t stream,
                           gemv_x8_source source = gemv_x8_source::quantize);

// For benchmarks (bench/gpu_roofline) choosing launch_gemv's batch-1 tile: the integer GEMV of a
// quantized type for one token, with `rows_per_warp` rows per warp and `slices_per_lane` slices
// in flight per lane — (1|2|4, 1|2|4), not (4, 4) — instead of the built-in table's. The same
// checks as launch_gemv, and hipErrorInvalidValue for another batch, type or tile.
hipError_t launch_gemv_b1_tile(const matmul_params& p, void* workspace, std::size_t workspace_bytes, hipStream_t stream,
                               int rows_per_warp, int slices_per_lane,
                               gemv_x8_source source = gemv_x8_source::quantize);

}  // namespace anvil::kernels
#endif
