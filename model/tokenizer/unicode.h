// UTF-8 helpers for the tokenizers: strict decoding (so invalid bytes can be carried through
// untouched instead of being guessed at), encoding, and the "how much of this byte stream is
// safe to show" question that streaming detokenisation asks after every token.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace anvil::model {

// Length of the well-formed UTF-8 sequence that starts at text[pos], or 0 when the bytes there
// do not form one (stray continuation byte, truncated sequence, overlong form, surrogate, or a
// value above U+10FFFF). Precondition: pos < text.size().
std::size_t utf8_sequence_length(std::string_view text, std::size_t pos);

// The code point of the well-formed sequence of `len` bytes at text[pos] (len from above).
char32_t utf8_decode(std::string_view text, std::size_t pos, std::size_t len);

// Appends the UTF-8 encoding of cp (a Unicode scalar value).
void utf8_append(std::string& out, char32_t cp);

// The length of the longest prefix of `bytes` that can be shown now: everything except a
// trailing sequence that is incomplete but could still become valid with more bytes. Invalid
// bytes are never held back (no later byte can fix them).
std::size_t utf8_stable_prefix(std::string_view bytes);

}  // namespace anvil::model
