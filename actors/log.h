// Named loggers (spdlog): one per actor or subsystem — "sched", "kv", "gpu", "proto", ... — all
// writing to one shared stderr sink, so one level and one pattern apply to the whole process.
// Per-step detail goes at debug; never per-token at info. Tag lines with req= and step=.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <spdlog/fwd.h>

namespace anvil::log {

// The logger called `name`, created on first use. Thread-safe.
std::shared_ptr<spdlog::logger> get(const std::string& name);

// Sets the level of every anvil logger, present and future: trace, debug, info, warn, error,
// critical or off. Returns false (and changes nothing) for an unknown name.
bool set_level(std::string_view level);

}  // namespace anvil::log
