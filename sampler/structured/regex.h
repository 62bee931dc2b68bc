// Regular expressions compiled to a byte-level DFA: what constrained decoding walks token bytes
// through. The syntax is the common subset of Python's `re` and ECMAScript that JSON-schema
// patterns and users' `regex` fields use: literals (UTF-8), `.`, classes `[a-z\d]` / `[^"\\]`,
// escapes \d \w \s \D \W \S \n \t \r \f \v \xHH \uHHHH and escaped metacharacters, groups `( )` and
// `(?: )`, alternation, and the quantifiers * + ? {n} {n,} {n,m}. The whole output must match
// (a leading ^ and a trailing $ are accepted and change nothing). Classes and `.` match whole
// UTF-8 characters; `.` matches any character but "\n".
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace anvil::sampler::structured {

// A pattern or schema anvil cannot compile; the message names the problem (and where).
struct structured_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct dfa {
  static constexpr std::int32_t dead = -1;
  std::vector<std::array<std::int32_t, 256>> next;  // next[state][byte]: the state after it, or dead
  std::vector<char> accepting;                       // the bytes so far are a whole match
  std::int32_t start = 0;

  std::int32_t size() const { return std::int32_t(next.size()); }
  // The state after `bytes` from `state`, or dead.
  std::int32_t walk(std::int32_t state, std::string_view bytes) const;
  bool matches(std::string_view text) const;  // the whole text
};

// Appends code point `c` as UTF-8.
void append_utf8(std::string& out, char32_t c);

// The pattern that matches exactly `literal`: metacharacters escaped, control bytes as \xHH.
std::string escape_regex(std::string_view literal);

// Throws structured_error for a syntax error, an unsupported construct (backreferences,
// lookaround, lazy quantifiers), a repeat count over 1000, or a DFA of more than max_states.
dfa compile_regex(std::string_view pattern, std::int32_t max_states = 20000);

}  // namespace anvil::sampler::structured
