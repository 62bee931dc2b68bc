#include "actors/error.h"

#include <string>

namespace anvil {
namespace {

class category final : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "anvil"; }
  std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
      case errc::busy: return "busy: the mailbox is full, try again later";
      case errc::stopped: return "stopped: no new work is accepted";
      case errc::dropped: return "dropped: the request was abandoned without an answer";
      case errc::invalid_argument: return "invalid argument";
      case errc::overloaded: return "overloaded: too many requests are waiting, try again later";
      case errc::context_overflow: return "the prompt does not fit the context";
      case errc::cancelled: return "cancelled";
      case errc::device_fault: return "the device failed executing a step";
    }
    return "unknown anvil error " + std::to_string(ev);
  }
};

}  // namespace

const boost::system::error_category& anvil_category() noexcept {
  static const category c;
  return c;
}

}  // namespace anvil
