// collectives_bench: what the GPU ranks' collectives (gpu_worker/communicator.h) cost on this
// machine, for the sizes a tensor-parallel step moves: an all-reduce of the hidden state (tokens x
// n_embd floats: 4,096 for one llama3-8b token, up to 2,048 tokens of prefill) and an all-gather
// of the same per rank. For each group size from 1 to every device: µs per collective, replayed
// from a graph of 20 (launch costs out, as the worker's decode graphs run them), and NCCL's bus
// bandwidth (all-reduce: 2 (n - 1) / n x bytes / time; all-gather: (n - 1) / n x bytes gathered /
// time) beside it; and the all-reduce by the one-shot kernel over peer memory (kernels/
// all_reduce_p2p.h, up to 8 MB here), where the devices have peer access, to place the default
// threshold (device_group_options::p2p_max_bytes).
//   collectives_bench [--max-devices N]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "gpu_worker/communicator.h"
#include "kernels/gpu_runtime.h"

namespace {

using anvil::gpu_worker::communicator;

void ok(hipError_t e, const char* what) {
  if (e != hipSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, hipGetErrorString(e));
    std::exit(1);
  }
}

constexpr int per_graph = 20, launches = 10;

// µs per collective on rank c (every rank runs this at once): a graph of per_graph of them, launched
// `launches` times after one warm-up launch.
double time_rank(communicator& c, std::size_t n_floats, bool gather) {
  ok(hipSetDevice(c.device()), "set device");
  hipStream_t s{};
  ok(hipStreamCreateWithFlags(&s, hipStreamNonBlocking), "stream");
  float *x = nullptr, *all = nullptr;
  ok(hipMalloc(&x, n_floats * sizeof(float)), "malloc");
  ok(hipMalloc(&all, n_floats * sizeof(float) * std::size_t(c.size())), "malloc");
  ok(hipMemset(x, 0, n_floats * sizeof(float)), "memset");
  hipGraph_t g{};
  hipGraphExec_t exec{};
  ok(hipStreamBeginCapture(s, hipStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < per_graph; ++i) {
    if (gather) {
      c.all_gather(x, n_floats, all, s);
    } else {
      c.all_reduce_sum(x, n_floats, s);
    }
  }
  ok(hipStreamEndCapture(s, &g), "end capture");
  ok(hipGraphInstantiateWithFlags(&exec, g, 0), "instantiate");
  ok(hipGraphLaunch(exec, s), "warm-up");
  ok(hipStreamSynchronize(s), "sync");
  hipEvent_t a{}, b{};
  ok(hipEventCreate(&a), "event");
  ok(hipEventCreate(&b), "event");
  ok(hipEventRecord(a, s), "record");
  for (int i = 0; i < launches; ++i) ok(hipGraphLaunch(exec, s), "launch");
  ok(hipEventRecord(b, s), "record");
  ok(hipEventSynchronize(b), "sync");
  float ms = 0;
  ok(hipEventElapsedTime(&ms, a, b), "elapsed");
  hipGraphExecDestroy(exec);
  hipGraphDestroy(g);
  hipFree(x);
  hipFree(all);
  hipStreamDestroy(s);
  return 1e3 * double(ms) / (per_graph * launches);
}

}  // namespace

int main(int argc, char** argv) try {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int devices = 0;
  ok(hipGetDeviceCount(&devices), "count devices");
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--max-devices") == 0) devices = std::min(devices, std::atoi(argv[i + 1]));
  }
  std::printf("collectives on %d device(s), %s; graphs of %d, %d launches\n", devices,
              anvil::gpu_worker::device_collectives_version().c_str(), per_graph, launches);
  const std::size_t n_embd = 4096;
  for (int n = 1; n <= devices; ++n) {
    std::vector<int> ids(static_cast<std::size_t>(n));
    std::iota(ids.begin(), ids.end(), 0);
    auto nccl = anvil::gpu_worker::make_device_group(ids, {.p2p_max_bytes = 0});
    auto one_shot = anvil::gpu_worker::make_device_group(ids, {.p2p_max_bytes = std::size_t(8) << 20});
    std::printf("\n%d rank(s): %s\n| tokens x 4096 floats | MB | all-reduce µs | bus GB/s | one-shot all-reduce µs | all-gather µs | bus GB/s |\n"
                "|---|---|---|---|---|---|---|\n",
                n, one_shot[0]->describe().c_str());
    for (std::size_t tokens : {1, 8, 16, 32, 64, 256, 512, 2048}) {
      const std::size_t floats = tokens * n_embd;
      double us[3] = {0, 0, 0};  // NCCL's all-reduce, the one-shot one, NCCL's all-gather
      for (int kind = 0; kind < 3; ++kind) {
        auto& group = kind == 1 ? one_shot : nccl;
        std::vector<double> t(static_cast<std::size_t>(n));
        std::vector<std::thread> threads;
        for (int r = 0; r < n; ++r) {
          threads.emplace_back([&, r] {
            try {
              t[std::size_t(r)] = time_rank(*group[std::size_t(r)], floats, kind == 2);
            } catch (const std::exception& e) {
              std::fprintf(stderr, "rank %d: %s\n", r, e.what());
              std::exit(1);
            }
          });
        }
        for (auto& th : threads) th.join();
        us[kind] = *std::max_element(t.begin(), t.end());
      }
      const double bytes = double(floats) * sizeof(float), f = double(n - 1) / n;
      std::printf("| %zu | %.3f | %.1f | %.0f | %.1f | %.1f | %.0f |\n", tokens, bytes / 1e6, us[0], 2 * f * bytes / us[0] / 1e3,
                  us[1], us[2], f * bytes * n / us[2] / 1e3);
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "collectives_bench: %s\n", e.what());
  return 1;
}
