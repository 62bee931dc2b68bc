# anvil_model: GGUF reader/writer, architectures, the CPU reference forward pass.
add_library(anvil_model STATIC
  ${CMAKE_CURRENT_SOURCE_DIR}/cpu_forward.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/gguf_metadata.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/gguf_reader.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/gguf_tokenizer.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/gguf_writer.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/llm.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/default_model.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/perplexity.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/synth.cpp)
target_include_directories(anvil_model PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(anvil_model PUBLIC anvil_quant anvil_tokenizer anvil_kernels_cpu PRIVATE OpenMP::OpenMP_CXX)
anvil_target_defaults(anvil_model)
