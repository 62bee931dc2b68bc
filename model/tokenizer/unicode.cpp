// Strict UTF-8 per the Unicode standard's table of well-formed byte sequences (D92): the second
// byte's range depends on the lead byte, which excludes overlongs, surrogates and > U+10FFFF.
#include "model/tokenizer/unicode.h"

namespace anvil::model {
namespace {

struct lead_info {
  std::size_t length;       // total bytes in the sequence, 0 for a byte that cannot lead
  unsigned char second_lo;  // allowed range of the second byte
  unsigned char second_hi;
};

lead_info classify_lead(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};  // continuation byte or overlong 2-byte lead
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};  // no overlong 3-byte forms
  if (b == 0xED) return {3, 0x80, 0x9F};  // no surrogates
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};  // no overlong 4-byte forms
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // nothing above U+10FFFF
  return {0, 0, 0};
}

bool is_continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// How many bytes from pos are consistent with a well-formed sequence (possibly all of them
// while the sequence is still short), and the length the lead byte promises.
std::size_t valid_run(std::string_view text, std::size_t pos, const lead_info& lead) {
  std::size_t i = 1;
  for (; i < lead.length && pos + i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[pos + i]);
    const bool ok = i == 1 ? (b >= lead.second_lo && b <= lead.second_hi) : is_continuation(b);
    if (!ok) break;
  }
  return i;
}

}  // namespace

std::size_t utf8_sequence_length(std::string_view text, std::size_t pos) {
  const lead_info lead = classify_lead(static_cast<unsigned char>(text[pos]));
  if (lead.length <= 1) return lead.length;
  return valid_run(text, pos, lead) == lead.length ? lead.length : 0;
}

char32_t utf8_decode(std::string_view text, std::size_t pos, std::size_t len) {
  static constexpr unsigned char lead_mask[] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  char32_t cp = static_cast<unsigned char>(text[pos]) & lead_mask[len];
  for (std::size_t i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<unsigned char>(text[pos + i]) & 0x3F);
  return cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::size_t utf8_stable_prefix(std::string_view bytes) {
  // Only the last sequence can be incomplete, and it starts at most 3 bytes from the end.
  const std::size_t n = bytes.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    const std::size_t pos = n - back;
    const auto b = static_cast<unsigned char>(bytes[pos]);
    if (is_continuation(b)) continue;
    const lead_info lead = classify_lead(b);
    // Hold back a lead byte whose sequence is still short and valid so far.
    if (lead.length > back && valid_run(bytes, pos, lead) == back) return pos;
    return n;
  }
  return n;
}

}  // namespace anvil::model
