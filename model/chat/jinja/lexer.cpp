#include "model/chat/jinja/lexer.h"

#include <array>

#include "model/chat/jinja/py_string.h"
#include "model/chat/jinja/value.h"

namespace anvil::model::jinja {
namespace {

[[noreturn]] void fail(int line, const std::string& what) {
  throw template_error{what, line};
}

// Newlines as "\n" and one trailing newline dropped, as Jinja's lexer reads a source.
std::string normalise(std::string_view source) {
  std::string s;
  s.reserve(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      s += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      s += source[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

bool all_space(std::string_view s) {
  if (s.empty()) return false;
  for (const char32_t c : py::decode(s)) {
    if (!py::is_space(c)) return false;
  }
  return true;
}

bool name_start(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool name_char(char c) { return name_start(c) || (c >= '0' && c <= '9'); }
bool digit(char c) { return c >= '0' && c <= '9'; }

int hex_value(char c) {
  if (digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class lexer {
 public:
  explicit lexer(std::string_view source) : s_(normalise(source)) {}

  std::vector<token> run() {
    while (pos_ < s_.size()) {
      const std::size_t tag = find_tag(pos_);
      std::string text = s_.substr(pos_, tag - pos_);
      if (strip_next_) {
        text = py::strip(text, std::nullopt, true, false);
        strip_next_ = false;
      }
      if (tag == s_.size()) {
        emit_text(std::move(text), line_);
        break;
      }
      const char type = s_[tag + 1];  // '{', '%' or '#'
      char sign = tag + 2 < s_.size() ? s_[tag + 2] : '\0';
      if (sign == '+' && type == '{') sign = '\0';  // `{{+x}}` is unary plus, not a sign
      if (sign == '-') {
        text = py::strip(text, std::nullopt, false, true);
      } else if (sign != '+' && type != '{') {  // lstrip_blocks
        const std::size_t l_pos = text.rfind('\n') + 1;  // npos + 1 == 0
        if ((l_pos > 0 || line_starting_) && all_space(std::string_view(text).substr(l_pos))) text.resize(l_pos);
      }
      const int text_line = line_;
      advance_to(tag);
      emit_text(std::move(text), text_line);
      pos_ = tag + 2 + (sign == '-' || sign == '+' ? 1 : 0);
      if (type == '#') {
        comment();
      } else {
        tag_body(type == '%');
      }
    }
    out_.push_back({token_kind::end, "", line_});
    return std::move(out_);
  }

 private:
  std::size_t find_tag(std::size_t from) const {
    for (std::size_t i = s_.find('{', from); i != std::string::npos; i = s_.find('{', i + 1)) {
      if (i + 1 < s_.size() && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    }
    return s_.size();
  }

  void advance_to(std::size_t to) {
    for (; scan_ < to; ++scan_) line_ += s_[scan_] == '\n';
  }

  void emit_text(std::string text, int line) {
    if (!text.empty()) out_.push_back({token_kind::text, std::move(text), line});
  }

  // After a tag's closing delimiter at pos_ (already past it): `-` strips what follows, a block
  // tag or comment without `+` eats one newline (trim_blocks).
  void after_close(char sign, bool block) {
    if (sign == '-') {
      strip_next_ = true;
      std::size_t p = pos_;
      while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\n' || s_[p] == '\r' || s_[p] == '\f' || s_[p] == '\v')) ++p;
      line_starting_ = p > pos_ && s_[p - 1] == '\n';
    } else if (block && sign != '+' && pos_ < s_.size() && s_[pos_] == '\n') {
      ++pos_;
      line_starting_ = true;
    } else {
      line_starting_ = false;
    }
    advance_to(pos_);
  }

  void comment() {
    const int start = line_;
    const std::size_t end = s_.find("#}", pos_);
    if (end == std::string::npos) fail(start, "the comment is never closed (#})");
    const char sign = end > pos_ && (s_[end - 1] == '-' || s_[end - 1] == '+') ? s_[end - 1] : '\0';
    pos_ = end + 2;
    after_close(sign, true);
  }

  void tag_body(bool block) {
    const int start = line_;
    out_.push_back({block ? token_kind::block_begin : token_kind::var_begin, "", start});
    int depth = 0;  // open ( [ {, so a dict's closing brace is not taken for }}
    for (;;) {
      while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
        line_ += s_[pos_] == '\n';
        ++pos_;
      }
      scan_ = pos_;
      if (pos_ >= s_.size()) fail(start, block ? "the tag is never closed (%})" : "the expression is never closed (}})");
      const std::string_view rest = std::string_view(s_).substr(pos_);
      const std::string_view close = block ? "%}" : "}}";
      for (const char sign : {'-', '+', '\0'}) {
        const bool signed_close = sign != '\0' && rest.size() > 2 && rest[0] == sign && rest.substr(1, 2) == close;
        if (signed_close || (sign == '\0' && rest.substr(0, 2) == close && (block || depth == 0))) {
          if (sign == '+' && !block) break;
          out_.push_back({block ? token_kind::block_end : token_kind::var_end, "", line_});
          pos_ += signed_close ? 3 : 2;
          after_close(sign, block);
          return;
        }
      }
      const char c = s_[pos_];
      if (name_start(c)) {
        std::size_t e = pos_;
        while (e < s_.size() && name_char(s_[e])) ++e;
        out_.push_back({token_kind::name, s_.substr(pos_, e - pos_), line_});
        pos_ = e;
      } else if (digit(c)) {
        number();
      } else if (c == '\'' || c == '"') {
        string_literal();
      } else {
        static constexpr std::array<std::string_view, 27> ops = {
            "//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
            "=",  ".",  ",",  ":",  "|",  "(",  ")", "[", "]", "{", "}", "!", ";"};
        std::string_view op;
        for (const std::string_view o : ops) {
          if (rest.substr(0, o.size()) == o) {
            op = o;
            break;
          }
        }
        if (op.empty() || op == "!" || op == ";") fail(line_, "unexpected character '" + std::string(1, c) + "'");
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") --depth;
        out_.push_back({token_kind::op, std::string(op), line_});
        pos_ += op.size();
      }
    }
  }

  void number() {
    std::size_t e = pos_;
    bool is_float = false;
    const auto digits = [&] {
      while (e < s_.size() && (digit(s_[e]) || (s_[e] == '_' && e + 1 < s_.size() && digit(s_[e + 1])))) ++e;
    };
    digits();
    if (e + 1 < s_.size() && s_[e] == '.' && digit(s_[e + 1])) {
      is_float = true;
      ++e;
      digits();
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      std::size_t x = e + 1;
      if (x < s_.size() && (s_[x] == '+' || s_[x] == '-')) ++x;
      if (x < s_.size() && digit(s_[x])) {
        is_float = true;
        e = x;
        digits();
      }
    }
    std::string text;
    for (std::size_t i = pos_; i < e; ++i) {
      if (s_[i] != '_') text += s_[i];
    }
    out_.push_back({is_float ? token_kind::floating : token_kind::integer, std::move(text), line_});
    pos_ = e;
  }

  // Python's string escapes; an unknown escape keeps its backslash.
  void string_literal() {
    const int start = line_;
    const char quote = s_[pos_++];
    std::u32string v;
    for (;;) {
      if (pos_ >= s_.size()) fail(start, "the string literal is never closed");
      const char c = s_[pos_];
      if (c == quote) {
        ++pos_;
        break;
      }
      line_ += c == '\n';
      if (c != '\\' || pos_ + 1 >= s_.size()) {
        std::size_t len = 1;
        while (pos_ + len < s_.size() && (static_cast<unsigned char>(s_[pos_ + len]) & 0xC0) == 0x80) ++len;
        v += py::decode(std::string_view(s_).substr(pos_, len));
        pos_ += len;
        continue;
      }
      const char e = s_[pos_ + 1];
      pos_ += 2;
      const auto hex = [&](int n) {
        char32_t cp = 0;
        for (int i = 0; i < n; ++i) {
          const int h = pos_ < s_.size() ? hex_value(s_[pos_]) : -1;
          if (h < 0) fail(line_, "a \\x, \\u or \\U escape needs " + std::to_string(n) + " hex digits");
          cp = cp * 16 + char32_t(h);
          ++pos_;
        }
        return cp;
      };
      switch (e) {
        case 'n': v += U'\n'; break;
        case 't': v += U'\t'; break;
        case 'r': v += U'\r'; break;
        case 'b': v += U'\b'; break;
        case 'f': v += U'\f'; break;
        case 'v': v += U'\v'; break;
        case 'a': v += U'\a'; break;
        case '0': v += U'\0'; break;
        case '\\': case '\'': case '"': v += char32_t(e); break;
        case '\n': ++line_; break;  // a backslash-newline continues the literal
        case 'x': v += hex(2); break;
        case 'u': v += hex(4); break;
        case 'U': v += hex(8); break;
        default: v += U'\\'; v += char32_t(static_cast<unsigned char>(e));
      }
    }
    out_.push_back({token_kind::string, py::encode(v), start});
  }

  std::string s_;
  std::size_t pos_ = 0;
  std::size_t scan_ = 0;  // line_ counts the newlines before scan_
  int line_ = 1;
  bool line_starting_ = true;
  bool strip_next_ = false;
  std::vector<token> out_;
};

}  // namespace

std::vector<token> tokenize(std::string_view source) { return lexer(source).run(); }

}  // namespace anvil::model::jinja
