# GPU backend selection. Kernels are written once in HIP (kernels/*.hip):
#   cuda: nvcc compiles them as CUDA; kernels/gpu_runtime.h maps the hip* names to CUDA.
#   hip:  hipcc compiles them for AMD GPUs. CMake's HIP language does not work with Debian's ROCm
#         packaging, so each .hip file is compiled by a custom command and archived.
# Only gpu_worker/ and kernels/ (and their tests) may link `anvil_gpu_runtime` (DESIGN.md, the one rule).

set(ANVIL_CUDA_ARCHS "90a" CACHE STRING "CUDA architectures (CMAKE_CUDA_ARCHITECTURES syntax)")
set(ANVIL_HIP_ARCHS "gfx90a;gfx1030" CACHE STRING "AMD offload architectures for hipcc")

set(ANVIL_GPU_BACKEND none)
if(ANVIL_GPU STREQUAL "auto")
  find_program(_anvil_nvcc nvcc HINTS /usr/local/cuda/bin)
  find_program(_anvil_hipcc hipcc)
  if(_anvil_nvcc)
    set(ANVIL_GPU_BACKEND cuda)
  elseif(_anvil_hipcc)
    set(ANVIL_GPU_BACKEND hip)
  endif()
elseif(ANVIL_GPU STREQUAL "cuda" OR ANVIL_GPU STREQUAL "hip")
  set(ANVIL_GPU_BACKEND ${ANVIL_GPU})
elseif(NOT ANVIL_GPU STREQUAL "off")
  message(FATAL_ERROR "ANVIL_GPU must be off, cuda, hip or auto (got '${ANVIL_GPU}')")
endif()

if(ANVIL_GPU_BACKEND STREQUAL "cuda")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  set(CMAKE_CUDA_ARCHITECTURES ${ANVIL_CUDA_ARCHS})
  enable_language(CUDA)
  # CMake 3.25 does not know nvcc's C++20 flag (nvcc 12+ has it): tell it.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  add_library(anvil_gpu_runtime INTERFACE)
  target_link_libraries(anvil_gpu_runtime INTERFACE CUDA::cudart_static)
  target_compile_definitions(anvil_gpu_runtime INTERFACE ANVIL_GPU_CUDA=1)
  # cuBLAS for the prefill GEMM (kernels/blas_runtime.h). This toolkit ships no static cuBLAS, so
  # it is linked as a shared library; the GPU machine has the same CUDA 13.0 libraries under
  # /usr/local/cuda/lib64, which the build RPATH names (and tools/gpu/run-gpu-tests.sh adds to
  # LD_LIBRARY_PATH). Prefer the static archives when a toolkit has them.
  add_library(anvil_blas_runtime INTERFACE)
  if(TARGET CUDA::cublas_static AND TARGET CUDA::cublasLt_static AND EXISTS "${CUDAToolkit_LIBRARY_DIR}/libcublas_static.a")
    target_link_libraries(anvil_blas_runtime INTERFACE CUDA::cublas_static CUDA::cublasLt_static CUDA::culibos)
  else()
    target_link_libraries(anvil_blas_runtime INTERFACE CUDA::cublas CUDA::cublasLt)
  endif()

elseif(ANVIL_GPU_BACKEND STREQUAL "hip")
  find_program(ANVIL_HIPCC hipcc REQUIRED)
  find_library(ANVIL_AMDHIP64 amdhip64 REQUIRED)
  find_path(ANVIL_HIP_INCLUDE hip/hip_runtime_api.h REQUIRED)
  add_library(anvil_gpu_runtime INTERFACE)
  target_link_libraries(anvil_gpu_runtime INTERFACE ${ANVIL_AMDHIP64})
  target_include_directories(anvil_gpu_runtime SYSTEM INTERFACE ${ANVIL_HIP_INCLUDE})
  target_compile_definitions(anvil_gpu_runtime INTERFACE ANVIL_GPU_HIP=1 __HIP_PLATFORM_AMD__=1)
  add_library(anvil_blas_runtime INTERFACE)  # no hipBLAS on Debian: GEMM uses the tiled kernel
endif()

# anvil_add_gpu_library(NAME SOURCES a.hip ...): a static library of kernels for the chosen backend.
function(anvil_add_gpu_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES" ${ARGN})
  if(ANVIL_GPU_BACKEND STREQUAL "cuda")
    set_source_files_properties(${ARG_SOURCES} PROPERTIES LANGUAGE CUDA)
    add_library(${name} STATIC ${ARG_SOURCES})
    set_target_properties(${name} PROPERTIES CUDA_ARCHITECTURES "${ANVIL_CUDA_ARCHS}" POSITION_INDEPENDENT_CODE ON)
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
    if(ANVIL_GPU_COMPILE_CHECK)
      # Every stage still runs (front end, NVVM, ptxas with its resource checks), unoptimised:
      # attention_decode.hip 182 s -> 47 s on two cores.
      target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcicc=-O0 -Xptxas=-O0>)
    endif()
  elseif(ANVIL_GPU_BACKEND STREQUAL "hip")
    set(_objs)
    set(_arch_flags)
    set(_opt -O3)
    if(ANVIL_GPU_COMPILE_CHECK)
      # -O1 (gemv.hip 163 s -> 91 s on two cores): at -O0 the AMDGPU backend counts every kernel's
      # shared memory against each kernel of a file ("local memory (2563768) exceeds limit").
      set(_opt -O1)
    endif()
    foreach(_a IN LISTS ANVIL_HIP_ARCHS)
      list(APPEND _arch_flags --offload-arch=${_a})
    endforeach()
    foreach(_src IN LISTS ARG_SOURCES)
      get_filename_component(_abs ${_src} ABSOLUTE)
      get_filename_component(_stem ${_src} NAME_WE)
      set(_obj ${CMAKE_CURRENT_BINARY_DIR}/${name}.dir/${_stem}.o)
      add_custom_command(
        OUTPUT ${_obj}
        COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/${name}.dir
        COMMAND ${ANVIL_HIPCC} -std=c++20 ${_opt} -fPIC ${_arch_flags}
                -DANVIL_GPU_HIP=1 -I${PROJECT_SOURCE_DIR}
                -MD -MF ${_obj}.d -c ${_abs} -o ${_obj}
        DEPENDS ${_abs}
        DEPFILE ${_obj}.d
        COMMENT "hipcc ${_src}"
        VERBATIM)
      list(APPEND _objs ${_obj})
    endforeach()
    set_source_files_properties(${_objs} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
    add_library(${name} STATIC ${_objs})
    set_target_properties(${name} PROPERTIES LINKER_LANGUAGE CXX)
  else()
    message(FATAL_ERROR "anvil_add_gpu_library(${name}) called without a GPU backend")
  endif()
  target_link_libraries(${name} PUBLIC anvil_gpu_runtime)
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
endfunction()
