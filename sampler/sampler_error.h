// The sampler's expected failures, as error codes (category "anvil.sampler"). They come back per
// entry of a batch, so one bad entry never fails the others.
#pragma once

#include <type_traits>

#include <boost/system/error_code.hpp>

namespace anvil::sampler {

using error_code = boost::system::error_code;

enum class sampler_errc {
  unknown_request = 1,  // no request with this id is open (never opened, or already closed)
  already_open,         // open() for an id that is open: the first state is kept
  invalid_params,       // sampling parameters outside their ranges (validate() says which)
  invalid_candidates,   // a seq_output that breaks the step contract, or n_logprobs outside [0, 20]
};

const boost::system::error_category& sampler_category() noexcept;

inline error_code make_error_code(sampler_errc e) noexcept { return {static_cast<int>(e), sampler_category()}; }

}  // namespace anvil::sampler

template <>
struct boost::system::is_error_code_enum<anvil::sampler::sampler_errc> : std::true_type {};
