// Dequantization of a whole GGUF weight into an f16 or f32 matrix (the scratch a GEMM reads):
// one thread per chunk (gpu_quant.h). A block is a (chunks, rows) rectangle: threadIdx.x walks
// the chunks of a row, consecutive threads consecutive chunks, so loads and the 16-byte stores
// coalesce; threadIdx.y and blockIdx.x pick the row, blockIdx.y the stretch of the row. Every
// index is a product, never a run-time division (a 64-bit division costs more than the chunk).
#include <algorithm>

#include "kernels/gemm.h"
#include "kernels/gpu_quant.h"

namespace anvil::kernels {
namespace {

using namespace gpu_quant;

constexpr int dequant_threads = 256;

__device__ __forceinline__ void store_run(float* dst, const float* v, int n) {
  for (int i = 0; i < n; i += 4) gpu::store16(dst + i, make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]));
}
__device__ __forceinline__ void store_run(std::uint16_t* dst, const float* v, int n) {
  for (int i = 0; i < n; i += 8) {
    gpu::store16(dst + i, make_uint4(gpu::floats_to_half2_bits(v[i], v[i + 1]), gpu::floats_to_half2_bits(v[i + 2], v[i + 3]),
                                     gpu::floats_to_half2_bits(v[i + 4], v[i + 5]),
                                     gpu::floats_to_half2_bits(v[i + 6], v[i + 7])));
  }
}

template <class F, class Out>
__global__ void __launch_bounds__(dequant_threads)
    dequantize_kernel(const u8* __restrict__ src, Out* __restrict__ dst, std::int64_t rows, int chunks_per_row,
                      std::int64_t cols, std::size_t row_bytes) {
  constexpr int n = F::runs * F::run_len;
  const std::int64_t row = std::int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const int c = int(blockIdx.y * blockDim.x + threadIdx.x);
  if (row >= rows || c >= chunks_per_row) return;
  const int blk = c / F::chunks;  // compile-time divisor
  const int sub = c % F::chunks;
  float v[n];
  F::decode(src + std::size_t(row) * row_bytes + std::size_t(blk) * F::block_bytes, sub, v);
  Out* out = dst + row * cols + std::int64_t(blk) * F::block_elems;
#pragma unroll
  for (int k = 0; k < F::runs; ++k) store_run(out + F::run_start(sub, k), v + k * F::run_len, F::run_len);
}

template <class Out>
hipError_t launch(model::ggml_type type, const void* src, Out* dst, std::int64_t rows, std::int64_t cols,
                  hipStream_t stream) {
  const std::int64_t block = gpu_block_elems(type);
  if (block == 0 || rows < 0 || cols <= 0 || cols % block != 0) return hipErrorInvalidValue;
  if (rows == 0) return hipSuccess;
  if (!aligned16(src) || !aligned16(dst)) return hipErrorInvalidValue;
  const std::size_t row_bytes = *model::row_bytes(type, cols);
  hipError_t e = hipSuccess;
  with_format(type, [&](auto f) {
    using F = decltype(f);
    const std::int64_t chunks = cols / F::block_elems * F::chunks;
    // A row's chunks across x (a power of two up to the block), the rest of the block across rows.
    unsigned tx = 32;
    while (tx < unsigned(dequant_threads) && std::int64_t(tx) < chunks) tx *= 2;
    const unsigned ty = unsigned(dequant_threads) / tx;
    const std::int64_t gx = (rows + ty - 1) / ty, gy = (chunks + tx - 1) / tx;
    if (gx > 0x7fffffff || gy > 65535) {
      e = hipErrorInvalidValue;
      return;
    }
    dequantize_kernel<F, Out><<<dim3(unsigned(gx), unsigned(gy)), dim3(tx, ty), 0, stream>>>(
        static_cast<const u8*>(src), dst, rows, int(chunks), cols, row_bytes);
  });
  return e != hipSuccess ? e : hipGetLastError();
}

}  // namespace

hipError_t launch_dequantize(model::ggml_type type, const void* src, std::uint16_t* dst_f16, std::int64_t rows,
                             std::int64_t cols, hipStream_t stream) {
  return launch(type, src, dst_f16, rows, cols, stream);
}

hipError_t launch_dequantize_f32(model::ggml_type type, const void* src, float* dst, std::int64_t rows,
                                 std::int64_t cols, hipStream_t stream) {
  return launch(type, src, dst, rows, cols, stream);
}

}  // namespace anvil::kernels
