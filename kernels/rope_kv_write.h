// RoPE on q and k fused with the paged KV write: for each token, q is rotated in place and the
// rotated k and the plain v are stored (as f16, or as 8-bit codes with their row scales) at the
// token's slot of the device cache. This is rope_ref on q, rope_ref on k, then kv_write_ref
// (kernels/rope.h, kernels/attention.h), with the cache of the device (kernels/attention.h,
// paged_kv_device; kernels/kv_quant.h). k and v themselves are left unchanged: after this op only
// the cache holds the rotated k.
//
// Models with Q/K norms (qwen3) normalise each q and k head before the rotation; given their
// weights (q_norm, k_norm) the op does that too, in launch_rms_norm's arithmetic for heads of up
// to 512 (kernels/rms_norm.h: the same floats as that op in place, then this one), which saves
// those launches.
//
// The angles are computed apart, once per step for every layer (rope_angles_params): each
// token's position gives the same (sin, cos) pairs in every layer and every head, and computing
// them in double (as rope_ref does, so that a position of 100k keeps its angle) for each head of
// each layer was most of the op's time (bench/GPU_NOTES.md, session 17).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/attention.h"
#include "kernels/rope.h"

namespace anvil::kernels {

struct rope_kv_write_params {
  float* q = nullptr;                       // [n_tokens, n_heads, head_dim], rotated in place (or from q_in)
  const float* k = nullptr;                 // [n_tokens, n_kv_heads, head_dim], rows k_stride apart
  const float* v = nullptr;                 // [n_tokens, n_kv_heads, head_dim], rows v_stride apart
  // Inputs inside one fused q/k/v row per token (the FP8 path's stacked projection): q_in, when
  // set, is read (rows q_in_stride apart) and the rotated q written to q, packed; k_stride and
  // v_stride are the elements from one token's k (v) row to the next, 0 for packed rows.
  const float* q_in = nullptr;
  std::int64_t q_in_stride = 0, k_stride = 0, v_stride = 0;
  // The elements from one head of q_in to the next (0: head_dim): Qwen3.5's q projection gives
  // each head's query followed by its output gate (2 head_dim apart).
  std::int64_t q_in_head_stride = 0;
  paged_kv_device cache;                       // one layer; n_kv_heads and head_dim describe k and v too
  std::int64_t n_tokens = 0;
  std::int64_t n_heads = 0;                 // query heads
  std::int64_t rot_dim = 0;                 // even, <= head_dim, <= max_rot_dim
  const double* angles = nullptr;           // [n_tokens][rot_dim / 2] (sin, cos): launch_rope_angles
  const std::int64_t* slots = nullptr;      // [n_tokens]: block_id * block_size + offset; < 0: not written
  rope_style style = rope_style::normal;
  // Optional: RMSNorm weights [head_dim] over each q head and each k head, applied first (with
  // q_norm, q's dimensions past rot_dim are written normalised too); norm_eps their epsilon.
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  // Optional (gemma4): each v head normalised by RMSNorm without a weight (a gain of ones) before
  // it is stored, in the arithmetic of the Q/K norms; v itself is left unchanged.
  bool v_norm = false;
  float norm_eps = 1e-6f;
  // Optional: each token's query temperature [n_tokens] (launch_rope_angles writes it): the rotated
  // q is multiplied by it, as rope_ref followed by a multiplication by kernels::attn_temperature.
  // Needs rot_dim == head_dim.
  const float* q_scales = nullptr;
  // gemma4 E2B / E4B's shared-KV layers: only q is rotated (and normed); k, v, slots and the cache
  // are neither read nor written (k, v and slots may be null; the cache gives head_dim).
  bool q_only = false;
};

// The (sin, cos) of each token's angle for each of the rot_dim / 2 rotated pairs, pair i of
// position p at theta = p * freq_scale * freq_base^(-2i / rot_dim) / freq_factors[i], in double.
struct rope_angles_params {
  const std::int32_t* positions = nullptr;  // [n_tokens]
  std::int64_t n_tokens = 0;
  std::int64_t rot_dim = 0;                 // even, <= max_rot_dim
  float freq_base = 10000.f;
  float freq_scale = 1.f;
  const float* freq_factors = nullptr;      // [rot_dim / 2] or null
  double* out = nullptr;                    // [n_tokens][rot_dim / 2][2]: sin, then cos
  // Optional (mistral3): each token's query temperature, attn_temperature(position, attn_temp_scale,
  // attn_temp_floor), into q_scales [n_tokens].
  float* q_scales = nullptr;
  float attn_temp_scale = 0.f;
  std::int64_t attn_temp_floor = 0;
};
inline std::size_t rope_angles_bytes(std::int64_t n_tokens, std::int64_t rot_dim) {
  return std::size_t(n_tokens) * std::size_t(rot_dim) * sizeof(double);
}

inline constexpr std::int64_t rope_max_rot_dim = 512;

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// A block per token and group of heads (8-bit caches: and per kv head). Rejects
// (hipErrorInvalidValue) rot_dim odd or > min(head_dim, 512), an 8-bit cache with head_dim > 512
// or without its scales, a stride shorter than its row, q_scales with rot_dim < head_dim, or
// more heads than 65535 blocks of a grid column hold.
// Slots are trusted to lie inside the cache (the KV manager hands them out).
hipError_t launch_rope_kv_write(const rope_kv_write_params& p, hipStream_t stream);
// A thread per (token, pair). Rejects (hipErrorInvalidValue) rot_dim odd or > 512, a missing
// output, and q_scales without a positive attn_temp_floor.
hipError_t launch_rope_angles(const rope_angles_params& p, hipStream_t stream);
}  // namespace anvil::kernels
#endif
