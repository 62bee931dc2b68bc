// communicator.h on NCCL (NVIDIA). The library is opened when a group is first made, not linked:
// an `anvil` that never splits a model over GPUs runs where NCCL is not installed. It is
// `libnccl.so.2` from the library path (the build's RPATH names the CUDA toolkit's lib64), or the
// file ANVIL_NCCL_LIBRARY names. The calls are typed by the toolkit's nccl.h.
// ncclCommInitAll makes the group's communicators in one call from one thread; each rank then
// enqueues its collectives from its own thread on its own stream. Small all-reduces take the
// one-shot kernel over peer memory instead (kernels/all_reduce_p2p.h; device_group_options), where
// every pair of the group's GPUs has peer access: its buffers are allocated here, with the group.
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gpu_worker/communicator.h"
#include "kernels/all_reduce_p2p.h"

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

// The one-shot all-reduce's buffers for the whole group: each rank's staging area and flags on its
// device, one abort flag in host memory every device sees. Freed with the last communicator.
struct p2p_buffers {
  std::vector<int> devices;
  std::int64_t capacity = 0;  // floats
  std::vector<float*> staging;
  std::vector<unsigned*> flags;  // each rank's flags, then its epochs
  int* abort_host = nullptr;
  const volatile int* abort_device = nullptr;
  p2p_buffers() = default;
  p2p_buffers(const p2p_buffers&) = delete;
  p2p_buffers& operator=(const p2p_buffers&) = delete;
  ~p2p_buffers() {
    for (std::size_t r = 0; r < devices.size(); ++r) {
      (void)hipSetDevice(devices[r]);
      if (r < staging.size()) (void)hipFree(staging[r]);
      if (r < flags.size()) (void)hipFree(flags[r]);
    }
    if (abort_host != nullptr) (void)hipHostFree(abort_host);
  }
  // Rank r's launch of an all-reduce of x[0, n).
  kernels::all_reduce_p2p_rank rank(int r, float* x, std::size_t n) const {
    kernels::all_reduce_p2p_rank p{.x = x, .n = std::int64_t(n), .rank = r, .n_ranks = int(devices.size()), .capacity = capacity};
    for (std::size_t q = 0; q < devices.size(); ++q) {
      p.staging[q] = staging[q];
      p.flags[q] = flags[q];
    }
    p.epochs = flags[std::size_t(r)] + std::int64_t(devices.size()) * kernels::all_reduce_p2p_blocks(capacity);
    p.abort = abort_device;
    return p;
  }
};

class nccl_communicator final : public communicator {
 public:
  nccl_communicator(ncclComm_t comm, int rank, int size, int device, std::shared_ptr<const p2p_buffers> p2p)
      : comm_(comm), p2p_(std::move(p2p)), rank_(rank), size_(size), device_(device) {}
  ~nccl_communicator() override {
    if (!aborted_.exchange(true)) api().destroy(comm_);
  }
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }

  void all_reduce_sum(float* x, std::size_t n, hipStream_t stream) override {
    if (aborted_) throw std::runtime_error("all-reduce: the group was aborted");
    if (p2p_ && n <= std::size_t(p2p_->capacity)) {
      if (const hipError_t e = kernels::launch_all_reduce_p2p(p2p_->rank(rank_, x, n), stream); e != hipSuccess) {
        throw std::runtime_error(std::string("one-shot all-reduce: ") + hipGetErrorString(e));
      }
      return;
    }
    check(api().all_reduce(x, x, n, ncclFloat32, ncclSum, comm_, stream), "all-reduce");
  }
  void all_gather(const float* mine, std::size_t n, float* all, hipStream_t stream) override {
    if (aborted_) throw std::runtime_error("all-gather: the group was aborted");
    check(api().all_gather(mine, all, n, ncclFloat32, comm_, stream), "all-gather");
  }
  void abort() override {
    if (p2p_) *const_cast<volatile int*>(static_cast<const volatile int*>(p2p_->abort_host)) = 1;  // every rank's waits end
    if (!aborted_.exchange(true)) api().abort(comm_);  // frees the communicator too
  }
  std::string describe() const override {
    return device_collectives_version() +
           (p2p_ ? ", all-reduces up to " + std::to_string(p2p_->capacity * 4 >> 10) + " KB one-shot over peer memory" : "");
  }

 private:
  ncclComm_t comm_;
  std::shared_ptr<const p2p_buffers> p2p_;  // null: NCCL only
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

