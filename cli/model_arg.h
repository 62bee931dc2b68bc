// The model a command runs: the -m it was given, else the shipped model (model/arch/default_model.h),
// announced on one log line so it is never a surprise which file answered.
#pragma once

#include <string>

#include <spdlog/spdlog.h>

#include "actors/log.h"
#include "model/arch/default_model.h"

namespace anvil::cli {

inline std::string model_path_or_default(const std::string& given) {
  if (!given.empty()) return given;
  const std::string path = model::default_model_path().string();
  log::get("cli")->info("using the shipped model {} (no -m given)", path);
  return path;
}

}  // namespace anvil::cli
