# gpu_roofline: bench/gpu_roofline.cpp against anvil_kernels_gpu (see bench/CMakeLists.txt).
add_executable(gpu_roofline gpu_roofline.cpp)
target_link_libraries(gpu_roofline PRIVATE anvil_kernels_gpu anvil_quant)
anvil_target_defaults(gpu_roofline)
