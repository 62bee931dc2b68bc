// The one rule checked against the runtime itself (DESIGN.md): in the CUDA build, gpu_worker_test
// is linked with `-Wl,--wrap` for every CUDA runtime call that allocates device or pinned host
// memory, so each such call made by anvil's code — by any file, not only the worker's own
// allocation helpers — is counted here before it reaches the runtime. Allocations the libraries
// make inside themselves (cuBLAS's workspaces, the driver's module loading) are seen through the
// device's free memory instead. Where the build is not CUDA, counted() is false.
#pragma once

#include <cstddef>
#include <cstdint>

namespace anvil::testing {

struct runtime_allocations {
  std::uint64_t device = 0;  // cudaMalloc, cudaMallocAsync, cudaMallocManaged, cudaMallocPitch, cudaMalloc3D,
                             // cudaMallocArray, cudaMallocFromPoolAsync, cudaMemPoolCreate
  std::uint64_t pinned = 0;  // cudaHostAlloc, cudaMallocHost
  bool operator==(const runtime_allocations&) const = default;
};

#if defined(ANVIL_COUNT_RUNTIME_ALLOCATIONS)
bool counted();                          // the calls are interposed in this build
runtime_allocations runtime_allocations_made();
std::size_t device_free_bytes();         // cudaMemGetInfo's free memory
bool allocate_and_free_once();           // one cudaMalloc + cudaFree, as any file might: the counter must see it
#else
inline bool counted() { return false; }
inline runtime_allocations runtime_allocations_made() { return {}; }
inline std::size_t device_free_bytes() { return 0; }
inline bool allocate_and_free_once() { return false; }
#endif

}  // namespace anvil::testing
