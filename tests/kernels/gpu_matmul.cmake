# GPU suites of the matmul family (GEMV, GEMM, dequantize, embedding gather), each against its CPU
# reference. Included from tests/CMakeLists.txt only when a GPU backend is configured.
anvil_add_test(kernels_gpu_matmul_test LABELS "kernels;gpu" TIMEOUT 600
  SOURCES
    kernels/gemv_gpu_test.cpp
    kernels/gemv_norm_gpu_test.cpp
    kernels/gemm_gpu_test.cpp
    kernels/gemm_fp8_gpu_test.cpp
    kernels/embedding_gpu_test.cpp
    kernels/moe_gpu_test.cpp
  LIBS anvil_kernels_gpu anvil_kernels_cpu)
