# Compiler warnings and sanitizers, applied to every anvil target through anvil_target_defaults().

add_library(anvil_defaults INTERFACE)
target_compile_options(anvil_defaults INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow>)
if(ANVIL_WERROR)
  target_compile_options(anvil_defaults INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
# The default build (RelWithDebInfo) keeps line tables and function names (-g1: backtraces,
# profiles and sanitizer reports read the same) but not full debug info, which cost a quarter of
# the compile time of the Asio-heavy files. Configure with -DCMAKE_BUILD_TYPE=Debug for a debugger.
target_compile_options(anvil_defaults INTERFACE $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:RelWithDebInfo>>:-g1>)
# Asio: no deprecated interfaces; Boost.System header-only error categories.
target_compile_definitions(anvil_defaults INTERFACE BOOST_ASIO_NO_DEPRECATED)

# -DANVIL_FUZZ=ON (tests/fuzz/README.md): every target gets the coverage instrumentation libFuzzer
# steers by, and ASan+UBSan unless other sanitizers are asked for.
if(ANVIL_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "ANVIL_FUZZ needs clang for libFuzzer: configure with -DCMAKE_CXX_COMPILER=clang++")
  endif()
  if(NOT ANVIL_SANITIZE)
    set(ANVIL_SANITIZE address,undefined)
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
endif()

if(ANVIL_SANITIZE)
  string(REPLACE "," ";" _san_list "${ANVIL_SANITIZE}")
  foreach(_s IN LISTS _san_list)
    if(NOT _s MATCHES "^(address|undefined|thread|leak)$")
      message(FATAL_ERROR "ANVIL_SANITIZE: unknown sanitizer '${_s}'")
    endif()
  endforeach()
  set(_san_flags -fsanitize=${ANVIL_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang" AND ANVIL_SANITIZE MATCHES "undefined")
    # clang 14's `function` check (which GCC has not) cannot compile coroutines: "Cannot represent
    # a difference across sections" for every co_await in a TU.
    list(APPEND _san_flags -fno-sanitize=function)
  endif()
  # Sanitized Debug builds stay at -O0 (asserts on): at -O1 the Asio- and Beast-heavy files took
  # 2.6x as long to compile (bench/load/http_client.cpp 29 s -> 75 s), and CI's ASan build took
  # ~1,060 s instead of 739. The libraries of plain computation the suites drive hard get -O1
  # (anvil_plain_core below), the numeric loops -O2 (anvil_numeric_loops).
  # Line tables are all a sanitizer report needs, and build much faster than full debug info.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    set(_san_debug -gline-tables-only)
  else()
    set(_san_debug -g1)
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:${_san_debug}>)
  # Sanitizers apply to host C++ only; device code is compiled by nvcc/hipcc untouched.
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${_san_flags}>")
  add_link_options(${_san_flags})
endif()

# anvil_numeric_loops(target [SOURCES file...]): the numeric inner loops (the CPU reference
# kernels, the quant row kernels, the synthetic weight generator) in a sanitized or fuzz build:
#   - no libFuzzer coverage: it steers nothing there;
#   - -O2 instead of Debug's -O0, and without the three UBSan checks (alignment, pointer-overflow,
#     bounds) that keep the compiler from vectorising a loop. ASan and the rest of UBSan stay on;
#   - no TSan instrumentation (see below).
# The model suites run the reference forward pass over and over: with the loops scalar and every
# element checked they took ~20x their optimised time under ASan (a mixture-of-experts engine test
# 33 s on one thread, 11 s with this, 1.5 s optimised), which was most of CI's sanitizer step.
# With SOURCES, only those files of the target get the flags.
function(anvil_numeric_loops target)
  cmake_parse_arguments(ARG "" "" "SOURCES" ${ARGN})
  set(_opts "")
  if(ANVIL_FUZZ)
    list(APPEND _opts -fno-sanitize=fuzzer-no-link)
  endif()
  if(ANVIL_SANITIZE)
    list(APPEND _opts $<$<CONFIG:Debug>:-O2>)
    if(ANVIL_SANITIZE MATCHES "undefined")
      list(APPEND _opts -fno-sanitize=alignment,pointer-overflow,bounds)
    endif()
    # Under TSan, no instrumentation at all: these loops run on the worker's thread over buffers
    # only it touches, and a call per load and store made the fault and server suites' model runs
    # 5-10x slower (their TSan steps 386 s -> 125 s). TSan still sees every access of the code
    # that hands those buffers between threads.
    if(ANVIL_SANITIZE MATCHES "thread")
      list(APPEND _opts -fno-sanitize=thread)
    endif()
  endif()
  if(NOT _opts)
    return()
  endif()
  if(ARG_SOURCES)
    set_property(SOURCE ${ARG_SOURCES} TARGET_DIRECTORY ${target} APPEND PROPERTY COMPILE_OPTIONS
                 "$<$<COMPILE_LANGUAGE:CXX>:${_opts}>")
  else()
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${_opts}>")
  endif()
endfunction()

# anvil_plain_core(target): a library of plain computation (no Asio, no Beast) that the suites run
# over and over — the tokenizer, the Jinja interpreter, structured output's automata, the sampler,
# the GGUF reader and CPU forward pass, the KV and scheduler cores. In a sanitized Debug build it
# gets -O1, everything else -O0. At -O0 throughout, the ASan suites took 743 s instead of 412 at
# -O1 throughout (a Jinja error sweep 29 s -> 120 s, a thousand random JSON schemas 83 s -> 203 s);
# with these at -O1, 548 s.
function(anvil_plain_core target)
  if(ANVIL_SANITIZE)
    target_compile_options(${target} PRIVATE $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:Debug>>:-O1>)
  endif()
endfunction()

# Build-only: the installed libraries (cmake/anvil_install.cmake) impose no flags on their users.
function(anvil_target_defaults target)
  target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:anvil_defaults>)
endfunction()
