// GEMM on the quantized blocks (kernels/gemm.h's `quantized` algorithm): y[t, o] = sum_i W[o, i] *
// x[t, i] (+ bias) with W read once per step as GGUF stores it, no f16 copy of it in between.
//
// Tensor cores (mma.sync m16n8k16, f16 operands, f32 accumulation; NVIDIA sm_80+): the rows of W
// are the products' 16 rows, the tokens their 8 columns, so a step of 8 tokens wastes nothing. A
// block of 4 or 8 warps streams (rows of W) x (one 256-element super-block) and (tokens) x (the
// same 256 activations, in f16) through a ring of cp.async stages in shared memory; each warp
// turns its rows' codes into f16 in registers (code | 0x6400 is 1024 + code; one f16 fma with the
// scale and minus 1024 x scale, exact, leaves code x scale) and multiplies them against the
// activations of every token of the block; the sub-blocks' mins enter as one more product per
// super-block (-dmin m against each 32 activations' sum). Small steps split the reduction over
// blocks: each leaves its partial sums in the workspace and the last of a tile to finish adds them
// in split order (the result does not depend on timing).
//
// Error: code x scale rounded to f16 once (the scale d sc rounded to f16 first), dmin m in f16
// against f16 sums of 32 activations, x rounded to f16, products summed in f32: the order of the
// dequantize-then-vendor-GEMM path's error. Range: 1024 x scale must stay finite in f16, so
// sub-block scales up to 64 (weights up to ~1000; the dequantizing path's f16 copy stops at 65504).
//
// Types: Q4_K, Q5_K (the fifth bit joins the code before the f16 conversion), Q6_K (no mins; the
// code less 32 exactly in f16, then times the scale; blocks only 2-byte aligned, staged through
// 16-byte windows). Nothing here allocates; the workspace is the caller's (gemm_workspace_bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/matmul.h"
#include "kernels/moe.h"

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {

// The most tokens one launch takes.
inline constexpr std::int64_t gemm_quant_max_tokens = 128;

// Whether launch_gemm_quant takes this weight type and step on the device in use.
bool gemm_quant_supported(model::ggml_type type, std::int64_t n_tokens);

// Whether it is also the faster path (launch_gemm's choice). Measured (gpu_roofline --quant-gemm, H100
// and H200): it is up to 64 tokens while the weight has at least 2^17 elements per token (up to 32
// tokens: every matrix of an 8B model; 64: 4096x4096 and up); past that the products dominate and
// the vendor GEMM's tensor-core rate wins (on the H200 at 128 tokens on 14336x4096 already).
inline constexpr std::int64_t gemm_quant_preferred_max_tokens = 64;
inline constexpr std::int64_t gemm_quant_min_weights_per_token = std::int64_t(1) << 17;
bool gemm_quant_preferred(model::ggml_type type, std::int64_t n_tokens, std::int64_t in, std::int64_t out);

// Whether it also beats the GEMV (kernels/gemv.h, 8-bit activations) on a step of at most
// gemv_max_tokens tokens. Measured (gpu_roofline --quant-gemm, H200): from 8 tokens on every
// weight, from 4 on Q4_K/Q5_K weights of 2^25 elements and more (14336x4096: GEMV 27.8 us at 4
// tokens, this 22.0; Q6_K 4096x14336: GEMV 35.9, this 49.8); below that the GEMV's time grows
// with the tokens from well under this path's floor.
inline constexpr std::int64_t gemm_quant_over_gemv_tokens = 8;
inline constexpr std::int64_t gemm_quant_over_gemv_tokens_large = 4;
inline constexpr std::int64_t gemm_quant_large_weight = std::int64_t(1) << 25;
bool gemm_quant_beats_gemv(model::ggml_type type, std::int64_t n_tokens, std::int64_t in, std::int64_t out);

// Workspace bytes for every n_tokens <= max_tokens (the f16 activations and the partial sums).
std::size_t gemm_quant_workspace_bytes(model::ggml_type type, std::int64_t in, std::int64_t out, std::int64_t max_tokens);

// Enqueues the GEMM. Preconditions: gemm_quant_supported(p.w_type, p.n_tokens), p.in a multiple of
// 256 and below 2^24, p.out at most 65535 x 64, W, x and the workspace 16-byte aligned,
// workspace_bytes >= gemm_quant_workspace_bytes(...); hipErrorInvalidValue and nothing launched
// when violated.
hipError_t launch_gemm_quant(const matmul_params& p, void* workspace, std::size_t workspace_bytes, hipStream_t stream);

// Several GEMMs on the same x (q, k, v; gate, up): x converted once for all. Each p as above, all
// with the same x, n_tokens and in (hipErrorInvalidValue and nothing launched otherwise).
hipError_t launch_gemm_quant_group(std::span<const matmul_params> ps, void* workspace, std::size_t workspace_bytes,
                                   hipStream_t stream);

// The experts' form (kernels/moe.h's step 2 on tensor cores): for each expert with pairs, its
// pairs in tiles of 8 to 64 (by the mean pairs per expert), each tile's rows of x gathered by pair
// (row p / x_div) and its outputs written to the pairs' rows of y; the expert's rows are read once
// per tile. One or two stacks (gate and up) on the same x and routing; biases [n_expert][out]. The
// tiles are found on the device from launch_moe_route's offsets and active list: nothing comes
// back to the host. No split of the reduction: small steps take the GEMV (launch_moe_matmul).
// Types: Q4_K, Q5_K, Q6_K, and MXFP4 (rows of whole 32-element blocks, any byte alignment; each
// weight code x 2^(E-127) in f16: exact for block scales 2^-23 .. 2^1 (E 104..128); below, the
// smallest weights round to f16's subnormal step 2^-24; above, infinite. Real files stay well
// inside).
bool gemm_quant_experts_supported(model::ggml_type type, std::int64_t in, std::int64_t out, std::size_t stride);
// Whether it beats launch_moe_matmul on 8-bit rows: from 64 pairs in the step. Measured
// (gpu_roofline --moe, H200, pairs spread evenly over the experts): the GEMM wins from 64 pairs on
// both shapes there (qwen3-30b-a3b at 8 tokens: gate+up 57.1 us against the GEMV's 66.0, down
// 54.4 against 55.9; gpt-oss-20b at 16 tokens: 174.1 against 190.5), the GEMV below (qwen3 at 4
// tokens: 33.7 against 41.8; gpt-oss at 8: 158.0 against 174.0).
inline constexpr std::int64_t gemm_quant_experts_min_pairs = 64;
bool gemm_quant_experts_preferred(model::ggml_type type, std::int64_t n_pairs, std::int64_t n_expert, std::int64_t in,
                                  std::int64_t out);
// Workspace bytes for `rows` rows of x (n_pairs / x_div).
std::size_t gemm_quant_experts_workspace_bytes(std::int64_t in, std::int64_t rows);
// Preconditions: gemm_quant_experts_supported, x (f32; xq is not read) and the workspace 16-byte
// aligned, w 16-byte aligned (Q6_K: 2; MXFP4: any), n_pairs a multiple of x_div, rows x in below 2^31;
// hipErrorInvalidValue and nothing launched when violated.
hipError_t launch_gemm_quant_experts(const moe_matmul_params& p, void* workspace, std::size_t workspace_bytes,
                                     hipStream_t stream);

}  // namespace anvil::kernels
#endif
