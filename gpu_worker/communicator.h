// The collectives of the GPU ranks of one engine, enqueued on each rank's stream over device memory:
// what the tensor-parallel GPU worker calls between its ranks (model/arch/tensor_parallel.h has
// the split; gpu_worker/host_group.h is the CPU ranks' counterpart). NCCL on NVIDIA
// (nccl_communicator.cpp); a build without it (HIP: Debian ships no RCCL) refuses more than one
// rank. Every rank calls the same collectives in the same order with the same lengths, each from
// the thread that drives its device, and every rank ends an all-reduce with the same floats.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/gpu_runtime.h"

namespace anvil::gpu_worker {

class communicator {
 public:
  virtual ~communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int device() const = 0;
  // x[0, n) = the sum over the ranks of their x[0, n), in place, enqueued on `stream`.
  virtual void all_reduce_sum(float* x, std::size_t n, hipStream_t stream) = 0;
  // all[r * n, (r + 1) * n) = rank r's mine[0, n), enqueued on `stream`.
  virtual void all_gather(const float* mine, std::size_t n, float* all, hipStream_t stream) = 0;
  // Ends this rank's collectives under way (and every later one) with an error instead of waiting
  // for ranks that will not come: what a rank's failure calls on every rank. The group is unusable
  // afterwards. Callable from any thread, while another waits on the stream.
  virtual void abort() = 0;
  // What the group's collectives run on ("NCCL 2.28.3, all-reduces up to 256 KB one-shot over peer
  // memory"), for the start-up log.
  virtual std::string describe() const = 0;
};

// Whether this build has device collectives (NCCL), and which library version ("" without).
bool device_collectives_built();
std::string device_collectives_version();

// How a group's collectives run. All-reduces of up to p2p_max_bytes take the one-shot kernel
// (kernels/all_reduce_p2p.h) where every pair of the group's GPUs has peer access: one hop instead
// of NCCL's ring latency, for the small messages of decode steps. 0 leaves everything to NCCL.
struct device_group_options {
  std::size_t p2p_max_bytes = std::size_t(256) << 10;
};

// One communicator per device of `devices` (ordinals, distinct), rank r on devices[r], made
// together from this thread. Throws std::runtime_error naming the failure, or where this build
// has no device collectives and more than one device is named; one device needs none (its
// collectives copy nothing and return).
std::vector<std::unique_ptr<communicator>> make_device_group(std::span<const int> devices,
                                                             const device_group_options& options = {});


}  // namespace anvil::gpu_worker
