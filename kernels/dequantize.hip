// Dequantization of a whole GGUF weight into an f16 or f32 matrix (the scratch a GEMM reads):
// one thread per chunk (gpu_quant.h), a grid-stride loop over rows * chunks-per-row. Chunks of
// consecutive threads are consecutive in the row, so loads and the 16-byte stores coalesce.
#include <algorithm>

#include "kernels/gemm.h"
#include "kernels/gpu_quant.h"

namespace anvil::kernels {
namespace {

using namespace gpu_quant;

constexpr int dequant_threads = 256;

__device__ __forceinline__ void store_run(float* dst, const float* v, int n) {
  for (int i = 0; i < n; i += 4) *reinterpret_cast<float4*>(dst + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
}
__device__ __forceinline__ void store_run(std::uint16_t* dst, const float* v, int n) {
  for (int i = 0; i < n; i += 8) {
    u32 w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[j] = u32(gpu::float_to_half_bits(v[i + 2 * j])) | (u32(gpu::float_to_half_bits(v[i + 2 * j + 1])) << 16);
    }
    *reinterpret_cast<uint4*>(dst + i) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

template <class F, class Out>
__global__ void __launch_bounds__(dequant_threads)
    dequantize_kernel(const u8* src, Out* dst, std::int64_t rows, std::int64_t cols, std::size_t row_bytes) {
  constexpr int n = F::runs * F::run_len;
  const std::int64_t blocks_per_row = cols / F::block_elems;
  const std::int64_t chunks_per_row = blocks_per_row * F::chunks;
  const std::int64_t total = rows * chunks_per_row;
  for (std::int64_t i = std::int64_t(blockIdx.x) * dequant_threads + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * dequant_threads) {
    const std::int64_t row = i / chunks_per_row;
    const std::int64_t c = i % chunks_per_row;
    const std::int64_t blk = c / F::chunks;
    const int sub = int(c % F::chunks);
    float v[n];
    F::decode(src + std::size_t(row) * row_bytes + std::size_t(blk) * F::block_bytes, sub, v);
    Out* out = dst + row * cols + blk * F::block_elems;
#pragma unroll
    for (int k = 0; k < F::runs; ++k) store_run(out + F::run_start(sub, k), v + k * F::run_len, F::run_len);
  }
}

template <class Out>
hipError_t launch(model::ggml_type type, const void* src, Out* dst, std::int64_t rows, std::int64_t cols,
                  hipStream_t stream) {
  const std::int64_t block = gpu_block_elems(type);
  if (block == 0 || rows < 0 || cols <= 0 || cols % block != 0) return hipErrorInvalidValue;
  if (rows == 0) return hipSuccess;
  if (!aligned16(src) || !aligned16(dst)) return hipErrorInvalidValue;
  const std::size_t row_bytes = *model::row_bytes(type, cols);
  with_format(type, [&](auto f) {
    using F = decltype(f);
    const std::int64_t total = rows * (cols / F::block_elems) * F::chunks;
    // Enough blocks to fill any current GPU several times over; the loop covers the rest.
    const std::int64_t blocks = std::min<std::int64_t>((total + dequant_threads - 1) / dequant_threads, 65536);
    dequantize_kernel<F, Out><<<dim3(unsigned(blocks)), dequant_threads, 0, stream>>>(
        static_cast<const u8*>(src), dst, rows, cols, row_bytes);
  });
  return hipGetLastError();
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
