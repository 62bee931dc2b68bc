# anvil_quant: the GGML quant formats (model/quant.h). Standard library only; the other model/
# parts and the CPU backend link it. The row kernels are written as fixed-count loops that GCC
# auto-vectorises at -O2 (no intrinsics, so the library builds for any host).
add_library(anvil_quant STATIC
  ${CMAKE_CURRENT_SOURCE_DIR}/quant.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/quant_legacy.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/quant_k.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/quant_k_quantize.cpp)
target_include_directories(anvil_quant PUBLIC ${PROJECT_SOURCE_DIR})
anvil_target_defaults(anvil_quant)
