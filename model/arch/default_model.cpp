#include "model/arch/default_model.h"

#include <cstdlib>
#include <system_error>

#include "model/model_error.h"

namespace anvil::model {
namespace fs = std::filesystem;

const std::vector<std::string>& default_model_names() {
  static const std::vector<std::string> names = {"anvil-kjv-q8_0.gguf", "anvil-kjv-f16.gguf"};
  return names;
}

std::vector<fs::path> default_model_candidates(const fs::path& exe_dir) {
  std::vector<fs::path> dirs;
  fs::path d = exe_dir;
  for (int up = 0; up < 3 && !d.empty(); ++up, d = d.parent_path()) {
    dirs.push_back(d / "models");
    if (d == d.parent_path()) break;  // the root
  }
  if (exe_dir.has_parent_path()) dirs.push_back(exe_dir.parent_path() / "share" / "anvil" / "models");
  std::vector<fs::path> out;
  for (const fs::path& dir : dirs) {
    for (const std::string& name : default_model_names()) out.push_back((dir / name).lexically_normal());
  }
  return out;
}

fs::path find_default_model(const fs::path& exe_dir, const char* env_model) {
  std::error_code ec;
  if (env_model != nullptr && *env_model != '\0') {
    if (!fs::is_regular_file(env_model, ec)) {
      throw model_error("ANVIL_MODEL is '" + std::string(env_model) + "', which is not a file");
    }
    return env_model;
  }
  const std::vector<fs::path> candidates = default_model_candidates(exe_dir);
  for (const fs::path& p : candidates) {
    if (fs::is_regular_file(p, ec)) return p;
  }
  std::string dirs;
  for (std::size_t i = 0; i < candidates.size(); i += default_model_names().size()) {
    dirs += (dirs.empty() ? "" : ", ") + candidates[i].parent_path().string();
  }
  throw model_error("no model given, and the shipped model (" + default_model_names().front() + ") is in none of " + dirs +
                    ": pass -m FILE, or set ANVIL_MODEL");
}

fs::path default_model_path() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return find_default_model(ec ? fs::current_path() : exe.parent_path(), std::getenv("ANVIL_MODEL"));
}

}  // namespace anvil::model
