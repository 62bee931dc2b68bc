// What the GPU backend compiled into this build sees on this machine. Used by `anvil info` and
// by the GPU worker at start-up. Reading device properties allocates nothing on the device.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace anvil::gpu_worker {

struct device_info {
  int index = 0;                  // device ordinal
  std::string name;               // marketing name, e.g. "NVIDIA H100 80GB HBM3"
  std::string arch;               // "sm_90" on NVIDIA, the gfx name on AMD
  std::size_t total_bytes = 0;    // device memory size
  std::size_t free_bytes = 0;     // free device memory at the time of the query
  int multiprocessors = 0;        // SMs (NVIDIA) or CUs (AMD)
};

struct device_report {
  std::string backend;            // "none", "cuda" or "hip": what this build was compiled with
  std::string runtime_version;    // runtime library version, empty without a backend
  std::string driver_version;     // driver version, empty when no driver answered
  std::string collectives;        // the GPUs' collectives for --tensor-parallel ("NCCL 2.28.3"), or why there are none
  std::vector<device_info> devices;
  std::string error;              // why `devices` is empty, when it is
};

device_report query_devices();

}  // namespace anvil::gpu_worker
