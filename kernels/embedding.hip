// Embedding gather with dequantization: block (x, t) decodes 256 chunks (gpu_quant.h) of the
// table row ids[t] into out[t, :] as float4 stores; consecutive threads take consecutive chunks.
#include "kernels/embedding.h"

#include "kernels/gpu_quant.h"

namespace anvil::kernels {
namespace {

using namespace gpu_quant;

constexpr int embedding_threads = 256;

template <class F>
__global__ void __launch_bounds__(embedding_threads) embedding_kernel(embedding_params p, std::size_t row_bytes) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  constexpr int n = F::runs * F::run_len;
  const std::int64_t t = blockIdx.y;
  const int chunks = int(p.n_embd / F::block_elems) * F::chunks;
  const int c = int(blockIdx.x) * embedding_threads + int(threadIdx.x);
  if (c >= chunks) return;
  const int blk = c / F::chunks, sub = c % F::chunks;
  const std::int32_t id = p.ids[t] - p.vocab_begin;
  float v[n];
  if (id >= 0 && id < p.n_vocab) {
    F::decode(static_cast<const u8*>(p.table) + std::size_t(id) * row_bytes + std::size_t(blk) * F::block_bytes, sub, v);
  } else {
#pragma unroll
    for (int i = 0; i < n; ++i) v[i] = 0.f;
  }
  if (p.scale != 1.f) {
#pragma unroll
    for (int i = 0; i < n; ++i) v[i] *= p.scale;
  }
  float* out = p.out + t * p.n_embd + std::int64_t(blk) * F::block_elems;
#pragma unroll
  for (int k = 0; k < F::runs; ++k) {
    float* dst = out + F::run_start(sub, k);
#pragma unroll
    for (int i = 0; i < F::run_len; i += 4) {
      const float* s = v + k * F::run_len + i;
      gpu::store16(dst + i, make_float4(s[0], s[1], s[2], s[3]));
    }
  }
}

}  // namespace

hipError_t launch_embedding(const embedding_params& p, hipStream_t stream) {
  const std::int64_t block = gpu_block_elems(p.type);
  if (block == 0 || p.n_tokens < 0 || p.n_embd <= 0 || p.n_embd % block != 0 || p.n_vocab < 0) {
    return hipErrorInvalidValue;
  }
  if (p.n_tokens == 0) return hipSuccess;
  if (p.n_tokens > 65535 || p.n_embd > (std::int64_t(1) << 30)) return hipErrorInvalidValue;  // grid.y; int chunks
  if (!aligned16(p.table) || !aligned16(p.out) || p.ids == nullptr) return hipErrorInvalidValue;
  const std::size_t row_bytes = *model::row_bytes(p.type, p.n_embd);
  with_format(p.type, [&](auto f) {
    using F = decltype(f);
    const std::int64_t chunks = p.n_embd / F::block_elems * F::chunks;
    const dim3 grid(unsigned((chunks + embedding_threads - 1) / embedding_threads), unsigned(p.n_tokens));
    gpu::launch_dependent(embedding_kernel<F>, grid, dim3(embedding_threads), stream, p, row_bytes);
  });
  return hipGetLastError();
}

}  // namespace anvil::kernels
