// Rotary position embedding, in place, on q or k laid out [n_tokens, n_heads, head_dim].
// Pair i (of rot_dim/2) of a head turns by the angle pos * freq_scale / freq_factors[i] *
// freq_base^(-2i / rot_dim). GGUF `llama` models pair adjacent elements (2i, 2i+1) — the
// converter permuted Q/K for it — while `qwen2`/`qwen3` pair the halves (i, i + rot_dim/2), as
// GPT-NeoX and HF's rotate_half do. Dimensions past rot_dim are left alone.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace anvil::kernels {

enum class rope_style { normal, neox };

struct rope_params {
  float* x = nullptr;                    // [n_tokens, n_heads, head_dim], rotated in place
  std::int64_t n_tokens = 0;
  std::int64_t n_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t rot_dim = 0;              // even, <= head_dim
  const std::int32_t* positions = nullptr;  // [n_tokens]
  float freq_base = 10000.f;
  float freq_scale = 1.f;                // linear scaling: 1 / factor
  const float* freq_factors = nullptr;   // [rot_dim / 2] or null (Llama 3.1's rope_freqs)
  rope_style style = rope_style::normal;
};

// Llama 4's attention temperature (mistral3's too): the factor a query at position pos is multiplied
// by after its rotation, 1 + scale * ln(1 + floor(pos / floor_scale)) (1 below floor_scale), in
// double and rounded to float once, so the CPU reference and the GPU kernels scale by the same float.
ANVIL_HOST_DEVICE inline float attn_temperature(std::int64_t pos, float scale, std::int64_t floor_scale) {
  return float(1.0 + double(scale) * ::log(1.0 + double(pos / floor_scale)));
}

// Computes the angles in double: the reference is as exact as the op's definition allows.
void rope_ref(const rope_params& p);

}  // namespace anvil::kernels
