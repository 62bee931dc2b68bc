#include "sampler/sampler_error.h"

#include <string>

namespace anvil::sampler {
namespace {

class category final : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "anvil.sampler"; }
  std::string message(int ev) const override {
    switch (static_cast<sampler_errc>(ev)) {
      case sampler_errc::unknown_request: return "unknown request: no sampler state is open for this id";
      case sampler_errc::already_open: return "already open: the sampler already holds state for this id";
      case sampler_errc::invalid_params: return "invalid sampling parameters";
      case sampler_errc::invalid_candidates: return "invalid candidates: the model's output for this request is unusable (a NaN or infinite logit, or a broken step contract)";
    }
    return "unknown sampler error " + std::to_string(ev);
  }
};

}  // namespace

const boost::system::error_category& sampler_category() noexcept {
  static const category c;
  return c;
}

}  // namespace anvil::sampler
