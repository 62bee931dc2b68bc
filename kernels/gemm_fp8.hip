// The 8-bit GEMM (kernels/gemm_fp8.h): the quantization kernels (an f32 or f16 matrix to E4M3
// codes and one scale), the start-up copy of a weight, and the launcher that quantizes x once per
// projection group and hands the products to cuBLASLt.
//
// Quantization, two kernels of a block of 256 threads per row (grid-stride over rows): the first
// writes each row's largest finite magnitude, the second reduces those to the matrix's, derives
// the scale and writes four codes per thread and step (x is read twice; the second read mostly
// from L2). Codes come from the conversion instruction on sm_89+
// (cvt.rn.satfinite.e4m3x2.f32: nearest even, saturating at 448, the encoder of kv_quant.h bit for
// bit on finite values, but for a negative zero, which keeps its sign) and from fp8_e4m3_encode
// elsewhere.
#include "kernels/gemm_fp8.h"

#include <algorithm>

#include "kernels/gemm.h"
#include "kernels/kv_quant.h"

namespace anvil::kernels {
namespace {

constexpr int quant_threads = 256;
constexpr std::size_t round_up(std::size_t n) { return (n + 255) / 256 * 256; }

__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4(const std::uint16_t* p) {
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  return make_float4(gpu::half_bits_to_float(std::uint16_t(v.x & 0xffffu)), gpu::half_bits_to_float(std::uint16_t(v.x >> 16)),
                     gpu::half_bits_to_float(std::uint16_t(v.y & 0xffffu)), gpu::half_bits_to_float(std::uint16_t(v.y >> 16)));
}

// Four codes of a * inv .. d * inv, little-endian in one word.
__device__ __forceinline__ std::uint32_t encode4(float4 v, float inv) {
#if defined(ANVIL_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  std::uint16_t lo, hi;  // the instruction puts its first operand in the upper byte
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(v.y * inv), "f"(v.x * inv));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(v.w * inv), "f"(v.z * inv));
  return std::uint32_t(lo) | (std::uint32_t(hi) << 16);
#else
  return std::uint32_t(fp8_e4m3_encode(v.x * inv)) | (std::uint32_t(fp8_e4m3_encode(v.y * inv)) << 8) |
         (std::uint32_t(fp8_e4m3_encode(v.z * inv)) << 16) | (std::uint32_t(fp8_e4m3_encode(v.w * inv)) << 24);
#endif
}

// The largest finite magnitude of each row: a block of 256 threads per row (grid-stride).
__device__ __forceinline__ float finite_max(float m, float x) { return isfinite(x) ? fmaxf(m, fabsf(x)) : m; }

template <class T>
__global__ void __launch_bounds__(quant_threads)
    row_max_kernel(const T* __restrict__ x, std::int64_t rows, int cols, float* __restrict__ row_max) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * cols;
    float m = 0.f;
    for (int i = 4 * int(threadIdx.x); i < cols; i += 4 * quant_threads) {
      const float4 v = load4(row + i);
      m = finite_max(finite_max(finite_max(finite_max(m, v.x), v.y), v.z), v.w);
    }
    m = gpu::block_reduce_max<quant_threads>(m);
    if (threadIdx.x == 0) row_max[r] = m;
  }
}

// Every block reduces the n_maxima row maxima to the matrix's (a few KB from L2), block 0 writes
// the scale, then each block encodes its rows four values per thread and step. n_maxima may
// exceed rows: the rows of one part of a stacked matrix, scaled as the whole.
template <class T>
__global__ void __launch_bounds__(quant_threads)
    encode_kernel(const T* __restrict__ x, std::int64_t rows, int cols, const float* __restrict__ row_max,
                  std::int64_t n_maxima, std::uint8_t* __restrict__ codes, float* __restrict__ scale_out) {
  float m = 0.f;
  for (std::int64_t r = threadIdx.x; r < n_maxima; r += quant_threads) m = fmaxf(m, row_max[r]);
  m = gpu::block_reduce_max<quant_threads>(m);
  const float scale = m / 448.f, inv = scale > 0.f ? 1.f / scale : 0.f;
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_out = scale;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * cols;
    std::uint8_t* out = codes + r * cols;
    for (int i = 4 * int(threadIdx.x); i < cols; i += 4 * quant_threads) {
      *reinterpret_cast<std::uint32_t*>(out + i) = encode4(load4(row + i), inv);
    }
  }
}

