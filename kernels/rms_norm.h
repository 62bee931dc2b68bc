// RMSNorm over the last dimension of a row-major matrix:
//   y[r, c] = x[r, c] / sqrt(mean_c(x[r, :]^2) + eps) * weight[c]
// rms_norm_ref() is the definition of the op (CPU, double accumulation); launch_rms_norm() is the
// GPU kernel (kernels/rms_norm.hip), declared only for translation units built with a GPU backend.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace anvil::kernels {

struct rms_norm_params {
  const float* x = nullptr;       // [rows, cols] input, row-major, contiguous
  const float* weight = nullptr;  // [cols] per-channel gain
  float* y = nullptr;             // [rows, cols] output; may be the same buffer as x
  std::int64_t rows = 0;          // number of independent rows (tokens)
  std::int64_t cols = 0;          // normalised dimension (hidden size), > 0
  float eps = 1e-6f;              // added to the mean square before the square root
  // Rows in groups, for qwen3's Q/K norm on the q or k heads inside each token's fused q/k/v
  // row: with group_rows > 0, row r lies at (r / group_rows) * group_stride + (r % group_rows) *
  // cols, in x and in y alike; 0 (the default): row r at r * cols.
  std::int64_t group_rows = 0;
  std::int64_t group_stride = 0;
};

// Where row r starts, in elements from x (and y).
ANVIL_HOST_DEVICE constexpr std::int64_t rms_norm_row_at(const rms_norm_params& p, std::int64_t r) {
  return p.group_rows > 0 ? r / p.group_rows * p.group_stride + r % p.group_rows * p.cols : r * p.cols;
}

// CPU reference: sums squares in double, one pass to normalise.
void rms_norm_ref(const rms_norm_params& p);

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// Enqueues the kernel on `stream`; returns the launch error (hipSuccess when none).
hipError_t launch_rms_norm(const rms_norm_params& p, hipStream_t stream);
}  // namespace anvil::kernels
#endif
