// all_reduce_p2p: the sum over N ranks (GPUs of one process, peer access on) of their x[0, n), in
// place on every rank, in one launch per rank and one hop: a "one-shot" all-reduce for the small
// messages of decode steps, where a ring's per-step latency (NCCL's ~6.6 µs at 16 KB on two H200s,
// bench/GPU_NOTES.md) is what a token pays ~65 times.
//
// Each rank's block b takes the chunk [b * all_reduce_p2p_chunk, +chunk) of x:
//   1. pushes it into its slot on every rank (rank q's staging area, slot = this rank; peer stores);
//   2. fences, then raises its flag for block b on every rank to this call's epoch;
//   3. waits until every rank's flag for block b on this rank has reached the epoch;
//   4. sums the N slots of the chunk in rank order (0, 1, ..., N-1) into x: the same floats on
//      every rank, which the ranks need (their next steps must agree).
// Epochs count each block's calls per rank (the ranks make the same calls in the same order), and
// the staging area has two halves used by alternate epochs, so a rank one call ahead never writes
// over a slot a slower rank still reads. An abort flag (host memory) ends every wait: what a failed
// rank's group does instead of hanging (communicator::abort). all_reduce_p2p_ref() is the sum the
// kernel must give.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/host_device.h"

namespace anvil::kernels {

inline constexpr int all_reduce_p2p_max_ranks = 8;
inline constexpr std::int64_t all_reduce_p2p_chunk = 2048;  // floats a block takes

// What one rank's launch reads; the pointers of other ranks are peer pointers into their memory.
struct all_reduce_p2p_rank {
  float* x = nullptr;          // [n] this rank's part in, the sum out
  std::int64_t n = 0;          // in [0, capacity]
  int rank = 0, n_ranks = 1;   // n_ranks in [1, all_reduce_p2p_max_ranks]
  float* staging[all_reduce_p2p_max_ranks] = {};       // rank q's: [2][n_ranks][capacity] floats
  unsigned* flags[all_reduce_p2p_max_ranks] = {};      // rank q's: [n_ranks][max_blocks], zero at start
  unsigned* epochs = nullptr;  // this rank's: [max_blocks], zero at start
  std::int64_t capacity = 0;   // floats of a slot: a multiple of all_reduce_p2p_chunk
  const volatile int* abort = nullptr;  // device-visible host flag: nonzero ends the waits
};

// The blocks a capacity needs, and the bytes of a rank's staging area, flags and epochs.
ANVIL_HOST_DEVICE inline std::int64_t all_reduce_p2p_blocks(std::int64_t capacity) {
  return (capacity + all_reduce_p2p_chunk - 1) / all_reduce_p2p_chunk;
}
inline std::size_t all_reduce_p2p_staging_bytes(std::int64_t capacity, int n_ranks) {
  return std::size_t(2) * std::size_t(n_ranks) * std::size_t(capacity) * sizeof(float);
}
inline std::size_t all_reduce_p2p_flag_bytes(std::int64_t capacity, int n_ranks) {
  return std::size_t(n_ranks + 1) * std::size_t(all_reduce_p2p_blocks(capacity)) * sizeof(unsigned);  // flags, then epochs
}

// The reference: every rank's x replaced by the sum of all ranks' in rank order (float adds).
void all_reduce_p2p_ref(std::span<std::vector<float>> xs);

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// Enqueues rank p.rank's part on `stream` (nothing for n = 0). Every rank must enqueue its part of
// the same call; a rank's kernel waits on the device for the others'. hipErrorInvalidValue for n
// past the capacity, ranks out of range, a capacity not a multiple of the chunk, or null pointers.
hipError_t launch_all_reduce_p2p(const all_reduce_p2p_rank& p, hipStream_t stream);
}  // namespace anvil::kernels
#endif
