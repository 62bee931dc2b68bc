// gpu_roofline --phase-chain's kernels (kernels/bench/phase_chain.h).
#include "kernels/bench/phase_chain.h"

namespace anvil::bench {
namespace {

constexpr int threads = 256;
constexpr int warps = threads / gpu::warp_size;
constexpr int chunk = 16;  // weight bytes a lane reads at once
constexpr int max_in = 4864;

struct phase_shape {
  int in, out;
};
// q/k/v, o, gate/up, down.
__host__ __device__ constexpr phase_shape shape_of(int phase) {
  return phase == 0   ? phase_shape{896, 1152}
         : phase == 1 ? phase_shape{896, 896}
         : phase == 2 ? phase_shape{896, 9728}
                      : phase_shape{4864, 896};
}
__host__ __device__ constexpr std::size_t matrix_bytes(phase_shape s) {
  return (std::size_t(s.in) * std::size_t(s.out) + 255) / 256 * 256;
}
__host__ __device__ constexpr std::size_t matrix_offset(int phase) {
  std::size_t at = 0;
  for (int i = 0; i < phase; ++i) at += matrix_bytes(shape_of(i));
  return at;
}
constexpr std::size_t layer_bytes = matrix_offset(phase_chain_phases);

__device__ __forceinline__ float dot16(uint4 w, const float* x) {
  const unsigned words[4] = {w.x, w.y, w.z, w.w};
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 v = *reinterpret_cast<const float4*>(x + 4 * i);
    s += float(static_cast<signed char>(words[i])) * v.x + float(static_cast<signed char>(words[i] >> 8)) * v.y +
         float(static_cast<signed char>(words[i] >> 16)) * v.z + float(static_cast<signed char>(words[i] >> 24)) * v.w;
  }
  return s;
}

// Every block meets every other here (a sense counter: the last to arrive resets the count and moves
// the generation on). The blocks must all be resident.
__device__ __forceinline__ void grid_barrier(unsigned* sync) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned* generation = sync + 1;
    const unsigned seen = *generation;
    __threadfence();  // this block's outputs are visible before it is counted
    if (atomicAdd(sync, 1u) == gridDim.x - 1) {
      sync[0] = 0;
      __threadfence();
      atomicAdd(sync + 1, 1u);
    } else {
      while (*generation == seen) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

// One projection: each warp's first row's weights are loaded, then `ready` (the wait on the phase
// before), then the block stages x in shared memory and its warps take rows grid-stride.
template <int Phase, class Ready>
__device__ __forceinline__ void run_phase(const std::int8_t* w, const float* x, float* y, float* xs, Ready ready) {
  constexpr phase_shape s = shape_of(Phase);
  constexpr int chunks = s.in / chunk, max_first_chunks = (chunks + gpu::warp_size - 1) / gpu::warp_size;
  const int warp = int(threadIdx.x) / gpu::warp_size, lane = int(threadIdx.x) % gpu::warp_size;
  const int first = int(blockIdx.x) * warps + warp, stride = int(gridDim.x) * warps;
  uint4 pre[max_first_chunks];
#pragma unroll
  for (int k = 0; k < max_first_chunks; ++k) {
    const int ci = lane + k * gpu::warp_size;
    pre[k] = first < s.out && ci < chunks
                 ? *reinterpret_cast<const uint4*>(w + std::size_t(first) * std::size_t(s.in) + std::size_t(ci) * chunk)
                 : make_uint4(0, 0, 0, 0);
  }
  ready();
  for (int i = int(threadIdx.x); i < s.in; i += threads) xs[i] = x[i];
  __syncthreads();
  for (int row = first; row < s.out; row += stride) {
    float sum = 0.f;
    if (row == first) {
#pragma unroll
      for (int k = 0; k < max_first_chunks; ++k) {
        const int ci = lane + k * gpu::warp_size;
        if (ci < chunks) sum += dot16(pre[k], xs + ci * chunk);
      }
    } else {
      const std::int8_t* wr = w + std::size_t(row) * std::size_t(s.in);
      for (int ci = lane; ci < chunks; ci += gpu::warp_size) {
        sum += dot16(*reinterpret_cast<const uint4*>(wr + std::size_t(ci) * chunk), xs + ci * chunk);
      }
    }
    sum = gpu::warp_reduce_sum(sum);
    if (lane == 0) y[row] = sum;
  }
}

// run_phase with up to prefetch_loads 16-byte weight loads a lane requested before `ready`: the
// warp's first rows whole (as many as fit), the rest as run_phase takes them. The same sums in the
// same order as run_phase.
constexpr int prefetch_loads = 12;
template <int Phase, class Ready>
__device__ __forceinline__ void run_phase_prefetched(const std::int8_t* w, const float* x, float* y, float* xs,
                                                     Ready ready) {
  constexpr phase_shape s = shape_of(Phase);
  constexpr int chunks = s.in / chunk, per_row = (chunks + gpu::warp_size - 1) / gpu::warp_size;
  constexpr int rows = prefetch_loads / per_row > 0 ? prefetch_loads / per_row : 1;
  const int warp = int(threadIdx.x) / gpu::warp_size, lane = int(threadIdx.x) % gpu::warp_size;
  const int first = int(blockIdx.x) * warps + warp, stride = int(gridDim.x) * warps;
  uint4 pre[rows][per_row];
#pragma unroll
  for (int r = 0; r < rows; ++r) {
    const int row = first + r * stride;
#pragma unroll
    for (int k = 0; k < per_row; ++k) {
      const int ci = lane + k * gpu::warp_size;
      pre[r][k] = row < s.out && ci < chunks
                      ? *reinterpret_cast<const uint4*>(w + std::size_t(row) * std::size_t(s.in) + std::size_t(ci) * chunk)
                      : make_uint4(0, 0, 0, 0);
    }
  }
  ready();
  for (int i = int(threadIdx.x); i < s.in; i += threads) xs[i] = x[i];
  __syncthreads();
#pragma unroll
  for (int r = 0; r < rows; ++r) {
    const int row = first + r * stride;
    if (row >= s.out) break;  // uniform over the warp
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < per_row; ++k) {
      const int ci = lane + k * gpu::warp_size;
      if (ci < chunks) sum += dot16(pre[r][k], xs + ci * chunk);
    }
    sum = gpu::warp_reduce_sum(sum);
    if (lane == 0) y[row] = sum;
  }
  for (int row = first + rows * stride; row < s.out; row += stride) {
    float sum = 0.f;
    const std::int8_t* wr = w + std::size_t(row) * std::size_t(s.in);
    for (int ci = lane; ci < chunks; ci += gpu::warp_size) {
      sum += dot16(*reinterpret_cast<const uint4*>(wr + std::size_t(ci) * chunk), xs + ci * chunk);
    }
    sum = gpu::warp_reduce_sum(sum);
    if (lane == 0) y[row] = sum;
  }
}

template <int Phase>
__global__ void __launch_bounds__(threads) phase_prefetched_kernel(const std::int8_t* w, const float* x, float* y) {
  __shared__ __align__(16) float xs[max_in];
  run_phase_prefetched<Phase>(w, x, y, xs, [] {
    gpu::dependency_wait();  // launched with gpu::launch_dependent
    gpu::allow_dependents();
  });
}

// No work: the wait and the release alone, as a dependent launch in the chain.
__global__ void __launch_bounds__(threads) phase_empty_kernel() {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
}

template <int Phase>
__global__ void __launch_bounds__(threads) phase_kernel(const std::int8_t* w, const float* x, float* y) {
  __shared__ __align__(16) float xs[max_in];
  run_phase<Phase>(w, x, y, xs, [] {
    gpu::dependency_wait();  // launched with gpu::launch_dependent
    gpu::allow_dependents();
  });
}

template <bool Sync>
__global__ void __launch_bounds__(threads) persistent_kernel(const std::int8_t* w, int layers, float* buf, unsigned* sync) {
  __shared__ __align__(16) float xs[max_in];
  // Phase p of layer l reads buf half (p % 2) and writes the other (four phases a layer: even).
  const auto phase = [&]<int P>(int l) {
    run_phase<P>(w + std::size_t(l) * layer_bytes + matrix_offset(P), buf + (P % 2) * phase_chain_max_width,
                 buf + ((P + 1) % 2) * phase_chain_max_width, xs, [&] {
                   if (Sync && (l > 0 || P > 0)) {
                     grid_barrier(sync);  // also: every warp of this block is done with xs
                   } else {
                     __syncthreads();
                   }
                 });
  };
  for (int l = 0; l < layers; ++l) {
    phase.template operator()<0>(l);
    phase.template operator()<1>(l);
    phase.template operator()<2>(l);
    phase.template operator()<3>(l);
  }
}

}  // namespace

