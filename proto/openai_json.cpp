#include "proto/openai_json.h"

#include <atomic>
#include <random>

#include <boost/json.hpp>
#include <spdlog/fmt/fmt.h>

#include "proto/request_json.h"

namespace anvil::proto {

namespace json = boost::json;

namespace {

std::string_view error_type(unsigned status) {
  switch (status) {
    case 400: case 404: case 405: case 413: case 431: return "invalid_request_error";
    case 401: return "authentication_error";
    case 429: return "rate_limit_error";
    default: return "server_error";
  }
}

// request_json names the field first, in backticks: "`top_p` must be a number".
json::value param_of(std::string_view message) {
  if (message.size() < 3 || message.front() != '`') return nullptr;
  const std::size_t end = message.find('`', 1);
  if (end == std::string_view::npos) return nullptr;
  return json::string(message.substr(1, end - 1));
}

std::string token_text(const model::tokenizer& tok, std::int32_t id) {
  const std::int32_t one[1] = {id};
  return tok.decode(one);
}

json::array bytes_of(std::string_view s) {
  json::array a;
  a.reserve(s.size());
  for (const char c : s) a.push_back(static_cast<unsigned char>(c));
  return a;
}

}  // namespace

std::string openai_error_body(unsigned status, std::string_view message, std::string_view code) {
  json::object err{{"message", valid_utf8(message)}, {"type", error_type(status)}, {"param", param_of(message)}};
  err["code"] = code.empty() ? json::value(nullptr) : json::value(json::string(code));
  return json::serialize(json::object{{"error", std::move(err)}});
}

std::string new_response_id(std::string_view prefix) {
  static std::atomic<std::uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}-{:016x}{:08x}", prefix, rng(), std::uint32_t(counter.fetch_add(1)));
}

json::object completion_logprobs(const model::tokenizer& tok, const token_logprobs_view& v, std::size_t& offset) {
  json::array tokens, token_logprobs, top_logprobs, text_offset;
  for (std::size_t i = 0; i < v.tokens.size(); ++i) {
    const std::string text = token_text(tok, v.tokens[i]);
    tokens.push_back(json::string(valid_utf8(text)));
    token_logprobs.push_back(i < v.logprobs.size() ? double(v.logprobs[i]) : 0.0);
    json::object alts;
    if (i < v.top.size()) {
      for (const sampler::token_logprob& t : v.top[i]) alts[valid_utf8(token_text(tok, t.token))] = double(t.logprob);
    }
    top_logprobs.push_back(std::move(alts));
    text_offset.push_back(offset);
    offset += text.size();
  }
  return json::object{{"tokens", std::move(tokens)},
                      {"token_logprobs", std::move(token_logprobs)},
                      {"top_logprobs", std::move(top_logprobs)},
                      {"text_offset", std::move(text_offset)}};
}

json::array chat_logprobs_content(const model::tokenizer& tok, const token_logprobs_view& v) {
  json::array content;
  for (std::size_t i = 0; i < v.tokens.size(); ++i) {
    const std::string text = token_text(tok, v.tokens[i]);
    json::array alts;
    if (i < v.top.size()) {
      for (const sampler::token_logprob& t : v.top[i]) {
        const std::string alt = token_text(tok, t.token);
        alts.push_back(json::object{{"token", valid_utf8(alt)}, {"logprob", double(t.logprob)}, {"bytes", bytes_of(alt)}});
      }
    }
    content.push_back(json::object{{"token", valid_utf8(text)},
                                   {"logprob", i < v.logprobs.size() ? double(v.logprobs[i]) : 0.0},
                                   {"bytes", bytes_of(text)},
                                   {"top_logprobs", std::move(alts)}});
  }
  return content;
}

}  // namespace anvil::proto
