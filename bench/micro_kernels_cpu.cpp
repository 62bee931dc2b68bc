// CPU reference kernels, timed. They define the ops; their speed matters only for the CPU
// backend's tests and small models. Reported as bytes moved per second (read x, w; write y).
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include "kernels/rms_norm.h"

namespace {

void BM_rms_norm_ref(benchmark::State& state) {
  const std::int64_t rows = state.range(0), cols = state.range(1);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  const auto n = static_cast<std::size_t>(rows * cols), nw = static_cast<std::size_t>(cols);
  std::vector<float> x(n), w(nw), y(n);
  for (auto& v : x) v = nd(rng);
  for (auto& v : w) v = nd(rng);
  for (auto _ : state) {
    anvil::kernels::rms_norm_ref(
        {.x = x.data(), .weight = w.data(), .y = y.data(), .rows = rows, .cols = cols, .eps = 1e-6f});
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * (2 * rows * cols + cols) * std::int64_t(sizeof(float)));
}
BENCHMARK(BM_rms_norm_ref)->Args({1, 4096})->Args({32, 4096})->Args({512, 896});

}  // namespace

BENCHMARK_MAIN();
