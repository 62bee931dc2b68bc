# CPack: Debian packages from the install rules (cmake/anvil_install.cmake).
#   cd build && cpack -G DEB      (or: cmake --build build --target package)
# gives two packages, as Debian splits a library:
#   anvil      the programs, the shipped model and the systemd unit (component runtime)
#   anvil-dev  the static libraries, headers and CMake package of the in-process API (component dev)
# The runtime dependencies are the Debian 12 packages `ldd build/anvil` resolves to (`dpkg -S`);
# listed here rather than found by dpkg-shlibdeps, so that packaging needs no dpkg-dev.

set(CPACK_PACKAGE_NAME anvil)
set(CPACK_PACKAGE_VENDOR "anvil")
set(CPACK_PACKAGE_CONTACT "anvil maintainers <anvil@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "anvil LLM inference server: GGUF models, continuous batching, OpenAI API")
set(CPACK_PACKAGE_DESCRIPTION
  "anvil loads GGUF models (Llama 3, Qwen2.5, Qwen3) and serves many clients at once with a paged \
KV cache and continuous batching, over an OpenAI-compatible HTTP API and a TCP line protocol. It \
ships a small model, so `anvil generate -p TEXT` works at once, and a systemd unit for `anvil serve`.")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)                       # the build's debug info stays in the build
set(CPACK_GENERATOR DEB)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)         # anvil_0.1.0_amd64.deb, anvil-dev_0.1.0_amd64.deb
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)         # fast to build on CI's two cores

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME anvil)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION net)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS
  "libc6 (>= 2.34), libstdc++6 (>= 12), libgcc-s1, libgomp1 (>= 12), libspdlog1.10, libfmt9, libboost-json1.81.0, libpcre2-8-0 (>= 10.42)")
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION "${CPACK_PACKAGE_DESCRIPTION}")
# Maintainer scripts: systemd reloads the unit on install, upgrade and removal; no auto-enable.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA
  ${PROJECT_SOURCE_DIR}/packaging/postinst ${PROJECT_SOURCE_DIR}/packaging/prerm ${PROJECT_SOURCE_DIR}/packaging/postrm)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME anvil-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# The package config (packaging/anvilConfig.cmake.in) finds these: the static libraries need them.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
  "anvil (= ${PROJECT_VERSION}), libboost1.81-dev, libboost-json1.81-dev, libspdlog-dev, libpcre2-dev, pkg-config")
# CPack puts the summary above each package's description: the dev one says what it holds.
set(CPACK_DEBIAN_DEV_DESCRIPTION "This package holds the in-process C++ API: the static libraries, headers and CMake \
package. find_package(anvil) and target_link_libraries(app PRIVATE anvil::engine) run the engine \
that `anvil serve` runs inside your own program.")

include(CPack)
cpack_add_component(runtime DISPLAY_NAME "anvil")
cpack_add_component(dev DISPLAY_NAME "anvil-dev" DEPENDS runtime)
