#include "actors/log.h"

#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace anvil::log {
namespace {

struct registry {
  std::mutex mu;  // guards creation only; spdlog loggers are thread-safe once made
  spdlog::sink_ptr sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  spdlog::level::level_enum level = spdlog::level::info;
};

registry& reg() {
  static registry r;
  return r;
}

}  // namespace

std::shared_ptr<spdlog::logger> get(const std::string& name) {
  registry& r = reg();
  std::lock_guard lock(r.mu);
  if (auto existing = spdlog::get(name)) return existing;
  auto logger = std::make_shared<spdlog::logger>(name, r.sink);
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%-5l%$ [%n] %v");
  logger->set_level(r.level);
  spdlog::register_logger(logger);
  return logger;
}

bool set_level(std::string_view level) {
  const auto lvl = spdlog::level::from_str(std::string(level));
  // from_str answers "off" for names it does not know; tell that apart from a real "off".
  if (lvl == spdlog::level::off && level != "off") return false;
  registry& r = reg();
  std::lock_guard lock(r.mu);
  r.level = lvl;
  spdlog::apply_all([lvl](const std::shared_ptr<spdlog::logger>& l) { l->set_level(lvl); });
  return true;
}

}  // namespace anvil::log