// The one-shot all-reduce's buffers, or null where it cannot run (one device, a pair of devices
// without peer access) or is not wanted (max_bytes 0). Peer access is turned on for every pair.
std::shared_ptr<const p2p_buffers> make_p2p(std::span<const int> devices, std::size_t max_bytes) {
  const int n = int(devices.size());
  if (n < 2 || n > kernels::all_reduce_p2p_max_ranks || max_bytes < sizeof(float)) return nullptr;
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      int can = 0;
      if (a != b && (hipDeviceCanAccessPeer(&can, devices[std::size_t(a)], devices[std::size_t(b)]) != hipSuccess || !can)) {
        return nullptr;
      }
    }
  }
  const auto fail = [](hipError_t e, const char* what) {
    if (e != hipSuccess) throw std::runtime_error(std::string("one-shot all-reduce: ") + what + ": " + hipGetErrorString(e));
  };
  auto p = std::make_shared<p2p_buffers>();
  const std::int64_t chunk = kernels::all_reduce_p2p_chunk;
  p->capacity = (std::int64_t(max_bytes / sizeof(float)) + chunk - 1) / chunk * chunk;
  for (int a = 0; a < n; ++a) {
    fail(hipSetDevice(devices[std::size_t(a)]), "select the device");
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      const hipError_t e = hipDeviceEnablePeerAccess(devices[std::size_t(b)], 0);
      if (e == hipErrorPeerAccessAlreadyEnabled) {
        (void)hipGetLastError();
      } else {
        fail(e, "enable peer access");
      }
    }
    p->devices.push_back(devices[std::size_t(a)]);
    float* staging = nullptr;
    unsigned* flags = nullptr;
    const std::size_t flag_bytes = kernels::all_reduce_p2p_flag_bytes(p->capacity, n);
    fail(hipMalloc(&staging, kernels::all_reduce_p2p_staging_bytes(p->capacity, n)), "allocate the staging area");
    p->staging.push_back(staging);
    fail(hipMalloc(&flags, flag_bytes), "allocate the flags");
    p->flags.push_back(flags);
    fail(hipMemset(flags, 0, flag_bytes), "clear the flags");
  }
  fail(hipHostMalloc(reinterpret_cast<void**>(&p->abort_host), sizeof(int), hipHostMallocMapped | hipHostMallocPortable),
       "allocate the abort flag");
  *p->abort_host = 0;
  void* dev = nullptr;
  fail(hipHostGetDevicePointer(&dev, p->abort_host, 0), "map the abort flag");
  p->abort_device = static_cast<const volatile int*>(dev);
  return p;
}

std::vector<std::unique_ptr<communicator>> make_device_group(std::span<const int> devices, const device_group_options& options) {
  if (devices.empty()) throw std::runtime_error("a device group needs at least one device");
  if (!api().error.empty()) throw std::runtime_error(api().error);
  const int n = int(devices.size());
  std::vector<ncclComm_t> comms(devices.size());
  check(api().init_all(comms.data(), n, devices.data()), "make the group's communicators");
  const std::vector<ncclComm_t> raw = comms;  // for connect(), once the communicators own them
  std::vector<std::unique_ptr<communicator>> out;
  try {
    const std::shared_ptr<const p2p_buffers> p2p = make_p2p(devices, options.p2p_max_bytes);
    for (int r = 0; r < n; ++r) {
      out.push_back(std::make_unique<nccl_communicator>(comms[std::size_t(r)], r, n, devices[std::size_t(r)], p2p));
      comms[std::size_t(r)] = nullptr;  // owned by its communicator now
    }
  } catch (...) {
    for (ncclComm_t c : comms) {
      if (c != nullptr) api().destroy(c);
    }
    throw;
  }
  connect(raw, devices);
  return out;
}

}  // namespace anvil::gpu_worker