std::size_t phase_chain_layer_bytes() { return layer_bytes; }

hipError_t launch_phase_chain(const phase_chain_params& p, phase_mode mode, hipStream_t stream) {
  if (p.blocks < 1 || p.layers < 1) return hipErrorInvalidValue;
  if (mode == phase_mode::launches_empty) {
    for (int i = 0; i < p.layers * phase_chain_phases; ++i) {
      gpu::launch_dependent(phase_empty_kernel, dim3(unsigned(p.blocks)), dim3(threads), stream);
    }
  } else if (mode == phase_mode::launches || mode == phase_mode::launches_prefetched) {
    static_assert(phase_chain_phases == 4 && phase_chain_phases % 2 == 0, "a layer's phases leave x where it began");
    const bool prefetched = mode == phase_mode::launches_prefetched;
    const auto launch = [&]<int P>(int l) {
      gpu::launch_dependent(prefetched ? phase_prefetched_kernel<P> : phase_kernel<P>, dim3(unsigned(p.blocks)),
                            dim3(threads), stream, p.w + std::size_t(l) * layer_bytes + matrix_offset(P),
                            static_cast<const float*>(p.buf + (P % 2) * phase_chain_max_width),
                            p.buf + ((P + 1) % 2) * phase_chain_max_width);
    };
    for (int l = 0; l < p.layers; ++l) {
      launch.template operator()<0>(l);
      launch.template operator()<1>(l);
      launch.template operator()<2>(l);
      launch.template operator()<3>(l);
    }
  } else if (mode == phase_mode::persistent) {
    persistent_kernel<true><<<dim3(unsigned(p.blocks)), dim3(threads), 0, stream>>>(p.w, p.layers, p.buf, p.sync);
  } else {
    persistent_kernel<false><<<dim3(unsigned(p.blocks)), dim3(threads), 0, stream>>>(p.w, p.layers, p.buf, p.sync);
  }
  return hipGetLastError();
}

}  // namespace anvil::bench
