// kernels/gpu_runtime.h — the only place vendor names appear.
//
// Kernels and launchers are written once against the HIP API (hip* names, <<<>>> launches) and
// the warp helpers below. Under hipcc this header is plain HIP. Under nvcc (ANVIL_GPU_CUDA) it
// maps the hip* names we use to CUDA: Debian's HIP-on-NVIDIA headers do not compile against
// CUDA 13, so we keep our own small mapping instead of including <hip/hip_runtime.h> there.
// Only gpu_worker/ and kernels/ (and their tests) may include this file (DESIGN.md, the one rule).
#pragma once

#include <cstddef>

#if defined(ANVIL_GPU_CUDA)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

using hipError_t = cudaError_t;
using hipStream_t = cudaStream_t;
using hipEvent_t = cudaEvent_t;
using hipDeviceProp_t = cudaDeviceProp;
using hipMemcpyKind = cudaMemcpyKind;

inline constexpr hipError_t hipSuccess = cudaSuccess;
inline constexpr hipError_t hipErrorInvalidValue = cudaErrorInvalidValue;
inline constexpr hipError_t hipErrorNoDevice = cudaErrorNoDevice;
inline constexpr hipError_t hipErrorOutOfMemory = cudaErrorMemoryAllocation;
inline constexpr hipError_t hipErrorNotSupported = cudaErrorNotSupported;
inline constexpr hipError_t hipErrorNotReady = cudaErrorNotReady;
inline constexpr hipMemcpyKind hipMemcpyHostToDevice = cudaMemcpyHostToDevice;
inline constexpr hipMemcpyKind hipMemcpyDeviceToHost = cudaMemcpyDeviceToHost;
inline constexpr hipMemcpyKind hipMemcpyDeviceToDevice = cudaMemcpyDeviceToDevice;
inline constexpr hipMemcpyKind hipMemcpyDefault = cudaMemcpyDefault;
inline constexpr unsigned hipStreamNonBlocking = cudaStreamNonBlocking;
inline constexpr unsigned hipHostMallocDefault = cudaHostAllocDefault;
inline constexpr unsigned hipHostMallocMapped = cudaHostAllocMapped;
inline constexpr unsigned hipHostMallocPortable = cudaHostAllocPortable;
inline constexpr hipError_t hipErrorPeerAccessAlreadyEnabled = cudaErrorPeerAccessAlreadyEnabled;

inline const char* hipGetErrorString(hipError_t e) { return cudaGetErrorString(e); }
inline const char* hipGetErrorName(hipError_t e) { return cudaGetErrorName(e); }
inline hipError_t hipGetLastError() { return cudaGetLastError(); }
inline hipError_t hipPeekAtLastError() { return cudaPeekAtLastError(); }

inline hipError_t hipGetDeviceCount(int* n) { return cudaGetDeviceCount(n); }
inline hipError_t hipSetDevice(int d) { return cudaSetDevice(d); }
inline hipError_t hipGetDevice(int* d) { return cudaGetDevice(d); }
inline hipError_t hipGetDeviceProperties(hipDeviceProp_t* p, int d) { return cudaGetDeviceProperties(p, d); }
using hipFuncAttribute = cudaFuncAttribute;
inline constexpr hipFuncAttribute hipFuncAttributeMaxDynamicSharedMemorySize = cudaFuncAttributeMaxDynamicSharedMemorySize;
inline hipError_t hipFuncSetAttribute(const void* f, hipFuncAttribute a, int v) { return cudaFuncSetAttribute(f, a, v); }
inline hipError_t hipMemGetInfo(std::size_t* free_b, std::size_t* total_b) { return cudaMemGetInfo(free_b, total_b); }
inline hipError_t hipDeviceSynchronize() { return cudaDeviceSynchronize(); }
inline hipError_t hipDriverGetVersion(int* v) { return cudaDriverGetVersion(v); }
inline hipError_t hipRuntimeGetVersion(int* v) { return cudaRuntimeGetVersion(v); }

