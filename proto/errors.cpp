#include "proto/errors.h"

namespace anvil::proto {

std::string_view code_name(const error_code& ec) {
  if (ec.category() == anvil_category()) {
    switch (static_cast<errc>(ec.value())) {
      case errc::invalid_argument: return "invalid_request";
      case errc::context_overflow: return "context_overflow";
      case errc::overloaded:
      case errc::busy: return "overloaded";
      case errc::stopped: return "stopped";
      case errc::cancelled: return "cancelled";
      case errc::dropped:
      case errc::device_fault: break;
    }
  }
  return "internal";
}

unsigned http_status(const error_code& ec) {
  const std::string_view code = code_name(ec);
  if (code == "invalid_request" || code == "context_overflow") return 400;
  if (code == "overloaded") return 429;
  if (code == "stopped") return 503;
  return 500;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (b.empty()) return false;
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % b.size()]);
  return diff == 0;
}

}  // namespace anvil::proto
