// Device side of the KV cache's element types (kernels/kv_quant.h): consecutive elements of a
// cache row loaded at once and turned into floats, and the factor each row's values carry. The
// attention kernels are templates over the element type and read the cache only through these.
//   value = kv_vec8<T>::to_float(kv_vec8<T>::load(base, e))[i] * kv_row_scale<T>(scales, row)
// f16 rows have no scale (1); fp8 codes decode exactly as halves worth 2^-8 of their value, so
// their scale carries the 2^8.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/gpu_runtime.h"
#include "kernels/kv_quant.h"

namespace anvil::kernels {

// Eight consecutive elements of type T in one load: 16 bytes of halves, or 8 bytes of codes.
template <kv_dtype T>
struct kv_vec8 {
  using raw = std::conditional_t<T == kv_dtype::f16, uint4, uint2>;

  // Elements [elem, elem + 8) of the cache array at `base` (elem a multiple of 8).
  static __device__ __forceinline__ raw load(const void* base, std::int64_t elem) {
    return *reinterpret_cast<const raw*>(static_cast<const unsigned char*>(base) + elem * std::int64_t(sizeof(raw) / 8));
  }
  static __device__ __forceinline__ raw zero() {
    if constexpr (T == kv_dtype::f16) {
      return make_uint4(0u, 0u, 0u, 0u);
    } else {
      return make_uint2(0u, 0u);
    }
  }
  static __device__ __forceinline__ void to_float(raw r, float (&f)[8]) {
    if constexpr (T == kv_dtype::f16) {
      gpu::half8_to_float(r, f);
    } else if constexpr (T == kv_dtype::fp8) {
      std::uint32_t h[4];
      fp8x4_to_half2x2(r.x, h[0], h[1]);
      fp8x4_to_half2x2(r.y, h[2], h[3]);
      gpu::half8_to_float(make_uint4(h[0], h[1], h[2], h[3]), f);
    } else {
      // Each code, biased to unsigned (c + 128), as the low byte of the float 2^23 + c + 128 (a
      // byte permute), minus 2^23 + 128: two integer-and-add instructions instead of a
      // conversion, whose throughput is a quarter of theirs.
      const std::uint32_t w[2] = {r.x ^ 0x80808080u, r.y ^ 0x80808080u};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const unsigned bits = __byte_perm(w[i / 4], 0x4B000000u, 0x7440u | unsigned(i % 4));
        f[i] = __int_as_float(int(bits)) - 8388736.f;
      }
    }
  }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
// Eight fp8 codes as four half2 words (elements 2w and 2w + 1 in word w), the codes' own values, by
// the conversion instruction (Ada, Hopper), two codes at a time.
__device__ __forceinline__ void fp8x8_to_half2x4_cvt(uint2 r, unsigned (&h)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const unsigned short two = static_cast<unsigned short>((i < 2 ? r.x : r.y) >> (16 * (i % 2)));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h[i]) : "h"(two));
  }
}
#endif

// The factor of row `row` (slot * n_kv_heads + kv head).
template <kv_dtype T>
__device__ __forceinline__ float kv_row_scale(const float* scales, std::int64_t row) {
  if constexpr (T == kv_dtype::f16) {
    return 1.f;
  } else if constexpr (T == kv_dtype::fp8) {
    return scales[row] * fp8_half_decode_factor;
  } else {
    return scales[row];
  }
}

}  // namespace anvil::kernels
