// SwiGLU gate of the feed-forward block: out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + e^-x).
// gpt-oss's clamped variant (limit > 0): g = min(gate, limit), u = clamp(up, -limit, limit),
// out = g / (1 + e^(-alpha g)) * (u + 1).
// GeGLU (act gelu_tanh, Gemma): out = gelu(gate) * up with the tanh approximation,
// gelu(x) = x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))).
#pragma once

#include <cstdint>

namespace anvil::kernels {

enum class glu_activation : std::uint8_t { silu, gelu_tanh };

struct swiglu_params {
  const float* gate = nullptr;  // [n]
  const float* up = nullptr;    // [n]
  float* out = nullptr;         // [n]; may alias gate or up
  std::int64_t n = 0;
  float limit = 0.f;            // > 0: the clamped variant (silu only)
  float alpha = 1.f;
  glu_activation act = glu_activation::silu;
};

void swiglu_ref(const swiglu_params& p);

// The same op on rows with strides, so gate and up can be the two halves of one fused
// [rows, 2 * cols] projection (gate = buf, up = buf + cols, strides 2 * cols) or two buffers.
struct swiglu_rows_params {
  const float* gate = nullptr;     // row r at gate + r * gate_stride, cols elements
  const float* up = nullptr;       // row r at up + r * up_stride
  float* out = nullptr;            // row r at out + r * out_stride; may alias gate or up exactly
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t gate_stride = 0;    // in elements, >= cols
  std::int64_t up_stride = 0;
  std::int64_t out_stride = 0;
  float limit = 0.f;               // > 0: the clamped variant (silu only)
  float alpha = 1.f;
  glu_activation act = glu_activation::silu;
  // Optional (GPU only): out also rounded to 8 bits in the form the quantized GEMV reads
  // (kernels/gemv.h, gemv_x8_rows; rows of cols elements, packed): yq [rows, cols],
  // yq_scales [rows, cols / 16] pairs. Needs cols % 32 == 0 and the 16-byte aligned path. The
  // CPU reference ignores them.
  std::int8_t* yq = nullptr;
  float* yq_scales = nullptr;
};

// CPU reference: swiglu_ref row by row.
void swiglu_rows_ref(const swiglu_rows_params& p);

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// Elementwise, 16-byte accesses when every row start is 16-byte aligned. Rejects
// (hipErrorInvalidValue) negative sizes, strides below cols, and yq without its conditions.
hipError_t launch_swiglu(const swiglu_rows_params& p, hipStream_t stream);
}  // namespace anvil::kernels
#endif
