// The error a std::future from `use_future` carries (empty when it holds a value).
#pragma once

#include <boost/system/system_error.hpp>

#include "actors/error.h"

namespace anvil::test_support {

template <class F>
error_code error_of(F&& future) {
  try {
    future.get();
  } catch (const boost::system::system_error& e) {
    return e.code();
  }
  return {};
}

}  // namespace anvil::test_support
