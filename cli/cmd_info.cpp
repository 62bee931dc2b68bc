// `anvil info`: what this build is and which devices it can use.
#include <cstdio>
#include <string>

#include "cli/build_info.h"
#include "cli/commands.h"
#include "gpu_worker/device_query.h"

namespace anvil::cli {
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
  const gpu_worker::device_report r = gpu_worker::query_devices();
  if (!r.runtime_version.empty()) {
    std::printf("  runtime:     %s %s, driver %s\n", r.backend.c_str(), r.runtime_version.c_str(),
                r.driver_version.empty() ? "none" : r.driver_version.c_str());
  }
  if (!r.collectives.empty()) std::printf("  collectives: %s (--tensor-parallel)\n", r.collectives.c_str());
  if (r.devices.empty()) std::printf("  devices:     none: %s\n", r.error.c_str());
  for (const auto& d : r.devices) {
    std::printf("  device %d:    %s (%s), %d multiprocessors, %s total, %s free\n", d.index, d.name.c_str(),
                d.arch.c_str(), d.multiprocessors, gib(d.total_bytes).c_str(), gib(d.free_bytes).c_str());
  }
  return 0;
}

}  // namespace

void add_info_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("info", "print the build configuration and the devices found");
  cmd->callback([&exit_code] { exit_code = run_info(); });
}

}  // namespace anvil::cli
