// How engine errors look on the wire: the line protocol's error codes and the HTTP statuses
// (PROTOCOL.md and the OpenAI error shape), and the API-key comparison both servers use.
#pragma once

#include <string_view>

#include "actors/error.h"

namespace anvil::proto {

// "invalid_request", "context_overflow", "overloaded", "stopped", "cancelled" or "internal".
std::string_view code_name(const error_code& ec);

// 400 for bad requests, 429 when the queue is full, 503 when stopping, 500 otherwise.
unsigned http_status(const error_code& ec);

// Compares without an early exit, so the time taken does not tell how much of a key matched.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace anvil::proto
