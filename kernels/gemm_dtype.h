// The math of the GPU worker's steps of many tokens (`--gemm-dtype`), host-safe so that the engine
// and the CLI name it in every build.
//   f16 — the default, exact up to f16 rounding: quantized weights multiply through f16 tensor
//         cores (kernels/gemm.h, kernels/gemm_quant.h).
//   fp8 — from kernels::gemm_fp8_min_tokens tokens (or logit rows) a step, FP8 E4M3 copies of
//         the layer weights and the output head (made once at start-up, beside the GGUF
//         weights) multiply x quantized to FP8 on every step, at the tensor cores' 8-bit rate
//         (kernels/gemm_fp8.h); NVIDIA compute capability 8.9+ only, and never on the CPU
//         backend. Lossy: 3 mantissa bits per operand.
#pragma once

#include <optional>
#include <string_view>

namespace anvil::kernels {

enum class gemm_dtype { f16, fp8 };

constexpr std::string_view gemm_dtype_name(gemm_dtype t) { return t == gemm_dtype::fp8 ? "fp8" : "f16"; }
inline std::optional<gemm_dtype> parse_gemm_dtype(std::string_view name) {  // "f16", "fp8"
  for (const gemm_dtype t : {gemm_dtype::f16, gemm_dtype::fp8}) {
    if (name == gemm_dtype_name(t)) return t;
  }
  return std::nullopt;
}

}  // namespace anvil::kernels
