#include "sampler/structured/gbnf.h"

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "sampler/structured/regex.h"

namespace anvil::sampler::structured {
namespace {

constexpr std::size_t max_regex_bytes = 4u << 20;
constexpr std::size_t max_tried_bytes = 64u << 10;  // a longer expression would not fit the state limit
constexpr int max_nesting_tried = 3;
constexpr int max_repeat = 1000;
constexpr int max_depth = 200;  // of groups inside groups while parsing
constexpr int max_ref_depth = 100;  // of rules inside rules while unrolling (each is a group of the regex)

struct node {
  enum class kind { literal, char_class, any, ref, seq, alt, repeat } what = kind::literal;
  std::string text{};              // literal: the bytes; char_class: the regex class "[...]"; ref: the name
  std::vector<node> children{};    // seq, alt; repeat: one
  int min = 0, max = -1;           // repeat: -1 is unbounded
  int line = 0;
};

class parser {
 public:
  explicit parser(std::string_view src) : s_(src) {}

  std::map<std::string, node> rules() {
    std::map<std::string, node> out;
    skip_space();
    while (pos_ < s_.size()) {
      const int line = line_;
      const std::string name = identifier();
      if (name.empty()) fail("expected a rule name");
      skip_space();
      if (s_.substr(pos_, 3) != "::=") fail("expected ::= after `" + name + "`");
      pos_ += 3;
      if (out.contains(name)) fail("rule `" + name + "` is defined twice", line);
      node body = alternatives(0);
      out.emplace(name, std::move(body));
      skip_space();
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& what, int line = 0) const {
    throw structured_error("grammar line " + std::to_string(line ? line : line_) + ": " + what);
  }

  void skip_space() {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        if (c == '\n') ++line_;
        ++pos_;
      } else {
        return;
      }
    }
  }

  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }

  std::string identifier() {
    const std::size_t start = pos_;
    while (pos_ < s_.size() && name_char(s_[pos_])) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }

  // Whether a new rule (`name ::=`) starts here.
  bool at_rule_start() const {
    std::size_t p = pos_;
    while (p < s_.size() && name_char(s_[p])) ++p;
    if (p == pos_) return false;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\r' || s_[p] == '\n')) ++p;
    return s_.substr(p, 3) == "::=";
  }

  node alternatives(int depth) {
    if (depth > max_depth) fail("groups nest too deeply");
    node alt{.what = node::kind::alt, .line = line_};
    alt.children.push_back(sequence(depth));
    skip_space();
    while (pos_ < s_.size() && s_[pos_] == '|') {
      ++pos_;
      alt.children.push_back(sequence(depth));
      skip_space();
    }
    return alt.children.size() == 1 ? std::move(alt.children[0]) : alt;
  }

