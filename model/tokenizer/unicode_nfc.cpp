// NFC in the textbook three steps (UAX #15): full canonical decomposition, canonical ordering of
// combining marks, then canonical composition. Hangul syllables are handled arithmetically.
// Invalid UTF-8 bytes travel through as pseudo code points above U+10FFFF.
#include "model/tokenizer/unicode_nfc.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/tokenizer/unicode.h"
#include "model/tokenizer/unicode_nfc_data.h"

namespace anvil::model {
namespace {

constexpr char32_t invalid_byte_base = 0x110000;  // pseudo code point for an invalid byte

// Hangul syllable arithmetic (Unicode ch. 3.12).
constexpr char32_t s_base = 0xAC00, l_base = 0x1100, v_base = 0x1161, t_base = 0x11A7;
constexpr char32_t l_count = 19, v_count = 21, t_count = 28, n_count = v_count * t_count;
constexpr char32_t s_count = l_count * n_count;

std::uint8_t combining_class(char32_t cp) {
  const auto& r = nfc_data::ccc_ranges;
  auto it = std::upper_bound(r.begin(), r.end(), cp,
                             [](char32_t c, const nfc_data::ccc_range& e) { return c < e.first; });
  if (it == r.begin()) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

const nfc_data::decomposition* find_decomposition(char32_t cp) {
  const auto& d = nfc_data::decompositions;
  auto it = std::lower_bound(d.begin(), d.end(), cp,
                             [](const nfc_data::decomposition& e, char32_t c) { return e.cp < c; });
  return it != d.end() && it->cp == cp ? &*it : nullptr;
}

void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= s_base && cp < s_base + s_count) {
    const char32_t s = cp - s_base;
    out.push_back(l_base + s / n_count);
    out.push_back(v_base + (s % n_count) / t_count);
    if (s % t_count != 0) out.push_back(t_base + s % t_count);
    return;
  }
  const nfc_data::decomposition* d = cp < invalid_byte_base ? find_decomposition(cp) : nullptr;
  if (d == nullptr) {
    out.push_back(cp);
    return;
  }
  decompose(d->first, out);
  if (d->second != 0) decompose(d->second, out);
}

// 0 when the pair does not compose.
char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= l_base && a < l_base + l_count && b >= v_base && b < v_base + v_count)
    return s_base + ((a - l_base) * v_count + (b - v_base)) * t_count;
  if (a >= s_base && a < s_base + s_count && (a - s_base) % t_count == 0 && b > t_base && b < t_base + t_count)
    return a + (b - t_base);
  const auto& c = nfc_data::compositions;
  auto it = std::lower_bound(c.begin(), c.end(), std::pair{a, b},
                             [](const nfc_data::composition& e, std::pair<char32_t, char32_t> k) {
                               return e.first != k.first ? e.first < k.first : e.second < k.second;
                             });
  return it != c.end() && it->first == a && it->second == b ? it->composite : 0;
}

std::vector<char32_t> decode_and_decompose(std::string_view text) {
  std::vector<char32_t> cps;
  cps.reserve(text.size());
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t len = utf8_sequence_length(text, pos);
    if (len == 0) {
      cps.push_back(invalid_byte_base + static_cast<unsigned char>(text[pos]));
      pos += 1;
    } else {
      decompose(utf8_decode(text, pos, len), cps);
      pos += len;
    }
  }
  return cps;
}

// Stable sort of each run of non-starters by combining class.
void canonical_order(std::vector<char32_t>& cps) {
  for (std::size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j,
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
}

// Canonical composition: a character composes with the last starter unless something between
// them blocks it. What lies between is non-starters in canonical order, so the last one written
// has the highest class: it blocks when its class is not below the character's.
void compose(std::vector<char32_t>& cps) {
  constexpr std::size_t none = static_cast<std::size_t>(-1);
  std::size_t out = 0, starter = none;
  int last_ccc = 0;  // class of the last character written
  for (const char32_t cp : cps) {
    const int ccc = combining_class(cp);
    if (starter != none && (out - 1 == starter || last_ccc < ccc)) {
      if (const char32_t composite = compose_pair(cps[starter], cp); composite != 0) {
        cps[starter] = composite;
        continue;
      }
    }
    if (ccc == 0) starter = out;
    last_ccc = ccc;
    cps[out++] = cp;
  }
  cps.resize(out);
}

}  // namespace

std::string to_nfc(std::string_view text) {
  // Below U+0300 (lead bytes below 0xCC) every character is its own NFC and never composes with
  // a neighbour (checked when the tables were generated): most text needs no work.
  const bool trivial =
      std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0xCC; });
  if (trivial) return std::string(text);
  std::vector<char32_t> cps = decode_and_decompose(text);
  canonical_order(cps);
  compose(cps);
  std::string out;
  out.reserve(text.size());
  for (char32_t cp : cps) {
    if (cp >= invalid_byte_base)
      out += static_cast<char>(cp - invalid_byte_base);
    else
      utf8_append(out, cp);
  }
  return out;
}

}  // namespace anvil::model
