// NVIDIA sm_80+ instructions the attention, quantized GEMM and delta-rule kernels share: tensor-core
// products (mma.sync m16n8k16: f16 operands, f32 accumulators, warp-wide; m16n8k8 on TF32; ldmatrix)
// and asynchronous copies from global to shared memory (cp.async). CUDA only, compute capability 8.0
// and up; callers guard their use with __CUDA_ARCH__ >= 800 and keep a CUDA-core kernel for
// everything else.
//
// Fragment layout of m16n8k16 (g = lane / 4, c = lane % 4; each register two halves, low first):
//   A (16x16, row major): a[0] = (row g, cols 2c, 2c+1), a[1] = (row g+8, cols 2c, 2c+1),
//                         a[2] = (row g, cols 2c+8, 2c+9), a[3] = (row g+8, cols 2c+8, 2c+9)
//   B (16x8, "col"):      b0 = (rows 2c, 2c+1, col g), b1 = (rows 2c+8, 2c+9, col g)
//   C/D (16x8, f32):      c[0], c[1] = (row g, cols 2c, 2c+1), c[2], c[3] = (row g+8, same cols)
#pragma once

#if defined(ANVIL_GPU_CUDA)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels::tc {

// c += A B.
__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// m16n8k8 on TF32 operands (f32 accumulators): the fragments hold one 32-bit value per element.
//   A (16x8): a[0] = (row g, col c), a[1] = (row g+8, col c), a[2] = (row g, col c+4), a[3] = (row g+8, col c+4)
//   B (8x8):  b0 = (row c, col g), b1 = (row c+4, col g)
//   C/D: as m16n8k16's.
__device__ __forceinline__ void mma_1688_tf32(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm(  // not volatile: a pure function of its operands, which the compiler may schedule among others
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A float as a TF32 pair, x = hi + lo to about 2^-22 of x (each part rounded to nearest): products
// taken as hi*hi + hi*lo + lo*hi on TF32 tensor cores come within a few f32 roundings of the f32
// product ("3xTF32").
struct tf32_pair {
  unsigned hi, lo;
};
__device__ __forceinline__ unsigned to_tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ tf32_pair split_tf32(float x) {
  const unsigned hi = to_tf32(x);
  return {hi, to_tf32(x - __uint_as_float(hi))};
}

// Four 8x8 matrices from shared memory in one instruction: lanes 8i..8i+7 name the rows of matrix
// i, and each lane receives (row lane / 4, columns 2 (lane % 4) and + 1) of matrix i in r[i] —
// B operands of m16n8k16 straight from K rows (two key groups x two 8-wide halves of a 16-wide
// slice); with .trans, from V rows (two dims groups x keys 0-7 and 8-15).
__device__ __forceinline__ void ldmatrix_x4(const gpu::half_bits* row, unsigned (&r)[4]) {
  const unsigned addr = unsigned(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(const gpu::half_bits* row, unsigned (&r)[4]) {
  const unsigned addr = unsigned(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Asynchronous copies to shared memory: 16 bytes (or 8, or 4), zeros where `valid` is false (src is
// then not read). A lane's copies form a group at commit(); wait<N>() returns once at most N of
// its groups are still in flight. Other lanes see the data after their own wait and a barrier.
// cp_async16_n: 16 bytes to shared memory of which only the first `bytes` (0..16) are read, the
// rest zeros.
__device__ __forceinline__ void cp_async16_n(void* dst, const void* src, unsigned bytes) {
  const unsigned d = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) { cp_async16_n(dst, src, valid ? 16 : 0); }
__device__ __forceinline__ void cp_async8(void* dst, const void* src, bool valid) {
  const unsigned d = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 8 : 0) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  const unsigned d = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Whether the device in use has these instructions (compute capability 8.0 and up); asked once
// per device.
inline bool device_has_mma() {
  static std::atomic<int> known[gpu::max_devices] = {};
  return gpu::once_per_device(known, [](int dev) {
           hipDeviceProp_t prop{};
           return int(dev >= 0 && hipGetDeviceProperties(&prop, dev) == hipSuccess && prop.major >= 8);
         }) != 0;
}

}  // namespace anvil::kernels::tc
#endif