unsigned row_blocks(std::int64_t rows) { return unsigned(std::min<std::int64_t>(rows, 65535)); }

// The row maxima are `given` (a producer wrote them) or computed into `scratch`.
template <class T>
hipError_t quantize(const T* x, std::int64_t rows, std::int64_t cols, std::uint8_t* codes, float* scale,
                    float* scratch, const float* given, hipStream_t stream) {
  if (rows < 0 || cols <= 0 || cols % 4 != 0 || cols >= (std::int64_t(1) << 31) || !gpu::aligned16(x) ||
      reinterpret_cast<std::uintptr_t>(codes) % 4 != 0 || scale == nullptr || (scratch == nullptr && given == nullptr)) {
    return hipErrorInvalidValue;
  }
  if (rows == 0) return hipSuccess;
  if (given == nullptr) row_max_kernel<T><<<row_blocks(rows), quant_threads, 0, stream>>>(x, rows, int(cols), scratch);
  encode_kernel<T><<<row_blocks(rows), quant_threads, 0, stream>>>(x, rows, int(cols), given ? given : scratch, rows,
                                                                   codes, scale);
  return hipGetLastError();
}

// Layout of a copy and of the workspace: codes, then the scale, then the row maxima.
std::size_t codes_bytes(std::int64_t in, std::int64_t rows) { return round_up(std::size_t(in) * std::size_t(rows)); }
std::size_t tail_bytes(std::int64_t rows) { return 256 + round_up(std::size_t(rows) * sizeof(float)); }

}  // namespace

bool gemm_fp8_supported(int device) {
  if (!ANVIL_GPU_HAVE_BLAS) return false;
  hipDeviceProp_t prop{};
  if (hipGetDeviceProperties(&prop, device) != hipSuccess) return false;
#if defined(ANVIL_GPU_CUDA)
  return prop.major * 10 + prop.minor >= 89;
#else
  return false;
#endif
}

std::size_t fp8_matrix_bytes(std::int64_t in, std::int64_t out) { return codes_bytes(in, out) + tail_bytes(out); }

fp8_matrix fp8_matrix_at(void* at, std::int64_t in, std::int64_t out) {
  auto* base = static_cast<std::uint8_t*>(at);
  return {.codes = base, .scale = reinterpret_cast<const float*>(base + codes_bytes(in, out)), .in = in, .out = out};
}

hipError_t launch_make_fp8_matrix(model::ggml_type type, const void* w, std::int64_t in, std::int64_t out,
                                  void* scratch, std::size_t scratch_bytes, void* dst, hipStream_t stream) {
  const fp8_stack_part one{.type = type, .w = w, .out = out};
  return launch_make_fp8_stacked(std::span(&one, 1), in, scratch, scratch_bytes, dst, stream);
}

hipError_t launch_make_fp8_stacked(std::span<const fp8_stack_part> parts, std::int64_t in, void* scratch,
                                   std::size_t scratch_bytes, void* dst, hipStream_t stream) {
  std::int64_t out = 0, widest = 0;
  for (const fp8_stack_part& p : parts) {
    if (p.w == nullptr || p.out <= 0 || !gpu::aligned16(p.w)) return hipErrorInvalidValue;
    out += p.out;
    if (p.type != model::ggml_type::F16) widest = std::max(widest, p.out);
  }
  if (parts.empty() || !gemm_fp8_shape_ok(in, out) || !gpu::aligned16(dst) ||
      (widest > 0 && (!gpu::aligned16(scratch) || scratch_bytes < std::size_t(in) * std::size_t(widest) * 2))) {
    return hipErrorInvalidValue;
  }
  auto* codes = static_cast<std::uint8_t*>(dst);
  auto* scale = reinterpret_cast<float*>(codes + codes_bytes(in, out));
  float* row_max = scale + 64;  // 256 bytes past the scale: room for `out` maxima (tail_bytes)
  // A part's halves: F16 as stored, else dequantized into the scratch (unless it still holds
  // them: a copy of one weight dequantizes it once).
  const void* in_scratch = nullptr;
  const auto halves_of = [&](const fp8_stack_part& p, const std::uint16_t*& h) {
    h = static_cast<const std::uint16_t*>(p.w);
    if (p.type == model::ggml_type::F16) return hipSuccess;
    h = static_cast<const std::uint16_t*>(scratch);
    if (in_scratch == p.w) return hipSuccess;
    in_scratch = p.w;
    return launch_dequantize(p.type, p.w, static_cast<std::uint16_t*>(scratch), p.out, in, stream);
  };
  // Pass 1: every part's row maxima; pass 2: each part encoded against all of them (one scale).
  for (const int pass : {1, 2}) {
    std::int64_t row = 0;
    for (const fp8_stack_part& p : parts) {
      const std::uint16_t* h = nullptr;
      if (const hipError_t e = halves_of(p, h); e != hipSuccess) return e;
      if (pass == 1) {
        row_max_kernel<std::uint16_t><<<row_blocks(p.out), quant_threads, 0, stream>>>(h, p.out, int(in), row_max + row);
      } else {
        encode_kernel<std::uint16_t><<<row_blocks(p.out), quant_threads, 0, stream>>>(h, p.out, int(in), row_max, out,
                                                                                      codes + row * in, scale);
      }
      if (const hipError_t e = hipGetLastError(); e != hipSuccess) return e;
      row += p.out;
    }
  }
  return hipSuccess;
}