  node sequence(int depth) {
    node seq{.what = node::kind::seq, .line = line_};
    for (;;) {
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] == '|' || s_[pos_] == ')' || at_rule_start()) break;
      node item = element(depth);
      item = repeats(std::move(item));
      seq.children.push_back(std::move(item));
    }
    return seq;  // may be empty: the empty string
  }

  // At most one repeat operator per element (llama.cpp's parser reads one too; a stack of them
  // would nest without bound).
  node repeats(node item) {
    if (pos_ >= s_.size()) return item;
    const char c = s_[pos_];
    int lo = 0, hi = -1;
    if (c == '*') {
      ++pos_;
    } else if (c == '+') {
      lo = 1;
      ++pos_;
    } else if (c == '?') {
      hi = 1;
      ++pos_;
    } else if (c == '{') {
      ++pos_;
      lo = number();
      hi = lo;
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        hi = pos_ < s_.size() && s_[pos_] == '}' ? -1 : number();
      }
      if (pos_ >= s_.size() || s_[pos_] != '}') fail("expected } closing a repeat count");
      ++pos_;
      if (hi != -1 && hi < lo) fail("a repeat {m,n} needs m <= n");
    } else {
      return item;
    }
    if (pos_ < s_.size() && std::string_view("*+?{").find(s_[pos_]) != std::string_view::npos) {
      fail("a repeat operator right after another");
    }
    node r{.what = node::kind::repeat, .min = lo, .max = hi, .line = line_};
    r.children.push_back(std::move(item));
    return r;
  }

  int number() {
    const std::size_t start = pos_;
    long v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9' && v <= max_repeat) v = v * 10 + (s_[pos_++] - '0');
    if (pos_ == start) fail("expected a number in a repeat count");
    if (v > max_repeat) fail("repeat counts above " + std::to_string(max_repeat) + " are not supported");
    return int(v);
  }

  // One character of a literal or class, escapes decoded; returns its code point.
  std::uint32_t character() {
    if (pos_ >= s_.size()) fail("unterminated literal or class");
    const unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c == '\\') {
      if (++pos_ >= s_.size()) fail("a lone \\ at the end");
      const char e = s_[pos_++];
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case ']': case '[': case '-': case '^': return std::uint32_t(e);
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        default: fail(std::string("unknown escape \\") + e);
      }
    }
    // A UTF-8 character, whole.
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + std::size_t(len) > s_.size()) fail("invalid UTF-8");
    std::uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < len; ++i) {
      const unsigned char k = static_cast<unsigned char>(s_[pos_ + std::size_t(i)]);
      if ((k & 0xC0) != 0x80) fail("invalid UTF-8");
      cp = (cp << 6) | (k & 0x3F);
    }
    pos_ += std::size_t(len);
    return cp;
  }

  std::uint32_t hex(int digits) {
    std::uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= s_.size()) fail("a short hex escape");
      const char h = s_[pos_++];
      const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) fail("a bad hex escape");
      v = v * 16 + std::uint32_t(d);
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) fail("an escape that is not a character");
    return v;
  }

  // A code point as a member of a regex class.
  static std::string class_member(std::uint32_t cp) {
    static constexpr std::string_view special = "\\]^-[";
    char buf[8];
    if (cp < 0x20 || cp == 0x7F) {
      std::snprintf(buf, sizeof buf, "\\x%02X", unsigned(cp));
      return buf;
    }
    std::string out;
    if (cp < 0x80 && special.find(char(cp)) != std::string_view::npos) out += '\\';
    append_utf8(out, cp);
    return out;
  }

  node element(int depth) {
    const int line = line_;
    const char c = s_[pos_];
    if (c == '"') {
      ++pos_;
      std::string bytes;
      while (pos_ < s_.size() && s_[pos_] != '"') {
        if (s_[pos_] == '\n') fail("a literal runs past the end of its line");
        append_utf8(bytes, character());
      }
      if (pos_ >= s_.size()) fail("unterminated literal");
      ++pos_;
      return node{.what = node::kind::literal, .text = std::move(bytes), .line = line};
    }
    if (c == '[') {
      ++pos_;
      std::string cls = "[";
      if (pos_ < s_.size() && s_[pos_] == '^') {
        cls += '^';
        ++pos_;
      }
      bool empty = true;
      while (pos_ < s_.size() && s_[pos_] != ']') {
        const std::uint32_t lo = character();
        cls += class_member(lo);
        if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
          ++pos_;
          const std::uint32_t hi = character();
          if (hi < lo) fail("a class range runs backwards");
          cls += '-' + class_member(hi);
        }
        empty = false;
      }
      if (pos_ >= s_.size()) fail("unterminated character class");
      if (empty) fail("an empty character class");
      ++pos_;
      return node{.what = node::kind::char_class, .text = cls + "]", .line = line};
    }
    if (c == '.') {
      ++pos_;
      return node{.what = node::kind::any, .line = line};
    }
    if (c == '(') {
      ++pos_;
      node inner = alternatives(depth + 1);
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] != ')') fail("expected ) closing the group opened here", line);
      ++pos_;
      return inner;
    }
    const std::string name = identifier();
    if (name.empty()) fail(std::string("unexpected `") + c + "`");
    return node{.what = node::kind::ref, .text = name, .line = line};
  }

  std::string_view s_;
  std::size_t pos_ = 0;
  int line_ = 1;
};

using piece = std::optional<std::string>;  // nullopt: nothing can match (a recursion cut off)

