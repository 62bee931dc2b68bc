// arrivals: when each request of an open-loop run is sent, as vLLM's benchmark_serving does it.
// Inter-arrival gaps are gamma-distributed with shape `burstiness` and mean 1/rate: burstiness 1
// is a Poisson process, smaller is burstier, larger is more even. An infinite rate sends
// everything at once. Seeded, so a run's schedule is reproducible.
#pragma once

#include <cstdint>
#include <vector>

namespace anvil::bench {

// Send offsets in seconds from the start of the run, one per request, non-decreasing; the first
// request goes at 0 and each later one a random gap after the previous one.
std::vector<double> arrival_offsets(int n, double rate, double burstiness, std::uint64_t seed);

}  // namespace anvil::bench
