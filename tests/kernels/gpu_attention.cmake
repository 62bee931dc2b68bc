# GPU kernels of the worker's forward pass (attention side, norms, SwiGLU, candidates) against
# their CPU references. Included from tests/CMakeLists.txt only with a GPU backend.
anvil_add_test(kernels_gpu_ops_test LABELS "kernels;gpu"
  SOURCES kernels/attention_gpu_test.cpp kernels/ops_gpu_test.cpp kernels/delta_net_gpu_test.cpp
  LIBS anvil_kernels_gpu anvil_kernels_cpu anvil_sampler
  TIMEOUT 600)
