// Matrix multiply against a GGUF weight: y[t, o] = sum_i W[o, i] * x[t, i] (+ bias[o]).
// W is stored as GGUF stores it — `out` rows of `in` elements, each row in the weight's quant
// format (F32, F16, BF16 and every quantized type the CPU reads) — the layout of PyTorch's [out, in].
// matmul_ref is the definition (float accumulation per block); it dequantizes each weight row
// once and reuses it for every token, and splits the rows over the CPU's cores.
#pragma once

#include <cstdint>

#include "model/quant/quant.h"

namespace anvil::kernels {

struct matmul_params {
  const void* w = nullptr;                       // [out][row_bytes(w_type, in)]
  model::ggml_type w_type = model::ggml_type::F32;
  std::int64_t in = 0;                           // input features (row length of W)
  std::int64_t out = 0;                          // output features (rows of W)
  const float* bias = nullptr;                   // [out] or null
  const float* x = nullptr;                      // [n_tokens, in]
  float* y = nullptr;                            // [n_tokens, out]; must not alias x
  std::int64_t n_tokens = 0;
  // GPU only: an f16 copy of a quantized / f32 W, [out][in], made once at start-up (kernels/gemm.h's
  // vendor-BLAS path multiplies it instead of dequantizing W into its workspace on every call).
  const void* w16 = nullptr;
};

void matmul_ref(const matmul_params& p);

}  // namespace anvil::kernels
