# Install rules: `cmake --install build --prefix P` puts
#   P/bin/anvil, P/bin/anvil-bench                       (component runtime)
#   P/share/anvil/models/anvil-kjv-q8_0.gguf             (runtime; `anvil` finds it from P/bin)
#   P/lib/systemd/system/anvil.service                   (runtime; packaging/anvil.service)
#   P/lib/libanvil_*.a, P/include/anvil/<folder>/*.h     (component dev: the in-process API)
#   P/lib/cmake/anvil/anvilConfig.cmake, ...             (dev: find_package(anvil), anvil::engine)
# The library is every static library anvil_engine links, found by walking its link graph, so a
# new dependency of the engine is installed without a list to keep up to date. Each is exported
# as anvil::<name without anvil_> (anvil::engine, anvil::model, ...). Included once every folder
# has defined its targets.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ANVIL_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/anvil)   # keeps the tree's paths: "engine/engine.h"
set(ANVIL_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/anvil)

# The anvil targets `target` links, directly or not, private links included (a static library
# needs its private dependencies at the consumer's link). Imported targets (Boost, spdlog, ...)
# and generator expressions are left to the package config's find_dependency calls.
function(anvil_link_closure target out_var)
  set(seen ${target})
  set(todo ${target})
  while(todo)
    list(POP_FRONT todo t)
    get_target_property(deps ${t} LINK_LIBRARIES)
    get_target_property(ideps ${t} INTERFACE_LINK_LIBRARIES)
    foreach(d IN LISTS deps ideps)
      if(d MATCHES "^\\$<" OR NOT TARGET "${d}" OR d IN_LIST seen)
        continue()
      endif()
      get_target_property(imported ${d} IMPORTED)
      if(NOT imported)
        list(APPEND seen ${d})
        list(APPEND todo ${d})
      endif()
    endforeach()
  endwhile()
  set(${out_var} ${seen} PARENT_SCOPE)
endfunction()

anvil_link_closure(anvil_engine ANVIL_LIBRARY_TARGETS)

# The folders set `target_include_directories(X PUBLIC ${PROJECT_SOURCE_DIR})`; an exported
# target may not name the source tree, so that entry becomes build-only here and the installed
# targets get P/include/anvil instead (one place, rather than a generator expression per folder).
set(_anvil_header_dirs)
foreach(t IN LISTS ANVIL_LIBRARY_TARGETS)
  get_target_property(incs ${t} INTERFACE_INCLUDE_DIRECTORIES)
  if(incs)
    list(TRANSFORM incs REPLACE "^${PROJECT_SOURCE_DIR}$" "$<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>")
    set_target_properties(${t} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${incs}")
  endif()
  string(REGEX REPLACE "^anvil_" "" export_name ${t})
  set_target_properties(${t} PROPERTIES EXPORT_NAME ${export_name})
  # Every target defined in a folder of its own (the static libraries, anvil_messages); not those
  # of the top-level CMakeLists (anvil_defaults, the GPU runtime's interface targets).
  get_target_property(dir ${t} SOURCE_DIR)
  if(NOT dir STREQUAL PROJECT_SOURCE_DIR)
    list(APPEND _anvil_header_dirs ${dir})
  endif()
endforeach()
list(REMOVE_DUPLICATES _anvil_header_dirs)

install(TARGETS ${ANVIL_LIBRARY_TARGETS} EXPORT anvilTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  INCLUDES DESTINATION ${ANVIL_INSTALL_INCLUDEDIR})

# `cmake --install --strip` and the Debian packages strip the programs; the static libraries lose
# their debug info only (their symbols are what a user links against).
foreach(t IN LISTS ANVIL_LIBRARY_TARGETS)
  get_target_property(type ${t} TYPE)
  if(type STREQUAL "STATIC_LIBRARY" AND CMAKE_STRIP)
    install(CODE "if(CMAKE_INSTALL_DO_STRIP)
  execute_process(COMMAND \"${CMAKE_STRIP}\" --strip-debug
    \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/$<TARGET_FILE_NAME:${t}>\")
endif()" COMPONENT dev)
  endif()
endforeach()

# The headers of every folder the library comes from, at the same relative paths as in the tree.
foreach(dir IN LISTS _anvil_header_dirs)
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${dir})
  install(DIRECTORY ${dir}/ DESTINATION ${ANVIL_INSTALL_INCLUDEDIR}/${rel} COMPONENT dev
    FILES_MATCHING PATTERN "*.h" PATTERN "bench" EXCLUDE)
endforeach()

install(EXPORT anvilTargets NAMESPACE anvil:: DESTINATION ${ANVIL_INSTALL_CMAKEDIR} COMPONENT dev)

# What the package config must find before it loads the targets: the GPU runtime's, if any.
set(ANVIL_CONFIG_GPU_DEPENDENCIES "")
if(ANVIL_GPU_BACKEND STREQUAL "cuda")
  set(ANVIL_CONFIG_GPU_DEPENDENCIES "find_dependency(CUDAToolkit)")
endif()
set(ANVIL_SHIPPED_MODEL ${CMAKE_INSTALL_DATADIR}/anvil/models/anvil-kjv-q8_0.gguf)   # anvil_SHIPPED_MODEL for users
configure_package_config_file(${PROJECT_SOURCE_DIR}/packaging/anvilConfig.cmake.in
  ${PROJECT_BINARY_DIR}/packaging/anvilConfig.cmake
  INSTALL_DESTINATION ${ANVIL_INSTALL_CMAKEDIR} PATH_VARS ANVIL_SHIPPED_MODEL)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/packaging/anvilConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)   # 0.x: a minor version may break the API
install(FILES ${PROJECT_BINARY_DIR}/packaging/anvilConfig.cmake ${PROJECT_BINARY_DIR}/packaging/anvilConfigVersion.cmake
  DESTINATION ${ANVIL_INSTALL_CMAKEDIR} COMPONENT dev)

# The programs, the shipped model where an installed `anvil` looks for it
# (model/arch/default_model.cpp: <prefix>/share/anvil/models/), and the systemd unit.
install(TARGETS anvil anvil-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(FILES ${PROJECT_SOURCE_DIR}/models/anvil-kjv-q8_0.gguf DESTINATION ${CMAKE_INSTALL_DATADIR}/anvil/models
  COMPONENT runtime)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/anvil.service DESTINATION lib/systemd/system COMPONENT runtime)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/anvil.default DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples
  RENAME default-anvil COMPONENT runtime)
