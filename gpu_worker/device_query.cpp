#include "gpu_worker/device_query.h"

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "gpu_worker/communicator.h"
#include "kernels/gpu_runtime.h"
#endif

namespace anvil::gpu_worker {

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
namespace {

#if defined(ANVIL_GPU_CUDA)
constexpr const char* backend_name = "cuda";
std::string version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }
std::string arch_name(const hipDeviceProp_t& p) { return "sm_" + std::to_string(p.major * 10 + p.minor); }
#else
constexpr const char* backend_name = "hip";
std::string version_string(int v) {
  return std::to_string(v / 10000000) + "." + std::to_string((v / 100000) % 100) + "." + std::to_string(v % 100000);
}
std::string arch_name(const hipDeviceProp_t& p) { return p.gcnArchName; }
#endif

std::string describe(hipError_t e) { return std::string(hipGetErrorName(e)) + ": " + hipGetErrorString(e); }

}  // namespace

device_report query_devices() {
  device_report r;
  r.backend = backend_name;
  int v = 0;
  if (hipRuntimeGetVersion(&v) == hipSuccess) r.runtime_version = version_string(v);
  if (hipDriverGetVersion(&v) == hipSuccess && v > 0) r.driver_version = version_string(v);
  r.collectives = !device_collectives_built()          ? "none in this build (one GPU per process)"
                  : device_collectives_version().empty() ? "NCCL not found (libnccl.so.2; ANVIL_NCCL_LIBRARY names another)"
                                                         : device_collectives_version();

  int count = 0;
  if (const hipError_t e = hipGetDeviceCount(&count); e != hipSuccess) {
    r.error = "no usable GPU (" + describe(e) + ")";
    return r;
  }
  for (int d = 0; d < count; ++d) {
    hipDeviceProp_t prop{};
    if (const hipError_t e = hipGetDeviceProperties(&prop, d); e != hipSuccess) {
      r.error = "device " + std::to_string(d) + ": " + describe(e);
      continue;
    }
    device_info info;
    info.index = d;
    info.name = prop.name;
    info.arch = arch_name(prop);
    info.total_bytes = prop.totalGlobalMem;
    info.multiprocessors = prop.multiProcessorCount;
    if (hipSetDevice(d) == hipSuccess) {
      std::size_t free_b = 0, total_b = 0;
      if (hipMemGetInfo(&free_b, &total_b) == hipSuccess) info.free_bytes = free_b;
    }
    r.devices.push_back(std::move(info));
  }
  if (count == 0) r.error = "the runtime found no GPU";
  return r;
}

#else

device_report query_devices() {
  device_report r;
  r.backend = "none";
  r.error = "built without a GPU backend (configure with -DANVIL_GPU=cuda or -DANVIL_GPU=hip)";
  return r;
}

#endif

}  // namespace anvil::gpu_worker
