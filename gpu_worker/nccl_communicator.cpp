// communicator.h on NCCL (NVIDIA). The library is opened when a group is first made, not linked:
// an `anvil` that never splits a model over GPUs runs where NCCL is not installed. It is
// `libnccl.so.2` from the library path (the build's RPATH names the CUDA toolkit's lib64), or the
// file ANVIL_NCCL_LIBRARY names. The calls are typed by the toolkit's nccl.h.
// ncclCommInitAll makes the group's communicators in one call from one thread; each rank then
// enqueues its collectives from its own thread on its own stream.
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "gpu_worker/communicator.h"

namespace anvil::gpu_worker {
namespace {

struct nccl_api {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclCommInitAll) init_all = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  std::string error;  // why the library could not be used ("" when it can)
};

template <class F>
void bind(void* lib, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr && error.empty()) error = std::string("NCCL has no ") + name;
}

const nccl_api& api() {
  static const nccl_api a = [] {
    nccl_api r;
    const char* path = std::getenv("ANVIL_NCCL_LIBRARY");
    const std::string file = path != nullptr && *path != '\0' ? path : "libnccl.so.2";
    void* lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      r.error = "NCCL (" + file + ") could not be opened: " + (why ? why : "unknown error") +
                " (install it, or name the file in ANVIL_NCCL_LIBRARY)";
      return r;
    }
    bind(lib, "ncclGetVersion", r.get_version, r.error);
    bind(lib, "ncclGetErrorString", r.error_string, r.error);
    bind(lib, "ncclCommInitAll", r.init_all, r.error);
    bind(lib, "ncclCommDestroy", r.destroy, r.error);
    bind(lib, "ncclCommAbort", r.abort, r.error);
    bind(lib, "ncclAllReduce", r.all_reduce, r.error);
    bind(lib, "ncclAllGather", r.all_gather, r.error);
    bind(lib, "ncclGroupStart", r.group_start, r.error);
    bind(lib, "ncclGroupEnd", r.group_end, r.error);
    return r;  // the library stays open for the process
  }();
  return a;
}

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string("NCCL: ") + what + ": " + api().error_string(r));
}

class nccl_communicator final : public communicator {
 public:
  nccl_communicator(ncclComm_t comm, int rank, int size, int device) : comm_(comm), rank_(rank), size_(size), device_(device) {}
  ~nccl_communicator() override {
    if (!aborted_.exchange(true)) api().destroy(comm_);
  }
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }

  void all_reduce_sum(float* x, std::size_t n, hipStream_t stream) override {
    check(api().all_reduce(x, x, n, ncclFloat32, ncclSum, comm_, stream), "all-reduce");
  }
  void all_gather(const float* mine, std::size_t n, float* all, hipStream_t stream) override {
    check(api().all_gather(mine, all, n, ncclFloat32, comm_, stream), "all-gather");
  }
  void abort() override {
    if (!aborted_.exchange(true)) api().abort(comm_);  // frees the communicator too
  }

 private:
  ncclComm_t comm_;
  std::atomic<bool> aborted_{false};
  int rank_, size_, device_;
};

// NCCL connects the ranks on their first collective, which cannot happen while a stream is being
// captured (measured on 2 H200s: "failed to peer with device 0: operation not permitted when
// stream is capturing"), and the workers capture their decode graphs at start-up: one all-reduce
// of one float on every rank, at once, connects them first.
void connect(const std::vector<ncclComm_t>& comms, std::span<const int> devices) {
  const auto fail = [](hipError_t e, const char* what) {
    if (e != hipSuccess) throw std::runtime_error(std::string("NCCL: connect the ranks: ") + what + ": " + hipGetErrorString(e));
  };
  std::vector<hipStream_t> streams(comms.size());
  std::vector<float*> one(comms.size());
  for (std::size_t r = 0; r < comms.size(); ++r) {
    fail(hipSetDevice(devices[r]), "select the device");
    fail(hipStreamCreateWithFlags(&streams[r], hipStreamNonBlocking), "create a stream");
    fail(hipMalloc(&one[r], sizeof(float)), "allocate");
    fail(hipMemsetAsync(one[r], 0, sizeof(float), streams[r]), "clear");
  }
  check(api().group_start(), "group");
  for (std::size_t r = 0; r < comms.size(); ++r) {
    fail(hipSetDevice(devices[r]), "select the device");
    check(api().all_reduce(one[r], one[r], 1, ncclFloat32, ncclSum, comms[r], streams[r]), "first all-reduce");
  }
  check(api().group_end(), "group");
  for (std::size_t r = 0; r < comms.size(); ++r) {
    fail(hipSetDevice(devices[r]), "select the device");
    fail(hipStreamSynchronize(streams[r]), "wait for the first all-reduce");
    fail(hipFree(one[r]), "free");
    fail(hipStreamDestroy(streams[r]), "destroy the stream");
  }
}

}  // namespace

bool device_collectives_built() { return true; }

std::string device_collectives_version() {
  int v = 0;
  if (!api().error.empty() || api().get_version(&v) != ncclSuccess) return "";
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::vector<std::unique_ptr<communicator>> make_device_group(std::span<const int> devices) {
  if (devices.empty()) throw std::runtime_error("a device group needs at least one device");
  if (!api().error.empty()) throw std::runtime_error(api().error);
  const int n = int(devices.size());
  std::vector<ncclComm_t> comms(devices.size());
  check(api().init_all(comms.data(), n, devices.data()), "make the group's communicators");
  std::vector<std::unique_ptr<communicator>> out;
  for (int r = 0; r < n; ++r) {
    out.push_back(std::make_unique<nccl_communicator>(comms[std::size_t(r)], r, n, devices[std::size_t(r)]));
  }
  connect(comms, devices);
  return out;
}

}  // namespace anvil::gpu_worker
