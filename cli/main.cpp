// The `anvil` command. Subcommands are added as the runtime grows; `anvil info` reports what this
// build is and which devices it can use.
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "actors/log.h"
#include "cli/build_info.h"
#include "gpu_worker/device_query.h"

namespace {

std::string gib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", double(bytes) / double(1ull << 30));
  return buf;
}

int run_info() {
  namespace bi = anvil::build_info;
  std::printf("anvil %s (%s)\n", bi::version, bi::git_revision);
  std::printf("  build:       %s, %s\n", bi::build_type, bi::cxx_compiler);
  if (*bi::sanitizers) std::printf("  sanitizers:  %s\n", bi::sanitizers);
  if (std::string(bi::gpu_backend) == "none") {
    std::printf("  gpu backend: none (CPU only)\n");
  } else {
    std::printf("  gpu backend: %s, targets %s, %s\n", bi::gpu_backend, bi::gpu_targets, bi::gpu_compiler);
  }

  const anvil::gpu_worker::device_report r = anvil::gpu_worker::query_devices();
  if (!r.runtime_version.empty()) {
    std::printf("  runtime:     %s %s, driver %s\n", r.backend.c_str(), r.runtime_version.c_str(),
                r.driver_version.empty() ? "none" : r.driver_version.c_str());
  }
  if (r.devices.empty()) std::printf("  devices:     none: %s\n", r.error.c_str());
  for (const auto& d : r.devices) {
    std::printf("  device %d:    %s (%s), %d multiprocessors, %s total, %s free\n", d.index, d.name.c_str(),
                d.arch.c_str(), d.multiprocessors, gib(d.total_bytes).c_str(), gib(d.free_bytes).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"anvil: an LLM inference runtime for GGUF models"};
  app.set_version_flag("--version", std::string("anvil ") + anvil::build_info::version);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical or off");
  app.require_subcommand(0, 1);

  CLI::App* info = app.add_subcommand("info", "print the build configuration and the devices found");

  CLI11_PARSE(app, argc, argv);
  if (!anvil::log::set_level(log_level)) {
    std::fprintf(stderr, "anvil: unknown --log-level '%s'\n", log_level.c_str());
    return 2;
  }
  try {
    if (app.got_subcommand(info) || app.get_subcommands().empty()) return run_info();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "anvil: %s\n", e.what());
    return 1;
  }
  return 0;
}
