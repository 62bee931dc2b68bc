// One scratch folder per test process, removed with everything in it when the process exits.
// Every file a test writes (fixture models, datasets, result files) goes here: ctest starts one
// process per test, and a folder left behind by each filled the disk of a CI machine.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace anvil::testing {

inline const std::filesystem::path& scratch_dir() {
  struct folder {
    std::filesystem::path path;
    pid_t owner;
    folder()
        : path(std::filesystem::temp_directory_path() / ("anvil_test_" + std::to_string(::getpid()))),
          owner(::getpid()) {
      std::filesystem::remove_all(path);  // a folder of a dead process whose pid came round again
      std::filesystem::create_directories(path);
    }
    // A forked child that exits normally must not take its parent's files away.
    ~folder() {
      if (::getpid() != owner) return;
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  // Built on first use, so it outlives every static object (an engine, a mapped model) built from
  // its files afterwards; removing a mapped file leaves the mapping valid.
  static const folder f;
  return f.path;
}

// `name` inside the scratch folder.
inline std::string scratch_path(const std::string& name) { return (scratch_dir() / name).string(); }

}  // namespace anvil::testing