hipError_t launch_quantize_fp8(const float* x, std::int64_t rows, std::int64_t cols, std::uint8_t* codes, float* scale,
                               float* row_max, hipStream_t stream) {
  return quantize(x, rows, cols, codes, scale, row_max, nullptr, stream);
}

hipError_t launch_encode_fp8(const float* x, std::int64_t rows, std::int64_t cols, const float* row_max,
                             std::uint8_t* codes, float* scale, hipStream_t stream) {
  return quantize(x, rows, cols, codes, scale, nullptr, row_max, stream);
}

std::size_t gemm_fp8_workspace_bytes(std::int64_t in, std::int64_t max_tokens) {
  return codes_bytes(in, max_tokens) + tail_bytes(max_tokens);
}

hipError_t launch_gemm_fp8_group(std::span<const gemm_fp8_projection> ps, const float* x, std::int64_t n_tokens,
                                 const gemm_fp8_context& ctx, hipStream_t stream) {
  if (ps.empty() || n_tokens == 0) return hipSuccess;
  const std::int64_t in = ps[0].w ? ps[0].w->in : 0;
  if (n_tokens < 0 || n_tokens >= (std::int64_t(1) << 31) || ctx.blas == nullptr || !gpu::aligned16(x)) {
    return hipErrorInvalidValue;
  }
  for (const gemm_fp8_projection& p : ps) {
    if (p.w == nullptr || p.y == nullptr || p.w->in != in || !gemm_fp8_shape_ok(p.w->in, p.w->out) ||
        !gpu::aligned16(p.w->codes) || !gpu::aligned16(p.y)) {
      return hipErrorInvalidValue;
    }
  }
  if (gemm_fp8_workspace_bytes(in, n_tokens) > ctx.workspace_bytes || !gpu::aligned16(ctx.workspace)) {
    return hipErrorInvalidValue;
  }
  auto* x_codes = static_cast<std::uint8_t*>(ctx.workspace);
  auto* x_scale = reinterpret_cast<float*>(x_codes + codes_bytes(in, n_tokens));
  if (const hipError_t e = quantize(x, n_tokens, in, x_codes, x_scale, x_scale + 64, nullptr, stream); e != hipSuccess) return e;
  for (const gemm_fp8_projection& p : ps) {
    // Row-major y[n_tokens][out] is column-major [out x n_tokens] = W^T-as-stored times x.
    if (ctx.blas->run(int(p.w->out), int(n_tokens), int(in), p.w->codes, p.w->scale, x_codes, x_scale, p.y,
                      gemm_fp8_fast_accum, ctx.blas_workspace, ctx.blas_workspace_bytes, stream) != blas::ok) {
      return hipErrorNotSupported;
    }
    if (p.bias) {
      if (const hipError_t e = launch_add_bias(p.y, p.bias, p.w->out, n_tokens, stream); e != hipSuccess) return e;
    }
  }
  return hipGetLastError();
}

}  // namespace anvil::kernels