inline hipError_t hipMalloc(void** p, std::size_t n) { return cudaMalloc(p, n); }
template <class T>
inline hipError_t hipMalloc(T** p, std::size_t n) { return cudaMalloc(reinterpret_cast<void**>(p), n); }
inline hipError_t hipFree(void* p) { return cudaFree(p); }
inline hipError_t hipHostMalloc(void** p, std::size_t n, unsigned flags = hipHostMallocDefault) {
  return cudaHostAlloc(p, n, flags);
}
inline hipError_t hipHostFree(void* p) { return cudaFreeHost(p); }
inline hipError_t hipHostGetDevicePointer(void** d, void* h, unsigned flags) { return cudaHostGetDevicePointer(d, h, flags); }
// Peer access: a device's kernels reading and writing another device's memory (NVLink, PCIe).
inline hipError_t hipDeviceCanAccessPeer(int* can, int device, int peer) { return cudaDeviceCanAccessPeer(can, device, peer); }
inline hipError_t hipDeviceEnablePeerAccess(int peer, unsigned flags) { return cudaDeviceEnablePeerAccess(peer, flags); }
inline hipError_t hipMemcpy(void* dst, const void* src, std::size_t n, hipMemcpyKind k) {
  return cudaMemcpy(dst, src, n, k);
}
inline hipError_t hipMemcpyAsync(void* dst, const void* src, std::size_t n, hipMemcpyKind k, hipStream_t s) {
  return cudaMemcpyAsync(dst, src, n, k, s);
}
inline hipError_t hipMemcpy2DAsync(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                                   std::size_t height, hipMemcpyKind k, hipStream_t s) {
  return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, k, s);
}
inline hipError_t hipMemset(void* p, int v, std::size_t n) { return cudaMemset(p, v, n); }
inline hipError_t hipMemsetAsync(void* p, int v, std::size_t n, hipStream_t s) { return cudaMemsetAsync(p, v, n, s); }

inline hipError_t hipStreamCreate(hipStream_t* s) { return cudaStreamCreate(s); }
inline hipError_t hipStreamCreateWithFlags(hipStream_t* s, unsigned f) { return cudaStreamCreateWithFlags(s, f); }
inline hipError_t hipStreamDestroy(hipStream_t s) { return cudaStreamDestroy(s); }
inline hipError_t hipStreamSynchronize(hipStream_t s) { return cudaStreamSynchronize(s); }
inline hipError_t hipStreamQuery(hipStream_t s) { return cudaStreamQuery(s); }

// Graphs: decode steps captured once at start-up and replayed (gpu_worker/gpu_device_setup.cpp).
using hipGraph_t = cudaGraph_t;
using hipGraphExec_t = cudaGraphExec_t;
using hipStreamCaptureMode = cudaStreamCaptureMode;
inline constexpr hipStreamCaptureMode hipStreamCaptureModeThreadLocal = cudaStreamCaptureModeThreadLocal;
inline hipError_t hipStreamBeginCapture(hipStream_t s, hipStreamCaptureMode m) { return cudaStreamBeginCapture(s, m); }
inline hipError_t hipStreamEndCapture(hipStream_t s, hipGraph_t* g) { return cudaStreamEndCapture(s, g); }
inline hipError_t hipGraphInstantiateWithFlags(hipGraphExec_t* e, hipGraph_t g, unsigned long long flags) {
  return cudaGraphInstantiateWithFlags(e, g, flags);
}
inline hipError_t hipGraphLaunch(hipGraphExec_t e, hipStream_t s) { return cudaGraphLaunch(e, s); }
inline hipError_t hipGraphExecDestroy(hipGraphExec_t e) { return cudaGraphExecDestroy(e); }
inline hipError_t hipGraphDestroy(hipGraph_t g) { return cudaGraphDestroy(g); }

inline hipError_t hipEventCreate(hipEvent_t* e) { return cudaEventCreate(e); }
inline hipError_t hipEventDestroy(hipEvent_t e) { return cudaEventDestroy(e); }
inline hipError_t hipEventRecord(hipEvent_t e, hipStream_t s = nullptr) { return cudaEventRecord(e, s); }
inline hipError_t hipEventSynchronize(hipEvent_t e) { return cudaEventSynchronize(e); }
inline hipError_t hipEventQuery(hipEvent_t e) { return cudaEventQuery(e); }
inline hipError_t hipEventElapsedTime(float* ms, hipEvent_t a, hipEvent_t b) { return cudaEventElapsedTime(ms, a, b); }

