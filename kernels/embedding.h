// Embedding lookup: out[t, :] = dequantize(table row ids[t]) * scale. The table is a GGUF token_embd
// weight ([n_vocab rows] of n_embd elements in any supported quant format).
#pragma once

#include <cstdint>

#include "model/quant/quant.h"

namespace anvil::kernels {

struct embedding_params {
  const void* table = nullptr;
  model::ggml_type type = model::ggml_type::F32;
  std::int64_t n_embd = 0;
  std::int64_t n_vocab = 0;
  const std::int32_t* ids = nullptr;  // [n_tokens], each in [0, n_vocab)
  std::int64_t n_tokens = 0;
  float* out = nullptr;               // [n_tokens, n_embd]
  float scale = 1.f;                  // each element times this (Gemma: sqrt(n_embd))
  // A tensor-parallel rank's slice of the vocabulary (model/arch/tensor_parallel.h): `table` holds
  // tokens [vocab_begin, vocab_begin + n_vocab), ids are taken relative to it, and on the GPU an id
  // outside the slice gives a row of zeros (the ranks' rows summed are the embedding).
  std::int32_t vocab_begin = 0;
};

void embedding_ref(const embedding_params& p);

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// Enqueues the gather on `stream` (kernels/embedding.hip). Types: those launch_gemv decodes
// (kernels/gemv.h); n_embd a multiple of their block (8, 32 or 256); table and out 16-byte aligned; hipErrorInvalidValue and nothing launched otherwise.
// A token id outside [0, n_vocab) cannot throw on the device: its row of `out` is zeros (the
// worker validates ids before they get here).
hipError_t launch_embedding(const embedding_params& p, hipStream_t stream);
}  // namespace anvil::kernels
#endif
