// communicator.h in a GPU build without device collectives (HIP: Debian ships no RCCL): a group of
// one device, whose collectives have nothing to combine, and a refusal for more.
#include <stdexcept>
#include <string>

#include "gpu_worker/communicator.h"

namespace anvil::gpu_worker {
namespace {

class single_device final : public communicator {
 public:
  explicit single_device(int device) : device_(device) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int device() const override { return device_; }
  void all_reduce_sum(float*, std::size_t, hipStream_t) override {}
  void abort() override {}
  std::string describe() const override { return "one device, no collectives"; }
  void all_gather(const float* mine, std::size_t n, float* all, hipStream_t stream) override {
    if (mine != all && hipMemcpyAsync(all, mine, n * sizeof(float), hipMemcpyDeviceToDevice, stream) != hipSuccess) {
      throw std::runtime_error("all-gather: the copy failed");
    }
  }

 private:
  int device_;
};

}  // namespace

bool device_collectives_built() { return false; }
std::string device_collectives_version() { return ""; }

std::vector<std::unique_ptr<communicator>> make_device_group(std::span<const int> devices, const device_group_options&) {
  if (devices.size() != 1) {
    throw std::runtime_error("this build has no device collectives (NCCL, in an NVIDIA build): it cannot split a model over " +
                             std::to_string(devices.size()) + " GPUs");
  }
  std::vector<std::unique_ptr<communicator>> out;
  out.push_back(std::make_unique<single_device>(devices[0]));
  return out;
}

}  // namespace anvil::gpu_worker
