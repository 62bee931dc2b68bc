// Python's str semantics over UTF-8 bytes, as chat templates rely on them: lengths and indices
// count code points, strip() and split() know Python's whitespace, and upper/lower/title change
// ASCII letters (templates case-fold only role names and keywords). A single stray space changes
// the tokens a model sees, so each function matches CPython byte for byte on valid UTF-8.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace anvil::model::jinja::py {

// The code points of `s` (an invalid byte becomes U+FFFD, one per byte) and back.
std::u32string decode(std::string_view s);
std::string encode(std::u32string_view s);

// Python's str.isspace() for one code point.
bool is_space(char32_t c);

std::size_t length(std::string_view s);  // len(s)

// str.strip() / lstrip() / rstrip(): whitespace when `chars` is nullopt, else any of `chars`.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);

// str.split(sep, maxsplit) and str.rsplit(): whitespace runs when `sep` is nullopt; maxsplit < 0
// means all. Throws template_error for an empty separator (ValueError in Python).
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, std::int64_t maxsplit,
                               bool from_right = false);
std::vector<std::string> splitlines(std::string_view s, bool keepends);

// str.replace(old, new, count); count < 0 replaces all.
std::string replace(std::string_view s, std::string_view from, std::string_view to, std::int64_t count);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);  // first character upper, the rest lower
std::string title(std::string_view s);       // each word's first letter upper, the rest lower

// str.find(sub) / rfind(sub) in code points; -1 when absent.
std::int64_t find(std::string_view s, std::string_view sub, bool from_right);
std::int64_t count(std::string_view s, std::string_view sub);

// s[start:stop:step] with Python's index rules (nullopt = omitted); step 0 throws.
std::string slice(std::string_view s, std::optional<std::int64_t> start, std::optional<std::int64_t> stop,
                  std::optional<std::int64_t> step);

// The index positions a slice of a sequence of `n` items takes, in order.
std::vector<std::size_t> slice_indices(std::size_t n, std::optional<std::int64_t> start,
                                       std::optional<std::int64_t> stop, std::optional<std::int64_t> step);

}  // namespace anvil::model::jinja::py
