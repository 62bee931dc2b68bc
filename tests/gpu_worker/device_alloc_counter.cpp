// See device_alloc_counter.h. Each __wrap_X counts, then calls __real_X (the linker's names for
// the interposed and the original symbol; tests/gpu_worker/gpu_worker.cmake passes --wrap=X).
#include "tests/gpu_worker/device_alloc_counter.h"

#include <atomic>

#include <cuda_runtime_api.h>

namespace {
std::atomic<std::uint64_t> device_calls{0};
std::atomic<std::uint64_t> pinned_calls{0};
}  // namespace

extern "C" {
cudaError_t __real_cudaMalloc(void** p, size_t n);
cudaError_t __real_cudaMallocAsync(void** p, size_t n, cudaStream_t s);
cudaError_t __real_cudaMallocManaged(void** p, size_t n, unsigned flags);
cudaError_t __real_cudaMallocPitch(void** p, size_t* pitch, size_t w, size_t h);
cudaError_t __real_cudaMalloc3D(cudaPitchedPtr* p, cudaExtent e);
cudaError_t __real_cudaMallocArray(cudaArray_t* a, const cudaChannelFormatDesc* d, size_t w, size_t h, unsigned flags);
cudaError_t __real_cudaMallocFromPoolAsync(void** p, size_t n, cudaMemPool_t pool, cudaStream_t s);
cudaError_t __real_cudaMemPoolCreate(cudaMemPool_t* pool, const cudaMemPoolProps* props);
cudaError_t __real_cudaHostAlloc(void** p, size_t n, unsigned flags);
cudaError_t __real_cudaMallocHost(void** p, size_t n);

cudaError_t __wrap_cudaMalloc(void** p, size_t n) {
  ++device_calls;
  return __real_cudaMalloc(p, n);
}
cudaError_t __wrap_cudaMallocAsync(void** p, size_t n, cudaStream_t s) {
  ++device_calls;
  return __real_cudaMallocAsync(p, n, s);
}
cudaError_t __wrap_cudaMallocManaged(void** p, size_t n, unsigned flags) {
  ++device_calls;
  return __real_cudaMallocManaged(p, n, flags);
}
cudaError_t __wrap_cudaMallocPitch(void** p, size_t* pitch, size_t w, size_t h) {
  ++device_calls;
  return __real_cudaMallocPitch(p, pitch, w, h);
}
cudaError_t __wrap_cudaMalloc3D(cudaPitchedPtr* p, cudaExtent e) {
  ++device_calls;
  return __real_cudaMalloc3D(p, e);
}
cudaError_t __wrap_cudaMallocArray(cudaArray_t* a, const cudaChannelFormatDesc* d, size_t w, size_t h, unsigned flags) {
  ++device_calls;
  return __real_cudaMallocArray(a, d, w, h, flags);
}
cudaError_t __wrap_cudaMallocFromPoolAsync(void** p, size_t n, cudaMemPool_t pool, cudaStream_t s) {
  ++device_calls;
  return __real_cudaMallocFromPoolAsync(p, n, pool, s);
}
cudaError_t __wrap_cudaMemPoolCreate(cudaMemPool_t* pool, const cudaMemPoolProps* props) {
  ++device_calls;
  return __real_cudaMemPoolCreate(pool, props);
}
cudaError_t __wrap_cudaHostAlloc(void** p, size_t n, unsigned flags) {
  ++pinned_calls;
  return __real_cudaHostAlloc(p, n, flags);
}
cudaError_t __wrap_cudaMallocHost(void** p, size_t n) {
  ++pinned_calls;
  return __real_cudaMallocHost(p, n);
}
}  // extern "C"

namespace anvil::testing {

bool counted() { return true; }

runtime_allocations runtime_allocations_made() { return {device_calls.load(), pinned_calls.load()}; }

bool allocate_and_free_once() {
  void* p = nullptr;
  if (cudaMalloc(&p, 1 << 20) != cudaSuccess) return false;
  return cudaFree(p) == cudaSuccess;
}

std::size_t device_free_bytes() {
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  return free;
}

}  // namespace anvil::testing
