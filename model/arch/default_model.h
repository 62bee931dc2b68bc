// The model anvil ships (tools/train/: a small Llama trained on the King James Bible and
// fortunes), found when a command is given no -m. Where it is looked for, in order:
//   1. $ANVIL_MODEL, if set and not empty (then only there: a missing file is an error);
//   2. models/<name> in the executable's directory and its two parents (build/anvil finds
//      <repo>/models/ from a build tree, build/sub/x too);
//   3. share/anvil/models/<name> under the executable's parent (an install: <prefix>/bin/anvil).
// <name> is each of default_model_names() in turn at each place: Q8_0 first, then F16.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace anvil::model {

// File names of the shipped model, preferred first.
const std::vector<std::string>& default_model_names();

// Every path looked at, in order, for an executable in `exe_dir` (no $ANVIL_MODEL).
std::vector<std::filesystem::path> default_model_candidates(const std::filesystem::path& exe_dir);

// The first existing candidate; `env_model` is $ANVIL_MODEL's value (nullptr or "" when unset).
// Throws model_error when nothing is found ("... pass -m FILE") or $ANVIL_MODEL names no file.
std::filesystem::path find_default_model(const std::filesystem::path& exe_dir, const char* env_model);

// find_default_model for this process: the directory of /proc/self/exe and getenv("ANVIL_MODEL").
std::filesystem::path default_model_path();

}  // namespace anvil::model
