# tests/fuzz/ (label fuzz): the hostile-GGUF suite and the fuzz targets (README.md there).
# Normal builds: each target links replay_main.cpp and ctest runs it on its seed corpus plus
# mutations. With -DANVIL_FUZZ=ON (clang): libFuzzer binaries, built by the anvil_fuzz target and
# run by run_libfuzzer.sh; the rest of the tests are built beside them, in the same sanitizer build.
set(ANVIL_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})

add_library(anvil_fuzz_support STATIC
  ${ANVIL_FUZZ_DIR}/gguf_image.cpp
  ${ANVIL_FUZZ_DIR}/load_model.cpp)
target_include_directories(anvil_fuzz_support PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(anvil_fuzz_support PUBLIC anvil_model anvil_chat)
anvil_target_defaults(anvil_fuzz_support)

add_library(anvil_fuzz_sessions STATIC ${ANVIL_FUZZ_DIR}/session_driver.cpp)
target_link_libraries(anvil_fuzz_sessions PUBLIC anvil_fuzz_support anvil_proto)
anvil_target_defaults(anvil_fuzz_sessions)

if(ANVIL_FUZZ)
  add_custom_target(anvil_fuzz)
endif()

# anvil_add_fuzz_target(NAME SOURCES ... LIBS ... [MUTATIONS n]): the corpus is corpus/<NAME minus fuzz_>/.
function(anvil_add_fuzz_target name)
  cmake_parse_arguments(ARG "" "MUTATIONS" "SOURCES;LIBS" ${ARGN})
  if(NOT ARG_MUTATIONS)
    set(ARG_MUTATIONS 2000)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS})
  target_compile_definitions(${name} PRIVATE ANVIL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  anvil_target_defaults(${name})
  if(ANVIL_FUZZ)
    target_link_options(${name} PRIVATE -fsanitize=fuzzer)
    add_dependencies(anvil_fuzz ${name})
  else()
    target_sources(${name} PRIVATE ${ANVIL_FUZZ_DIR}/replay_main.cpp)
    string(REGEX REPLACE "^fuzz_" "" corpus ${name})
    add_test(NAME fuzz.${name} COMMAND ${name} --mutations ${ARG_MUTATIONS} ${ANVIL_FUZZ_DIR}/corpus/${corpus})
    set_tests_properties(fuzz.${name} PROPERTIES LABELS fuzz TIMEOUT 300 ENVIRONMENT "${ANVIL_TEST_ENV}")
  endif()
endfunction()

anvil_add_fuzz_target(fuzz_gguf SOURCES ${ANVIL_FUZZ_DIR}/fuzz_gguf.cpp LIBS anvil_fuzz_support)
anvil_add_fuzz_target(fuzz_tokenizer SOURCES ${ANVIL_FUZZ_DIR}/fuzz_tokenizer.cpp LIBS anvil_fuzz_support)
anvil_add_fuzz_target(fuzz_request_json SOURCES ${ANVIL_FUZZ_DIR}/fuzz_request_json.cpp LIBS anvil_proto)
anvil_add_fuzz_target(fuzz_chat_template SOURCES ${ANVIL_FUZZ_DIR}/fuzz_chat_template.cpp LIBS anvil_chat
                      MUTATIONS 1000)
anvil_add_fuzz_target(fuzz_structured SOURCES ${ANVIL_FUZZ_DIR}/fuzz_structured.cpp LIBS anvil_structured)
anvil_add_fuzz_target(fuzz_line_session SOURCES ${ANVIL_FUZZ_DIR}/fuzz_line_session.cpp LIBS anvil_fuzz_sessions
                      MUTATIONS 500)
anvil_add_fuzz_target(fuzz_http_session SOURCES ${ANVIL_FUZZ_DIR}/fuzz_http_session.cpp LIBS anvil_fuzz_sessions
                      MUTATIONS 500)

# Counting operator new/delete (alloc_counter.cpp) replace the global ones in this executable only.
anvil_add_test(hostile_gguf_test LABELS fuzz
  SOURCES fuzz/hostile_gguf_test.cpp fuzz/alloc_counter.cpp
  LIBS anvil_fuzz_support anvil_engine)
target_compile_definitions(hostile_gguf_test PRIVATE ANVIL_FUZZ_CORPUS="${ANVIL_FUZZ_DIR}/corpus")
