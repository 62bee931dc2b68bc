// Gemma 4 E2B / E4B's per-layer inputs (HF's project_per_layer_inputs): for each token and layer,
// that layer's slice of the embedding's projection, scaled and RMS-normed with a weight every layer
// shares, plus the same slice of the token's per-layer embedding (already looked up and scaled),
// the sum scaled:
//   y[t, l, :] = (rms_norm(proj_scale * y[t, l, :]) * norm + tok[t, l, :]) * sum_scale
// in place over y [n_tokens, n_layers * dim]. per_layer_inputs_ref() is the definition (CPU,
// what model/arch/cpu_forward.cpp runs: the scale in float, then rms_norm_ref's double sums);
// launch_per_layer_inputs() the GPU kernel (per_layer_inputs.hip).
#pragma once

#include <cstdint>

namespace anvil::kernels {

struct per_layer_inputs_params {
  float* y = nullptr;            // [n_tokens, n_layers * dim]: the projection in, the inputs out
  const float* tok = nullptr;    // [n_tokens, n_layers * dim]: the per-layer embeddings' rows
  const float* norm = nullptr;   // [dim]
  std::int64_t n_tokens = 0, n_layers = 0, dim = 0;
  float proj_scale = 1.f;        // 1 / sqrt(n_embd)
  float sum_scale = 1.f;         // 1 / sqrt(2)
  float eps = 1e-6f;
};

void per_layer_inputs_ref(const per_layer_inputs_params& p);

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// A group of 32 threads per (token, layer) row. Rejects (hipErrorInvalidValue) negative sizes and
// dim above 1024.
hipError_t launch_per_layer_inputs(const per_layer_inputs_params& p, hipStream_t stream);
}  // namespace anvil::kernels
#endif
