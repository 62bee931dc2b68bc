// The OpenAI API's JSON shapes, built with Boost.JSON: error bodies, completion and chat choices,
// stream chunks and log-probabilities. Pure functions of their arguments, shared by http_session
// (answers) and the network shell (errors it raises itself: 400, 413, 431).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/fwd.hpp>

#include "engine/engine.h"

namespace anvil::proto {

// {"error": {"message", "type", "param", "code"}}; the type follows the status (400/404/405/413/
// 431: invalid_request_error, 401: authentication_error, 429: rate_limit_error, else server_error).
// `param` is the field a request_json message names ("`top_p` must be ..."), else null.
std::string openai_error_body(unsigned status, std::string_view message, std::string_view code);

// A new response id: "cmpl-..." or "chatcmpl-..." and 24 hex digits.
std::string new_response_id(std::string_view prefix);

// Log-probabilities of some generated tokens, as their text comes from the tokenizer.
struct token_logprobs_view {
  std::span<const std::int32_t> tokens;
  std::span<const float> logprobs;
  std::span<const std::vector<sampler::token_logprob>> top;  // one list per token (may be empty lists)
};

// /v1/completions: {"tokens", "token_logprobs", "top_logprobs": [{text: logprob}], "text_offset"};
// `offset` is the byte offset of the first token's text in the choice's text; advanced past them.
boost::json::object completion_logprobs(const model::tokenizer& tok, const token_logprobs_view& v, std::size_t& offset);

// /v1/chat/completions: the entries of {"content": [...]}: {token, logprob, bytes, top_logprobs}.
boost::json::array chat_logprobs_content(const model::tokenizer& tok, const token_logprobs_view& v);

}  // namespace anvil::proto
