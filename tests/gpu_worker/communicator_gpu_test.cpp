// The GPU ranks' collectives (gpu_worker/communicator.h) on every device the runtime sees: groups
// of 1 to all of them, each rank driven from a thread of its own as the tensor-parallel worker
// drives them; sums and gathers exact on values whose float sums are exact, the same floats on
// every rank, and the same again when the collectives are replayed from a captured graph.
// Runs only where the runtime sees a GPU.
#include <chrono>
#include <cstdio>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_worker/communicator.h"
#include "kernels/gpu_runtime.h"

namespace {

using namespace anvil::gpu_worker;

int device_count() {
  int n = 0;
  return hipGetDeviceCount(&n) == hipSuccess ? n : 0;
}

constexpr std::size_t n_elems = 5000;  // not a multiple of anything NCCL splits by

float value(int rank, std::size_t i) { return float(rank * 1000) + float(i % 977) * 0.5f; }

// Each rank, on its own thread and device: an all-reduce and an all-gather, eagerly or from a
// captured graph; what came back to the host.
struct rank_result {
  std::vector<float> reduced, gathered;
  std::string error;
};

rank_result run_rank(communicator& c, bool graph) {
  rank_result out;
  const auto fail = [&](const char* what) { out.error = what; return out; };
  if (hipSetDevice(c.device()) != hipSuccess) return fail("set device");
  hipStream_t s{};
  if (hipStreamCreateWithFlags(&s, hipStreamNonBlocking) != hipSuccess) return fail("stream");
  float *x = nullptr, *all = nullptr;
  const std::size_t gather = n_elems * std::size_t(c.size());
  if (hipMalloc(reinterpret_cast<void**>(&x), n_elems * sizeof(float)) != hipSuccess ||
      hipMalloc(reinterpret_cast<void**>(&all), gather * sizeof(float)) != hipSuccess) {
    return fail("malloc");
  }
  std::vector<float> host(n_elems);
  for (std::size_t i = 0; i < n_elems; ++i) host[i] = value(c.rank(), i);
  if (hipMemcpy(x, host.data(), n_elems * sizeof(float), hipMemcpyHostToDevice) != hipSuccess) return fail("upload");
  try {
    if (graph) {
      hipGraph_t g{};
      hipGraphExec_t exec{};
      if (hipStreamBeginCapture(s, hipStreamCaptureModeThreadLocal) != hipSuccess) return fail("capture");
      c.all_reduce_sum(x, n_elems, s);
      c.all_gather(x, n_elems, all, s);
      if (hipStreamEndCapture(s, &g) != hipSuccess || hipGraphInstantiateWithFlags(&exec, g, 0) != hipSuccess) {
        return fail("instantiate");
      }
      if (hipGraphLaunch(exec, s) != hipSuccess) return fail("launch");
      if (hipStreamSynchronize(s) != hipSuccess) return fail("replay");
      (void)hipGraphExecDestroy(exec);
      (void)hipGraphDestroy(g);
    } else {
      c.all_reduce_sum(x, n_elems, s);
      c.all_gather(x, n_elems, all, s);
    }
  } catch (const std::exception& e) {
    out.error = e.what();
    return out;
  }
  if (hipStreamSynchronize(s) != hipSuccess) return fail("synchronize");
  out.reduced.resize(n_elems);
  out.gathered.resize(gather);
  if (hipMemcpy(out.reduced.data(), x, n_elems * sizeof(float), hipMemcpyDeviceToHost) != hipSuccess ||
      hipMemcpy(out.gathered.data(), all, gather * sizeof(float), hipMemcpyDeviceToHost) != hipSuccess) {
    return fail("download");
  }
  (void)hipFree(x);
  (void)hipFree(all);
  (void)hipStreamDestroy(s);
  return out;
}

TEST(DeviceGroup, SumsAndGathersOnEveryGroupSizeEagerlyAndFromAGraph) {
  const int devices = device_count();
  // The gpu-labelled suites run on a machine with a GPU; without one they fail (REQUIRE_GPU's rule).
  if (devices == 0) GTEST_FAIL() << "no GPU: the gpu-labelled suites need one";
  std::printf("[ %d devices, %s ]\n", devices,
              device_collectives_built() ? device_collectives_version().c_str() : "no device collectives in this build");
  const int most = device_collectives_built() ? devices : 1;
  for (int n = 1; n <= most; ++n) {
    std::vector<int> ids(static_cast<std::size_t>(n));
    std::iota(ids.begin(), ids.end(), 0);
    for (const std::size_t p2p_max_bytes : {device_group_options{}.p2p_max_bytes, std::size_t(0)}) {
    SCOPED_TRACE(p2p_max_bytes ? "one-shot all-reduce where the devices are peers" : "NCCL only");
    auto group = make_device_group(ids, {.p2p_max_bytes = p2p_max_bytes});
    ASSERT_EQ(group.size(), std::size_t(n));
    std::printf("[ %d rank(s): %s ]\n", n, group[0]->describe().c_str());
    for (const bool graph : {true, false}) {  // a graph first: capture before any eager collective
      std::vector<rank_result> got(static_cast<std::size_t>(n));
      std::vector<std::thread> threads;
      for (int r = 0; r < n; ++r) {
        threads.emplace_back([&, r] { got[std::size_t(r)] = run_rank(*group[std::size_t(r)], graph); });
      }
      for (std::thread& t : threads) t.join();
      for (int r = 0; r < n; ++r) {
        const rank_result& g = got[std::size_t(r)];
        ASSERT_EQ(g.error, "") << n << " ranks, rank " << r << (graph ? ", graph" : "");
        for (std::size_t i = 0; i < n_elems; i += 97) {
          float want = 0;
          for (int q = 0; q < n; ++q) want += value(q, i);
          EXPECT_EQ(g.reduced[i], want) << n << " ranks, rank " << r << ", element " << i;
        }
        EXPECT_EQ(g.reduced, got[0].reduced) << "rank " << r << " ends with other floats than rank 0";
        for (int q = 0; q < n; ++q) {
          EXPECT_EQ(g.gathered[std::size_t(q) * n_elems + 3], got[0].reduced[3]);  // every rank's x is the sum
        }
      }
    }
    }
  }
  if (!device_collectives_built()) {
    const std::vector<int> two{0, 0};
    EXPECT_THROW(make_device_group(two), std::runtime_error);
  }
}

// A rank whose peers never come waits on the device until abort() ends it (what a failed rank's
// group does), on either path; later collectives of the group fail.
TEST(DeviceGroup, AnAbortEndsARanksWaitForPeersThatNeverCome) {
  if (device_count() < 2 || !device_collectives_built()) GTEST_SKIP() << "needs two GPUs and NCCL";
  for (const std::size_t p2p_max_bytes : {device_group_options{}.p2p_max_bytes, std::size_t(0)}) {
    SCOPED_TRACE(p2p_max_bytes ? "one-shot all-reduce" : "NCCL only");
    const std::vector<int> ids{0, 1};
    auto group = make_device_group(ids, {.p2p_max_bytes = p2p_max_bytes});
    ASSERT_EQ(hipSetDevice(0), hipSuccess);
    hipStream_t s{};
    ASSERT_EQ(hipStreamCreateWithFlags(&s, hipStreamNonBlocking), hipSuccess);
    float* x = nullptr;
    ASSERT_EQ(hipMalloc(&x, 1024 * sizeof(float)), hipSuccess);
    group[0]->all_reduce_sum(x, 1024, s);  // rank 1 never calls
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(hipStreamQuery(s), hipErrorNotReady) << "rank 0 waits for rank 1";
    group[0]->abort();
    group[1]->abort();
    (void)hipStreamSynchronize(s);  // returns (NCCL may report the abort as an error)
    (void)hipGetLastError();
    EXPECT_THROW(group[0]->all_reduce_sum(x, 1024, s), std::runtime_error);
    (void)hipFree(x);
    (void)hipStreamDestroy(s);
  }
}

}  // namespace
