// The attention output gate of Qwen3.5's full-attention layers: each head's output multiplied,
// element by element, by the sigmoid of its gate, which the q projection made beside the query
// (hparams::attn_out_gate):
//   x[t, h, i] *= sigmoid(gate[t * gate_row_stride + h * gate_head_stride + i])
// output_gate_ref() is the definition (CPU); launch_output_gate() the GPU kernel (output_gate.hip).
#pragma once

#include <cstdint>

namespace anvil::kernels {

struct output_gate_params {
  float* x = nullptr;                   // [rows, heads, head_dim], gated in place
  const float* gate = nullptr;          // head h of row t at t * gate_row_stride + h * gate_head_stride
  std::int64_t rows = 0, heads = 0, head_dim = 0;
  std::int64_t gate_row_stride = 0, gate_head_stride = 0;
};

void output_gate_ref(const output_gate_params& p);

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// A thread per element. Rejects (hipErrorInvalidValue) negative sizes and strides shorter than
// what they skip.
hipError_t launch_output_gate(const output_gate_params& p, hipStream_t stream);
}  // namespace anvil::kernels
#endif
