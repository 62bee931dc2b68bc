// wire: the JSON anvil-bench writes and reads on the wire, as pure functions so the clients stay
// thin and the formats are tested without sockets.
//   line protocol (proto/PROTOCOL.md): request lines, the auth line, and each answer line read
//     into a line_answer (chunk / done / error / auth ok)
//   OpenAI HTTP: /v1/completions and /v1/chat/completions bodies (streaming with usage), each
//     SSE event's data read into an http_chunk, error bodies, /v1/models
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "bench/load/prompts.h"

namespace anvil::bench {

// One request line, "\n"-terminated: streaming, max_tokens, ignore_eos, greedy.
std::string line_request(std::int64_t id, const bench_prompt& p, int max_tokens);
// The first line of a connection to a server with an API key.
std::string line_auth(const std::string& key);

// One line the server sent, as far as a benchmark cares.
struct line_answer {
  enum class kind { chunk, done, error, auth_ok, unknown };
  kind type = kind::unknown;                      // what the line is
  std::optional<std::int64_t> id;                 // the request it names (integer ids only: ours)
  bool has_content = false;                       // chunk: carries text or tokens
  std::int64_t n_tokens = 0;                      // chunk / done: length of its "tokens" array
  std::optional<std::int64_t> prompt_tokens;      // done: usage.prompt_tokens
  std::optional<std::int64_t> completion_tokens;  // done: usage.completion_tokens
  std::string finish_reason;                      // done: "stop", "length", "cancelled"
  std::string error;                              // error: "code: message"; unknown: why unreadable
};
line_answer parse_line_answer(std::string_view line);

// The JSON body of a streaming completions (or chat, when `chat`) request.
std::string http_request_body(const bench_prompt& p, int max_tokens, const std::string& model, bool chat);

// One SSE event of a streaming OpenAI answer.
struct http_chunk {
  bool done = false;                              // the "[DONE]" sentinel
  bool has_content = false;                       // choices[0] carries text (delta content for chat)
  std::optional<std::int64_t> prompt_tokens;      // usage.prompt_tokens when present
  std::optional<std::int64_t> completion_tokens;  // usage.completion_tokens when present
  std::string error;                              // an {"error": ...} event or unreadable JSON
};
http_chunk parse_http_event(std::string_view data, bool chat);

// The message of an OpenAI-style error body ({"error": {"message": ...}}, {"message": ...},
// {"detail": ...}), else the body itself, shortened.
std::string http_error_message(std::string_view body);

// The first model id of a GET /v1/models answer, if any.
std::optional<std::string> first_model_id(std::string_view body);

}  // namespace anvil::bench
