// Requests as JSON → generate_request: the fields the TCP line protocol and the OpenAI-compatible
// HTTP API share (PROTOCOL.md lists them), checked for type here; ranges are the engine's to check
// (engine::explain names the parameter). A field the dialect does not know is refused by name
// (a client must never believe a feature is on that anvil lacks); a known field of the wrong type
// is an error; a null field counts as absent.
#pragma once

#include <cstdint>
#include <string>

#include <boost/json/fwd.hpp>

#include "engine/engine.h"

namespace anvil::proto {

enum class dialect {
  line,         // TCP line protocol: prompt or messages, logprobs as a count, stream defaults to true
  completions,  // POST /v1/completions: prompt, logprobs as a count, stream defaults to false
  chat,         // POST /v1/chat/completions: messages, logprobs as a bool + top_logprobs
};

// One prompt of a completions request: text, or token ids when text is empty.
struct prompt_input {
  std::string text{};
  std::vector<std::int32_t> tokens{};
};

struct parsed_request {
  generate_request req;          // what the engine runs (with the first prompt)
  std::vector<prompt_input> prompts;  // completions: every prompt of the request (a list gives several); else
                                      // the one prompt, or none for messages
  bool stream = false;           // stream chunks as they come
  bool include_usage = false;    // HTTP: stream_options.include_usage
  bool want_logprobs = false;    // report log-probabilities (req.sampling.logprobs alternatives each)
  std::int64_t n = 1;            // HTTP: choices to generate (seeds seed, seed+1, ...)
  bool echo = false;             // completions: the prompt is repeated before the output
};

// The most choices one HTTP request may ask for (n), prompts one completions request may list
// (prompts x n at most 4 x max_choices), and stop strings one request may give.
inline constexpr std::int64_t max_choices = 16;
inline constexpr std::size_t max_prompts = 16;
inline constexpr std::size_t max_stop_strings = 16;

// Fills `out` from the request object `o`. Returns "" when every field has the right type, else
// a message naming the field ("`temperature` must be a number").
std::string read_request(const boost::json::object& o, dialect d, parsed_request& out);

// `s` with every invalid UTF-8 sequence replaced by U+FFFD, so it can be sent in JSON.
std::string valid_utf8(std::string_view s);

}  // namespace anvil::proto
