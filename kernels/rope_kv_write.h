// RoPE on q and k fused with the paged KV write: for each token, q is rotated in place and the
// rotated k and the plain v are stored (as f16, or as 8-bit codes with their row scales) at the
// token's slot of the device cache. This is rope_ref on q, rope_ref on k, then kv_write_ref
// (kernels/rope.h, kernels/attention.h), with the cache of the device (kernels/attention.h,
// paged_kv_device; kernels/kv_quant.h). k and v themselves are left unchanged: after this op only
// the cache holds the rotated k.
#pragma once

#include <cstdint>

#include "kernels/attention.h"
#include "kernels/rope.h"

namespace anvil::kernels {

struct rope_kv_write_params {
  float* q = nullptr;                       // [n_tokens, n_heads, head_dim], rotated in place
  const float* k = nullptr;                 // [n_tokens, n_kv_heads, head_dim]
  const float* v = nullptr;                 // [n_tokens, n_kv_heads, head_dim]
  paged_kv_device cache;                       // one layer; n_kv_heads and head_dim describe k and v too
  std::int64_t n_tokens = 0;
  std::int64_t n_heads = 0;                 // query heads
  std::int64_t rot_dim = 0;                 // even, <= head_dim, <= max_rot_dim
  const std::int32_t* positions = nullptr;  // [n_tokens]
  const std::int64_t* slots = nullptr;      // [n_tokens]: block_id * block_size + offset; < 0: not written
  float freq_base = 10000.f;
  float freq_scale = 1.f;
  const float* freq_factors = nullptr;      // [rot_dim / 2] or null
  rope_style style = rope_style::normal;
};

inline constexpr std::int64_t rope_max_rot_dim = 512;

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// A block per token and group of heads (8-bit caches: and per kv head). Rejects
// (hipErrorInvalidValue) rot_dim odd or > min(head_dim, 512), an 8-bit cache with head_dim > 512
// or without its scales, or more heads than 65535 blocks of a grid column hold.
// Slots are trusted to lie inside the cache (the KV manager hands them out).
hipError_t launch_rope_kv_write(const rope_kv_write_params& p, hipStream_t stream);
}  // namespace anvil::kernels
#endif
