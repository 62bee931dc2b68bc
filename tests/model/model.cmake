anvil_add_test(gguf_test LABELS gguf SOURCES model/gguf_test.cpp LIBS anvil_model)
anvil_add_test(llm_test LABELS model SOURCES model/llm_test.cpp LIBS anvil_model)
anvil_add_test(reference_test LABELS "model;conformance" SOURCES model/reference_test.cpp LIBS anvil_model Boost::json)
target_compile_definitions(reference_test PRIVATE ANVIL_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")
add_test(NAME gguf.hf_reader_agrees_with_synth_files
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/model/check_with_hf_reader.sh $<TARGET_FILE:anvil> ${PROJECT_SOURCE_DIR})
set_tests_properties(gguf.hf_reader_agrees_with_synth_files PROPERTIES LABELS gguf TIMEOUT 300)
anvil_add_test(perplexity_test LABELS model SOURCES model/perplexity_test.cpp LIBS anvil_model)
anvil_add_test(default_model_test LABELS model SOURCES model/default_model_test.cpp LIBS anvil_model)
# The shipped model (models/anvil-kjv-q8_0.gguf) against its PyTorch goldens; skips while the
# model file is absent.
anvil_add_test(shipped_model_test LABELS "model;conformance" SOURCES model/shipped_model_test.cpp
               LIBS anvil_model Boost::json TIMEOUT 900)
target_compile_definitions(shipped_model_test PRIVATE ANVIL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
