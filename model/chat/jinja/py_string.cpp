#include "model/chat/jinja/py_string.h"

#include <algorithm>

#include "model/chat/jinja/value.h"

namespace anvil::model::jinja::py {

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = b(i);
    const std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    char32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (std::size_t k = 1; ok && k < len; ++k) {
      ok = (b(i + k) & 0xC0) == 0x80;
      cp = (cp << 6) | (b(i + k) & 0x3F);
    }
    if (ok && len > 1) ok = cp >= (len == 2 ? 0x80u : len == 3 ? 0x800u : 0x10000u) && cp <= 0x10FFFF;
    out.push_back(ok ? cp : U'\uFFFD');
    i += ok ? len : 1;
  }
  return out;
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char32_t c : s) {
    if (c < 0x80) {
      out += char(c);
    } else if (c < 0x800) {
      out += char(0xC0 | (c >> 6));
      out += char(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += char(0xE0 | (c >> 12));
      out += char(0x80 | ((c >> 6) & 0x3F));
      out += char(0x80 | (c & 0x3F));
    } else {
      out += char(0xF0 | (c >> 18));
      out += char(0x80 | ((c >> 12) & 0x3F));
      out += char(0x80 | ((c >> 6) & 0x3F));
      out += char(0x80 | (c & 0x3F));
    }
  }
  return out;
}

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

std::size_t length(std::string_view s) {
  const bool ascii = std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  return ascii ? s.size() : decode(s).size();
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::u32string u = decode(s);
  const std::u32string set = chars ? decode(*chars) : std::u32string();
  const auto drop = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : is_space(c); };
  std::size_t a = 0, b = u.size();
  while (left && a < b && drop(u[a])) ++a;
  while (right && b > a && drop(u[b - 1])) --b;
  // Keep the original bytes of the middle (an invalid byte stays as it was).
  if (a == 0 && b == u.size()) return std::string(s);
  return encode(std::u32string_view(u).substr(a, b - a));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, std::int64_t maxsplit,
                               bool from_right) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw template_error{"ValueError: empty separator"};
    if (!from_right) {
      std::size_t at = 0;
      for (std::size_t hit; (maxsplit < 0 || std::int64_t(out.size()) < maxsplit) &&
                            (hit = s.find(*sep, at)) != std::string_view::npos;) {
        out.emplace_back(s.substr(at, hit - at));
        at = hit + sep->size();
      }
      out.emplace_back(s.substr(at));
      return out;
    }
    std::size_t end = s.size();
    for (std::size_t hit; (maxsplit < 0 || std::int64_t(out.size()) < maxsplit) && end >= sep->size() &&
                          (hit = s.rfind(*sep, end - sep->size())) != std::string_view::npos;) {
      out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  const std::u32string u = decode(s);
  if (!from_right) {
    std::size_t i = 0;
    while (i < u.size()) {
      while (i < u.size() && is_space(u[i])) ++i;
      if (i == u.size()) break;
      if (maxsplit >= 0 && std::int64_t(out.size()) == maxsplit) {
        std::size_t end = u.size();
        while (end > i && is_space(u[end - 1])) --end;
        out.push_back(encode(std::u32string_view(u).substr(i, end - i)));
        break;
      }
      const std::size_t start = i;
      while (i < u.size() && !is_space(u[i])) ++i;
      out.push_back(encode(std::u32string_view(u).substr(start, i - start)));
    }
    return out;
  }
  std::size_t i = u.size();
  while (i > 0) {
    while (i > 0 && is_space(u[i - 1])) --i;
    if (i == 0) break;
    if (maxsplit >= 0 && std::int64_t(out.size()) == maxsplit) {
      std::size_t start = 0;
      while (start < i && is_space(u[start])) ++start;
      out.push_back(encode(std::u32string_view(u).substr(start, i - start)));
      break;
    }
    const std::size_t end = i;
    while (i > 0 && !is_space(u[i - 1])) --i;
    out.push_back(encode(std::u32string_view(u).substr(i, end - i)));
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  const std::u32string u = decode(s);
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t i = 0; i < u.size(); ++i) {
    const char32_t c = u[i];
    const bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
                     c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    std::size_t end = i + 1;
    if (c == '\r' && i + 1 < u.size() && u[i + 1] == '\n') end = i + 2;
    out.push_back(encode(std::u32string_view(u).substr(start, (keepends ? end : i) - start)));
    start = end;
    i = end - 1;
  }
  if (start < u.size()) out.push_back(encode(std::u32string_view(u).substr(start)));
  return out;
}

std::string replace(std::string_view s, std::string_view from, std::string_view to, std::int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every character and at both ends
    const std::u32string u = decode(s);
    std::int64_t done = 0;
    for (std::size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < u.size()) out += encode(std::u32string_view(u).substr(i, 1));
    }
    return out;
  }
  std::size_t at = 0;
  std::int64_t done = 0;
  for (std::size_t hit; (count < 0 || done < count) && (hit = s.find(from, at)) != std::string_view::npos; ++done) {
    out.append(s.substr(at, hit - at)).append(to);
    at = hit + from.size();
  }
  out.append(s.substr(at));
  return out;
}

namespace {
char ascii_upper(char c) { return c >= 'a' && c <= 'z' ? char(c - 32) : c; }
char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? char(c + 32) : c; }
bool ascii_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
}  // namespace

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = ascii_upper(c);
  return out;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = ascii_lower(c);
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = ascii_upper(out[0]);
  return out;
}

std::string title(std::string_view s) {
  std::string out(s);
  bool in_word = false;
  for (char& c : out) {
    const bool letter = ascii_alpha(c) || static_cast<unsigned char>(c) >= 0x80;
    if (ascii_alpha(c)) c = in_word ? ascii_lower(c) : ascii_upper(c);
    in_word = letter;
  }
  return out;
}

std::int64_t find(std::string_view s, std::string_view sub, bool from_right) {
  const std::size_t at = from_right ? s.rfind(sub) : s.find(sub);
  if (at == std::string_view::npos) return -1;
  return std::int64_t(length(s.substr(0, at)));
}

std::int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return std::int64_t(length(s)) + 1;
  std::int64_t n = 0;
  for (std::size_t at = s.find(sub); at != std::string_view::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

std::vector<std::size_t> slice_indices(std::size_t n, std::optional<std::int64_t> start,
                                       std::optional<std::int64_t> stop, std::optional<std::int64_t> step) {
  const std::int64_t st = step.value_or(1);
  if (st == 0) throw template_error{"ValueError: slice step cannot be zero"};
  const std::int64_t len = std::int64_t(n);
  const auto clamp = [&](std::optional<std::int64_t> v, std::int64_t dflt) {
    if (!v) return dflt;
    std::int64_t x = *v < 0 ? *v + len : *v;
    if (st > 0) return std::clamp<std::int64_t>(x, 0, len);
    return std::clamp<std::int64_t>(x, -1, len - 1);
  };
  const std::int64_t a = clamp(start, st > 0 ? 0 : len - 1);
  const std::int64_t b = clamp(stop, st > 0 ? len : -1);
  std::vector<std::size_t> out;
  for (std::int64_t i = a; st > 0 ? i < b : i > b; i += st) out.push_back(std::size_t(i));
  return out;
}

std::string slice(std::string_view s, std::optional<std::int64_t> start, std::optional<std::int64_t> stop,
                  std::optional<std::int64_t> step) {
  const std::u32string u = decode(s);
  std::u32string out;
  for (const std::size_t i : slice_indices(u.size(), start, stop, step)) out.push_back(u[i]);
  return encode(out);
}

}  // namespace anvil::model::jinja::py
