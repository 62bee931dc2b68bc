# The GPU worker against the CPU worker and the whole engine on the GPU (label gpu). Included
# from tests/CMakeLists.txt only with a GPU backend; the tests skip where no device is seen.
anvil_add_test(gpu_worker_test LABELS "gpu"
  SOURCES gpu_worker/gpu_worker_test.cpp
  LIBS anvil_engine anvil_gpu_worker anvil_model Boost::json
  TIMEOUT 600)
target_compile_definitions(gpu_worker_test PRIVATE ANVIL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# The one rule against the runtime: every allocating CUDA runtime call anvil's code makes is
# interposed and counted (device_alloc_counter.h). CUDA only: the HIP build runs no GPU tests here.
if(ANVIL_GPU_BACKEND STREQUAL "cuda")
  target_sources(gpu_worker_test PRIVATE gpu_worker/device_alloc_counter.cpp)
  target_link_libraries(gpu_worker_test PRIVATE anvil_gpu_runtime)
  target_compile_definitions(gpu_worker_test PRIVATE ANVIL_COUNT_RUNTIME_ALLOCATIONS=1)
  foreach(fn cudaMalloc cudaMallocAsync cudaMallocManaged cudaMallocPitch cudaMalloc3D cudaMallocArray
             cudaMallocFromPoolAsync cudaMemPoolCreate cudaHostAlloc cudaMallocHost)
    target_link_options(gpu_worker_test PRIVATE "LINKER:--wrap=${fn}")
  endforeach()
endif()

# The shipped model on the GPU against PyTorch's goldens: the GPU half of the conformance check.
anvil_add_test(shipped_model_gpu_test LABELS "gpu;conformance"
  SOURCES gpu_worker/shipped_model_gpu_test.cpp
  LIBS anvil_engine anvil_gpu_worker anvil_model Boost::json
  TIMEOUT 600)
target_compile_definitions(shipped_model_gpu_test PRIVATE ANVIL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

# The GPU ranks' collectives (gpu_worker/communicator.h) on every device the runtime sees.
anvil_add_test(communicator_gpu_test LABELS "gpu"
  SOURCES gpu_worker/communicator_gpu_test.cpp
  LIBS anvil_gpu_worker anvil_gpu_runtime)

# Tensor parallelism on the GPU: one rank through the whole path against the plain worker; the
# split over the machine's GPUs against one GPU (skips below two).
anvil_add_test(tensor_parallel_gpu_test LABELS "gpu"
  SOURCES gpu_worker/tensor_parallel_gpu_test.cpp
  LIBS anvil_engine anvil_gpu_worker anvil_model anvil_gpu_runtime
  TIMEOUT 600)
