// ANVIL_HOST_DEVICE: marks a function that host code and GPU kernels both call (__host__
// __device__ under nvcc and hipcc, nothing for the C++ compiler).
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define ANVIL_HOST_DEVICE __host__ __device__
#else
#define ANVIL_HOST_DEVICE
#endif