#elif defined(ANVIL_GPU_HIP)
#if defined(__HIPCC__)
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#else
#include <hip/hip_runtime_api.h>  // host-only translation units compiled by the C++ compiler
#endif

#else
#error "kernels/gpu_runtime.h needs a GPU backend: build with -DANVIL_GPU=cuda or -DANVIL_GPU=hip"
#endif

// ---- Device-side helpers: warp size, shuffles, reductions, half precision ----
#if defined(__CUDACC__) || defined(__HIPCC__)
#if defined(ANVIL_GPU_CUDA)
#include <cuda_fp16.h>
#endif
namespace anvil::gpu {

// IEEE binary16 bits <-> float on the device (round to nearest even), the same values as
// model::f16_to_f32 / f32_to_f16 on the host.
#if defined(ANVIL_GPU_CUDA)
__device__ __forceinline__ float half_bits_to_float(unsigned short h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ unsigned short float_to_half_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }
// Two floats to two halves in one word (a in the low half), one packing conversion instead of two.
__device__ __forceinline__ unsigned floats_to_half2_bits(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return unsigned(__half_as_ushort(__low2half(h))) | (unsigned(__half_as_ushort(__high2half(h))) << 16);
}
#else
__device__ __forceinline__ float half_bits_to_float(unsigned short h) {
  return static_cast<float>(__builtin_bit_cast(_Float16, h));
}
__device__ __forceinline__ unsigned short float_to_half_bits(float f) {
  return __builtin_bit_cast(unsigned short, static_cast<_Float16>(f));
}
__device__ __forceinline__ unsigned floats_to_half2_bits(float a, float b) {
  return unsigned(float_to_half_bits(a)) | (unsigned(float_to_half_bits(b)) << 16);
}
#endif

// One 16-byte store to global memory (p 16-byte aligned). nvcc splits a plain store of a uint4 or
// float4 built in registers into four 4-byte stores where it likes (seen in the dequantization
// kernel's K-quant stores: 2.6 L2 write requests per sector, half the bandwidth); the intrinsic
// is one st.global.v4.
#if defined(ANVIL_GPU_CUDA)
__device__ __forceinline__ void store16(void* p, uint4 v) { __stcg(static_cast<uint4*>(p), v); }
__device__ __forceinline__ void store16(float* p, float4 v) { __stcg(reinterpret_cast<float4*>(p), v); }
#else
__device__ __forceinline__ void store16(void* p, uint4 v) { *static_cast<uint4*>(p) = v; }
__device__ __forceinline__ void store16(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
#endif

#if defined(ANVIL_GPU_CUDA)
inline constexpr int warp_size = 32;
template <class T>
__device__ __forceinline__ T shfl_xor(T v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask, warp_size);
}
#else
// 64 on CDNA (gfx9), 32 on RDNA (gfx10+, wave32). The host pass never uses it.
#if defined(__AMDGCN_WAVEFRONT_SIZE)
inline constexpr int warp_size = __AMDGCN_WAVEFRONT_SIZE;
#else
inline constexpr int warp_size = 64;
#endif
template <class T>
__device__ __forceinline__ T shfl_xor(T v, int lane_mask) {
  return __shfl_xor(v, lane_mask, warp_size);
}
#endif

// c + the dot product of the four signed bytes of a with those of b (dp4a). One instruction on
// NVIDIA (sm_61+) and on the AMD targets with dot1 instructions (gfx906/908/90a/94x, gfx1030);
// four multiply-adds elsewhere.
__device__ __forceinline__ int dot4_i8(int a, int b, int c) {
#if defined(ANVIL_GPU_CUDA)
  return __dp4a(a, b, c);
#elif defined(__gfx906__) || defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) || \
    defined(__gfx941__) || defined(__gfx942__) || defined(__gfx1030__)
  return __builtin_amdgcn_sdot4(a, b, c, false);
#else
#pragma unroll
  for (int i = 0; i < 4; ++i) c += int(static_cast<signed char>(a >> (8 * i))) * int(static_cast<signed char>(b >> (8 * i)));
  return c;
#endif
}

// Sum over the threads of one warp; every lane receives the total.
template <class T>
__device__ __forceinline__ T warp_reduce_sum(T v) {
#pragma unroll
  for (int m = warp_size / 2; m > 0; m /= 2) v += shfl_xor(v, m);
  return v;
}

template <class T>
__device__ __forceinline__ T warp_reduce_max(T v) {
#pragma unroll
  for (int m = warp_size / 2; m > 0; m /= 2) {
    const T o = shfl_xor(v, m);
    v = o > v ? o : v;
  }
  return v;
}

// Sum over a block of BlockSize threads (a multiple of the warp size, at most 1024); every thread
// receives the total. Uses a small static shared array; callable once per barrier phase.
template <int BlockSize, class T>
__device__ __forceinline__ T block_reduce_sum(T v) {
  static_assert(BlockSize % 32 == 0 && BlockSize <= 1024, "block size must be a multiple of 32, at most 1024");
  constexpr int max_warps = BlockSize / 32;  // enough for warp sizes 32 and 64
  __shared__ T partial[max_warps];
  const int warps = BlockSize / warp_size;
  const int lane = threadIdx.x % warp_size;
  const int warp = threadIdx.x / warp_size;
  v = warp_reduce_sum(v);
  __syncthreads();  // `partial` may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T total = lane < warps ? partial[lane] : T(0);
  return warp_reduce_sum(total);
}

// Largest value over a block, as block_reduce_sum (values >= 0: lanes past the warps add 0).
template <int BlockSize, class T>
__device__ __forceinline__ T block_reduce_max(T v) {
  static_assert(BlockSize % 32 == 0 && BlockSize <= 1024, "block size must be a multiple of 32, at most 1024");
  constexpr int max_warps = BlockSize / 32;
  __shared__ T partial[max_warps];
  const int warps = BlockSize / warp_size;
  const int lane = threadIdx.x % warp_size;
  const int warp = threadIdx.x / warp_size;
  v = warp_reduce_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T total = lane < warps ? partial[lane] : T(0);
  return warp_reduce_max(total);
}

// ---- Overlapping a kernel's start with the end of the one before (programmatic dependent launch) ----
// On NVIDIA sm_90+, a kernel launched with launch_dependent() may start while the kernel before it
// in the stream is still running: once every block of that kernel has called allow_dependents()
// (or exited), the next kernel's blocks are scheduled, run up to dependency_wait(), and wait there
// until the kernel before has finished and its writes are visible. What a kernel does before
// dependency_wait() may only read memory no kernel of the stream writes (the weights; a step's
// inputs — positions, block tables, context lengths — which copies upload before its kernels):
// that is where a quantized GEMV issues its first weight loads, and decode attention reads its
// block table, while a small kernel before it finishes.
// Every kernel launched with launch_dependent() MUST call dependency_wait() before it reads or
// writes any other global memory (a block may return without waiting); kernels launched the
// ordinary way are ordered as usual. Each kernel calls
// allow_dependents() right after its wait, so at most the running kernel and the next one's
// waiting blocks share the device. Elsewhere (AMD, older NVIDIA) the three
// device calls do nothing and launch_dependent() is an ordinary launch.
__device__ __forceinline__ void dependency_wait() {
#if defined(ANVIL_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependents() {
#if defined(ANVIL_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace anvil::gpu
#endif

// ---- f16 storage (the device KV cache): IEEE binary16 bits in a std::uint16_t ----
// Params structs carry `std::uint16_t*` so that host translation units need no vendor half
// type; kernels convert with the helpers below. The host versions (round to nearest even) let
// tests and CPU code round values exactly as the device stores them.
#include <cstdint>
#include <cstring>

namespace anvil::gpu {

using half_bits = std::uint16_t;

inline float host_half_to_float(half_bits h) noexcept {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    std::uint32_t m = mant;
    do { m <<= 1; ++e; } while ((m & 0x400u) == 0);
    bits = sign | (std::uint32_t(112 - e) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline half_bits host_float_to_half(float f) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return half_bits(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  if (abs >= 0x477ff000u) return half_bits(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (abs < 0x33000000u) return half_bits(sign);  // < 2^-25 rounds to 0
    const std::uint32_t e = abs >> 23, m = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // 14..24
    std::uint32_t r = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return half_bits(sign | r);
  }
  std::uint32_t r = ((abs >> 13) - (112u << 10));
  const std::uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return half_bits(sign | r);
}

// A float rounded through f16, as the device KV cache stores it.
inline float host_round_to_half(float f) noexcept { return host_half_to_float(host_float_to_half(f)); }

}  // namespace anvil::gpu

#if defined(__CUDACC__) || defined(__HIPCC__)
namespace anvil::gpu {

__device__ __forceinline__ float half_to_float(half_bits h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ half_bits float_to_half(float f) { return __half_as_ushort(__float2half_rn(f)); }

// Eight f16 values packed in 16 bytes (one vector load of the KV cache) to floats, in order.
__device__ __forceinline__ void half8_to_float(uint4 raw, float (&f)[8]) {
  const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = half_to_float(half_bits(w[i] & 0xffffu));
    f[2 * i + 1] = half_to_float(half_bits(w[i] >> 16));
  }
}

// Lane i receives v from lane i - delta (lanes below delta keep their own value).
template <class T>
__device__ __forceinline__ T shfl_up(T v, unsigned delta) {
#if defined(ANVIL_GPU_CUDA)
  return __shfl_up_sync(0xffffffffu, v, delta, warp_size);
#else
  return __shfl_up(v, delta, warp_size);
#endif
}

// Exclusive prefix sum of v over a block of BlockSize threads (a multiple of 32, at most 1024), in
// thread order; `total` receives the block's sum. Callable once per barrier phase (block_reduce_sum).
template <int BlockSize>
__device__ __forceinline__ int block_exclusive_scan(int v, int& total) {
  static_assert(BlockSize % 32 == 0 && BlockSize <= 1024, "block size must be a multiple of 32, at most 1024");
  constexpr int max_warps = BlockSize / 32;
  __shared__ int warp_sums[max_warps];
  const int warps = BlockSize / warp_size;
  const int lane = int(threadIdx.x) % warp_size, warp = int(threadIdx.x) / warp_size;
  int incl = v;
  for (int d = 1; d < warp_size; d *= 2) {
    const int o = shfl_up(incl, unsigned(d));
    if (lane >= d) incl += o;
  }
  __syncthreads();  // warp_sums may still be read by a previous call
  if (lane == warp_size - 1) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int s = lane < warps ? warp_sums[lane] : 0;
    for (int d = 1; d < warp_size; d *= 2) {
      const int o = shfl_up(s, unsigned(d));
      if (lane >= d) s += o;
    }
    if (lane < warps) warp_sums[lane] = s;  // inclusive sums of the warps' totals
  }
  __syncthreads();
  total = warp_sums[warps - 1];
  return incl - v + (warp > 0 ? warp_sums[warp - 1] : 0);
}

// Lane i receives v from lane `src` of its warp.
template <class T>
__device__ __forceinline__ T shfl(T v, int src) {
#if defined(ANVIL_GPU_CUDA)
  return __shfl_sync(0xffffffffu, v, src, warp_size);
#else
  return __shfl(v, src, warp_size);
#endif
}

// Correctly rounded float multiply and add that the compiler never fuses into an FMA: where a
// kernel must reproduce a CPU reference bit for bit (the candidates' logit processing).
__device__ __forceinline__ float mul_rn(float a, float b) {
#if defined(ANVIL_GPU_CUDA)
  return __fmul_rn(a, b);
#else
#pragma clang fp contract(off)
  return a * b;
#endif
}
__device__ __forceinline__ float add_rn(float a, float b) {
#if defined(ANVIL_GPU_CUDA)
  return __fadd_rn(a, b);
#else
#pragma clang fp contract(off)
  return a + b;
#endif
}

}  // namespace anvil::gpu
#endif

// ---- Launch helpers: the alignment check, the dependent launch (see dependency_wait above) ----
#include <atomic>

namespace anvil::gpu {
// Whether a device pointer meets the 16-byte alignment of the vectorised loads (launchers' checks).
inline bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }

// Process-wide switch (gpu_worker_config::overlap_kernels sets it): off, launch_dependent() is an
// ordinary launch everywhere, for measuring what the overlap brings and as a way around a driver
// that mishandles it.
inline std::atomic<bool> dependent_launch_enabled{true};

// What is learnt about a device once and kept (properties, raised kernel limits) is kept per
// device: a process may drive several (tensor parallelism, one thread per GPU), and a value learnt
// on one device is wrong on another (a kernel attribute is per device; GPUs of a host may differ).
inline constexpr int max_devices = 64;

// The calling thread's device (hipGetDevice), or -1 where it cannot be read or is past max_devices.
inline int current_device() {
  int d = -1;
  if (hipGetDevice(&d) != hipSuccess || d < 0 || d >= max_devices) return -1;
  return d;
}

// compute(device) for the calling thread's device, once per device: a non-negative value kept in
// `cache` (threads that race compute the same value). Computed each call where the device is unknown.
template <class F>
int once_per_device(std::atomic<int> (&cache)[max_devices], F&& compute) {
  const int d = current_device();
  if (d < 0) return compute(d);
  int v = cache[d].load(std::memory_order_relaxed);
  if (v == 0) {
    v = compute(d) + 1;
    cache[d].store(v, std::memory_order_relaxed);
  }
  return v - 1;
}

// The calling thread's device's multiprocessor count (1 where it cannot be read), asked once per device.
inline int multiprocessors() {
  static std::atomic<int> known[max_devices] = {};
  return once_per_device(known, [](int dev) {
    hipDeviceProp_t prop{};
    if (dev < 0 || hipGetDeviceProperties(&prop, dev) != hipSuccess) return 1;
    return prop.multiProcessorCount > 1 ? prop.multiProcessorCount : 1;
  });
}
}  // namespace anvil::gpu

#if defined(__CUDACC__) || defined(__HIPCC__)
#include <mutex>
#include <utility>

namespace anvil::gpu {

// kernel<<<grid, block, dynamic_smem, stream>>>(args...), allowed to start before the previous
// kernel in the stream ends where the device supports it (launch_dependent: no dynamic shared
// memory; above 48 KB the caller raises the kernel's limit first). The kernel must call
// dependency_wait() first. As with <<<>>>, a launch error surfaces through hipGetLastError(),
// which every launcher returns.
template <class... P, class... A>
void launch_dependent_smem(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t dynamic_smem, hipStream_t stream,
                           A&&... args) {
#if defined(ANVIL_GPU_CUDA)
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = dynamic_smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = dependent_launch_enabled.load(std::memory_order_relaxed) ? 1 : 0;
  (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);  // recorded for cudaGetLastError
#else
  kernel<<<grid, block, dynamic_smem, stream>>>(std::forward<A>(args)...);
#endif
}
template <class... P, class... A>
void launch_dependent(void (*kernel)(P...), dim3 grid, dim3 block, hipStream_t stream, A&&... args) {
  launch_dependent_smem(kernel, grid, block, 0, stream, std::forward<A>(args)...);
}

// Raises Kernel's dynamic shared-memory limit to at least `bytes` (a launch above 48 KB needs it)
// on the calling thread's device, once per device, kernel and higher limit: the attribute is per
// device. A failure shows as the launch's error.
template <auto Kernel>
void allow_dynamic_smem(int bytes) {
  static std::atomic<int> raised[max_devices] = {};  // the limit set on each device, 0 none yet
  static std::mutex mu;
  const int d = current_device();
  if (d >= 0 && raised[d].load(std::memory_order_acquire) >= bytes) return;
  const std::lock_guard lock(mu);  // one setter at a time, so that a lower limit never follows a higher
  if (d >= 0 && raised[d].load(std::memory_order_relaxed) >= bytes) return;
  if (hipFuncSetAttribute(reinterpret_cast<const void*>(Kernel), hipFuncAttributeMaxDynamicSharedMemorySize, bytes) ==
          hipSuccess &&
      d >= 0) {
    raised[d].store(bytes, std::memory_order_release);
  }
}

}  // namespace anvil::gpu
#endif
