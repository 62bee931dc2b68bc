// anvil's own error codes. Expected failures travel as values: `error_code` first in every
// completion signature (boost::system::error_code, so Asio's tokens understand them).
#pragma once

#include <type_traits>

#include <boost/system/error_code.hpp>

namespace anvil {

using error_code = boost::system::error_code;

enum class errc {
  busy = 1,          // the actor's mailbox is full: try again later (maps to 429/503 at the edges)
  stopped,           // the actor is stopping or stopped and takes no new work
  dropped,           // the actor dropped a request without answering it (a bug, but never a hang)
  invalid_argument,  // a request or plan that breaks the contract (out-of-range ids, bad parameters)
  overloaded,        // the waiting queue is full: try again later
  context_overflow,  // the prompt (plus the tokens asked for) does not fit the context
  cancelled,         // the caller cancelled the request
  device_fault,      // the worker failed executing a step; the engine is unhealthy
};

const boost::system::error_category& anvil_category() noexcept;

inline error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), anvil_category()}; }

}  // namespace anvil

template <>
struct boost::system::is_error_code_enum<anvil::errc> : std::true_type {};
