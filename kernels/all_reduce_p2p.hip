// all_reduce_p2p (kernels/all_reduce_p2p.h): a block per chunk; its threads push, fence and sum,
// thread q < n_ranks waits for rank q's flag.
#include "kernels/all_reduce_p2p.h"

namespace anvil::kernels {
namespace {

constexpr int threads = 256;

// A load from L2, past this SM's L1 (which peers' stores do not update).
__device__ __forceinline__ float load_l2(const float* p) {
#if defined(ANVIL_GPU_CUDA)
  return __ldcg(p);
#else
  return *static_cast<const volatile float*>(p);
#endif
}

__global__ void __launch_bounds__(threads) all_reduce_p2p_kernel(all_reduce_p2p_rank p) {
  const int b = int(blockIdx.x), tid = int(threadIdx.x);
  const std::int64_t lo = std::int64_t(b) * all_reduce_p2p_chunk;
  const std::int64_t hi = min(p.n, lo + all_reduce_p2p_chunk);
  const std::int64_t blocks = all_reduce_p2p_blocks(p.capacity);
  const unsigned epoch = p.epochs[b] + 1u;
  const std::int64_t half = std::int64_t(epoch & 1u) * p.n_ranks * p.capacity;
  // 1. This rank's chunk into its slot on every rank.
  for (int q = 0; q < p.n_ranks; ++q) {
    float* slot = p.staging[q] + half + std::int64_t(p.rank) * p.capacity;
    for (std::int64_t i = lo + tid; i < hi; i += threads) slot[i] = p.x[i];
  }
  // 2. Every thread's stores visible to every device before any flag says so.
  __threadfence_system();
  __syncthreads();
  if (tid < p.n_ranks) {
    volatile unsigned* flag = p.flags[tid] + std::int64_t(p.rank) * blocks + b;
    *flag = epoch;
  }
  // 3. Every rank's chunk here (wrap-safe comparison; an abort ends the wait).
  if (tid < p.n_ranks) {
    const volatile unsigned* flag = p.flags[p.rank] + std::int64_t(tid) * blocks + b;
    for (unsigned spins = 1; int(*flag - epoch) < 0; ++spins) {
      if (spins % 1024 == 0 && *p.abort != 0) break;  // host memory: a slow read, so not every turn
    }
  }
  __syncthreads();
  __threadfence();
  // 4. The sum in rank order, read past the L1 (peers wrote the slots).
  const float* mine = p.staging[p.rank] + half;
  for (std::int64_t i = lo + tid; i < hi; i += threads) {
    float s = 0.f;
    for (int q = 0; q < p.n_ranks; ++q) s += load_l2(mine + std::int64_t(q) * p.capacity + i);
    p.x[i] = s;
  }
  if (tid == 0) p.epochs[b] = epoch;
}

}  // namespace

hipError_t launch_all_reduce_p2p(const all_reduce_p2p_rank& p, hipStream_t stream) {
  if (p.n < 0 || p.n > p.capacity || p.capacity % all_reduce_p2p_chunk != 0 || p.n_ranks < 1 ||
      p.n_ranks > all_reduce_p2p_max_ranks || p.rank < 0 || p.rank >= p.n_ranks) {
    return hipErrorInvalidValue;
  }
  if (p.n == 0) return hipSuccess;
  if (!p.x || !p.epochs || !p.abort) return hipErrorInvalidValue;
  for (int q = 0; q < p.n_ranks; ++q) {
    if (!p.staging[q] || !p.flags[q]) return hipErrorInvalidValue;
  }
  const unsigned blocks = static_cast<unsigned>(all_reduce_p2p_blocks(p.n));
  all_reduce_p2p_kernel<<<dim3(blocks), threads, 0, stream>>>(p);
  return hipGetLastError();
}

}  // namespace anvil::kernels
