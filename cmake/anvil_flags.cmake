# Compiler warnings and sanitizers, applied to every anvil target through anvil_target_defaults().

add_library(anvil_defaults INTERFACE)
target_compile_options(anvil_defaults INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow>)
if(ANVIL_WERROR)
  target_compile_options(anvil_defaults INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
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
  # -O1 keeps sanitized Debug builds (asserts on) fast enough for the engine and model suites.
  # Line tables are all a sanitizer report needs, and build much faster than full debug info.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    set(_san_debug -gline-tables-only)
  else()
    set(_san_debug -g1)
  endif()
  add_compile_options($<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:Debug>>:-O1> $<$<COMPILE_LANGUAGE:CXX>:${_san_debug}>)
  # Sanitizers apply to host C++ only; device code is compiled by nvcc/hipcc untouched.
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${_san_flags}>")
  add_link_options(${_san_flags})
endif()

# anvil_without_fuzz_coverage(target): the numeric inner loops (the CPU reference kernels, the quant
# row kernels) get no libFuzzer coverage in a -DANVIL_FUZZ=ON build: it steers nothing there and
# made every test that runs the reference forward pass several times slower.
function(anvil_without_fuzz_coverage target)
  if(ANVIL_FUZZ)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize=fuzzer-no-link>)
  endif()
endfunction()

# Build-only: the installed libraries (cmake/anvil_install.cmake) impose no flags on their users.
function(anvil_target_defaults target)
  target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:anvil_defaults>)
endfunction()