class emitter {
 public:
  emitter(const std::map<std::string, node>& rules, int max_nesting) : rules_(rules), max_nesting_(max_nesting) {}

  // `name` is defined (check_refs).
  piece rule(const std::string& name, int line) {
    int& active = active_[name];
    if (active >= max_nesting_) return std::nullopt;
    if (depth_ >= max_ref_depth) {
      throw structured_error("grammar line " + std::to_string(line) + ": rules refer to rules more than " +
                             std::to_string(max_ref_depth) + " deep");
    }
    ++active;
    ++depth_;
    piece p = emit(rules_.at(name));
    --depth_;
    --active_[name];
    return p;
  }

 private:
  void check_size(const std::string& s) const {
    if (s.size() > max_regex_bytes) {
      throw structured_error("grammar: too large once its recursion is unrolled (over 4 MB as an expression)");
    }
  }

  piece emit(const node& n) {
    switch (n.what) {
      case node::kind::literal: return escape_regex(n.text);
      case node::kind::char_class: return n.text;
      case node::kind::any: return std::string("(?:.|\\n)");
      case node::kind::ref: {
        piece p = rule(n.text, n.line);
        if (p) p = "(?:" + *p + ")";
        return p;
      }
      case node::kind::seq: {
        std::string out;
        for (const node& c : n.children) {
          const piece p = emit(c);
          if (!p) return std::nullopt;
          out += *p;
          check_size(out);
        }
        return out;
      }
      case node::kind::alt: {
        std::string out;
        bool any = false;
        for (const node& c : n.children) {
          const piece p = emit(c);
          if (!p) continue;
          out += (any ? "|" : "") + *p;
          any = true;
          check_size(out);
        }
        if (!any) return std::nullopt;
        return "(?:" + out + ")";
      }
      case node::kind::repeat: {
        const piece p = emit(n.children[0]);
        if (!p) return n.min == 0 ? piece(std::string()) : std::nullopt;  // only zero repeats are left
        const std::string g = "(?:" + *p + ")";
        if (n.min == 0 && n.max == -1) return g + "*";
        if (n.min == 1 && n.max == -1) return g + "+";
        if (n.min == 0 && n.max == 1) return g + "?";
        if (n.max == -1) return g + "{" + std::to_string(n.min) + ",}";
        if (n.min == n.max) return g + "{" + std::to_string(n.min) + "}";
        return g + "{" + std::to_string(n.min) + "," + std::to_string(n.max) + "}";
      }
    }
    return std::nullopt;
  }

  const std::map<std::string, node>& rules_;
  int max_nesting_;
  std::map<std::string, int> active_;  // each rule's references on the path being unrolled
  int depth_ = 0;                      // all of them
};

// Every name a rule uses is defined (also where unrolling never reaches it).
void check_refs(const node& n, const std::map<std::string, node>& rules) {
  if (n.what == node::kind::ref && !rules.contains(n.text)) {
    throw structured_error("grammar line " + std::to_string(n.line) + ": rule `" + n.text + "` is not defined");
  }
  for (const node& c : n.children) check_refs(c, rules);
}

}  // namespace

std::string gbnf_regex(std::string_view grammar, int max_nesting) {
  const std::map<std::string, node> rules = parser(grammar).rules();
  if (!rules.contains("root")) throw structured_error("grammar: no `root` rule");
  for (const auto& [name, body] : rules) check_refs(body, rules);
  emitter e(rules, max_nesting);
  const piece root = e.rule("root", 0);
  if (!root) {
    throw structured_error("grammar: `root` has no output within " + std::to_string(max_nesting) +
                           " levels of recursion (a rule without a way out?)");
  }
  return *root;
}

dfa compile_gbnf(std::string_view grammar) {
  for (int nesting = max_nesting_tried;; --nesting) {
    const std::string re = gbnf_regex(grammar, nesting);
    if (nesting > 1 && re.size() > max_tried_bytes) continue;
    try {
      return compile_regex(re);
    } catch (const structured_error& e) {
      if (nesting == 1) throw structured_error(std::string("grammar: ") + e.what());
    }
  }
}

}  // namespace anvil::sampler::structured
