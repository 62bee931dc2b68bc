#include "model/chat/jinja/parser.h"

#include <algorithm>
#include <charconv>
#include <initializer_list>

#include "model/chat/jinja/lexer.h"

namespace anvil::model::jinja {
namespace {

constexpr int max_nesting = 200;  // a hostile template must not exhaust the stack

class parser {
 public:
  explicit parser(std::vector<token> tokens) : t_(std::move(tokens)) {}

  body run() {
    std::string end;
    body b = statements({}, end);
    return b;
  }

 private:
  // ---- tokens ----
  const token& cur() const { return t_[i_]; }
  const token& peek(std::size_t ahead = 1) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  token take() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  bool is_op(std::string_view op) const { return cur().kind == token_kind::op && cur().text == op; }
  bool is_name(std::string_view n) const { return cur().kind == token_kind::name && cur().text == n; }
  bool accept_op(std::string_view op) {
    if (!is_op(op)) return false;
    ++i_;
    return true;
  }
  bool accept_name(std::string_view n) {
    if (!is_name(n)) return false;
    ++i_;
    return true;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw template_error{what, cur().line};
  }
  std::string describe() const {
    switch (cur().kind) {
      case token_kind::end: return "the end of the template";
      case token_kind::block_end: return "'%}'";
      case token_kind::var_end: return "'}}'";
      case token_kind::text: return "template text";
      default: return "'" + cur().text + "'";
    }
  }
  void expect_op(std::string_view op) {
    if (!accept_op(op)) fail("expected '" + std::string(op) + "', found " + describe());
  }
  std::string expect_name() {
    if (cur().kind != token_kind::name) fail("expected a name, found " + describe());
    return take().text;
  }
  void expect_block_end() {
    if (cur().kind != token_kind::block_end) fail("expected '%}', found " + describe());
    ++i_;
  }

  // ---- statements ----

  // Statements until a block tag whose keyword is in `ends` (returned in `found`, the tag's
  // begin and keyword consumed); at the top level (`ends` empty) until the end.
  body statements(std::initializer_list<std::string_view> ends, std::string& found) {
    body out;
    for (;;) {
      const token& tk = cur();
      if (tk.kind == token_kind::end) {
        if (ends.size() == 0) return out;
        fail("the template ended inside a block: expected '" + std::string(*ends.begin()) + "'");
      }
      if (tk.kind == token_kind::text) {
        out.push_back(std::make_unique<stmt>(stmt{.k = stmt::kind::text, .line = tk.line, .text = tk.text}));
        ++i_;
        continue;
      }
      if (tk.kind == token_kind::var_begin) {
        const int line = tk.line;
        ++i_;
        auto e = expression();
        if (cur().kind != token_kind::var_end) fail("expected '}}', found " + describe());
        ++i_;
        out.push_back(std::make_unique<stmt>(stmt{.k = stmt::kind::output, .line = line, .e = std::move(e)}));
        continue;
      }
      if (tk.kind != token_kind::block_begin) fail("unexpected " + describe());
      ++i_;
      const int line = cur().line;
      const std::string keyword = expect_name();
      if (std::find(ends.begin(), ends.end(), keyword) != ends.end()) {
        found = keyword;
        return out;
      }
      if (keyword == "generation") {  // transformers' assistant-mask block: its body renders as is
        expect_block_end();
        std::string end;
        for (auto& s : statements({"endgeneration"}, end)) out.push_back(std::move(s));
        expect_block_end();
        continue;
      }
      out.push_back(statement(keyword, line));
    }
  }

  stmt_ptr statement(const std::string& keyword, int line) {
    depth_guard g(depth_, *this);  // blocks nest as deep as expressions may
    auto s = std::make_unique<stmt>(stmt{.k = stmt::kind::text, .line = line});
    std::string end;
    if (keyword == "if") {
      s->k = stmt::kind::if_;
      auto cond = expression();
      for (;;) {
        expect_block_end();
        body b = statements({"elif", "else", "endif"}, end);
        s->branches.emplace_back(std::move(cond), std::move(b));
        if (end != "elif") break;
        cond = expression();
      }
      if (end == "else") {
        expect_block_end();
        s->else_body = statements({"endif"}, end);
      }
      expect_block_end();
    } else if (keyword == "for") {
      s->k = stmt::kind::for_;
      s->names = targets();
      if (!accept_name("in")) fail("expected 'in' after the loop variable, found " + describe());
      s->e = expression(false);
      if (accept_name("if")) s->cond = expression(false);
      if (accept_name("recursive")) fail("recursive loops are not supported");
      expect_block_end();
      s->main = statements({"else", "endfor"}, end);
      if (end == "else") {
        expect_block_end();
        s->else_body = statements({"endfor"}, end);
      }
      expect_block_end();
    } else if (keyword == "set") {
      s->names = targets();
      if (s->names.size() == 1 && accept_op(".")) s->attr = expect_name();
      if (accept_op("=")) {
        s->k = stmt::kind::set;
        s->e = expression();
        if (is_op(",")) {  // set a, b = x, y
          std::vector<expr_ptr> items;
          items.push_back(std::move(s->e));
          while (accept_op(",") && cur().kind != token_kind::block_end) items.push_back(expression());
          s->e = std::make_unique<expr>(expr{.k = expr::kind::tuple, .line = line, .args = std::move(items)});
        }
        expect_block_end();
      } else {
        if (s->names.size() != 1 || !s->attr.empty()) fail("a set block assigns one name");
        s->k = stmt::kind::set_block;
        expect_block_end();
        s->main = statements({"endset"}, end);
        expect_block_end();
      }
    } else if (keyword == "macro") {
      s->k = stmt::kind::macro;
      s->name = expect_name();
      s->params = parameters();
      expect_block_end();
      s->main = statements({"endmacro"}, end);
      if (cur().kind == token_kind::name) ++i_;  // {% endmacro name %}
      expect_block_end();
    } else if (keyword == "call") {
      s->k = stmt::kind::call_block;
      if (is_op("(")) s->params = parameters();
      s->e = expression();
      if (s->e->k != expr::kind::call) fail("a call block needs a macro call");
      expect_block_end();
      s->main = statements({"endcall"}, end);
      expect_block_end();
    } else if (keyword == "filter") {
      s->k = stmt::kind::filter_block;
      auto placeholder = std::make_unique<expr>(expr{.k = expr::kind::name, .line = line, .name = "\x01body"});
      s->e = filters(std::move(placeholder), true);
      expect_block_end();
      s->main = statements({"endfilter"}, end);
      expect_block_end();
    } else if (keyword == "break" || keyword == "continue") {
      s->k = keyword == "break" ? stmt::kind::break_ : stmt::kind::continue_;
      expect_block_end();
    } else {
      throw template_error{"unknown tag '" + keyword + "'", line};
    }
    return s;
  }

  // `a` or `a, b` (optionally in parentheses).
  std::vector<std::string> targets() {
    std::vector<std::string> names;
    const bool paren = accept_op("(");
    do {
      names.push_back(expect_name());
    } while (accept_op(",") && cur().kind == token_kind::name);
    if (paren) expect_op(")");
    return names;
  }

  // (a, b=default, ...)
  std::vector<std::pair<std::string, expr_ptr>> parameters() {
    std::vector<std::pair<std::string, expr_ptr>> params;
    expect_op("(");
    while (!accept_op(")")) {
      std::string n = expect_name();
      expr_ptr dflt;
      if (accept_op("=")) dflt = expression();
      params.emplace_back(std::move(n), std::move(dflt));
      if (!is_op(")")) expect_op(",");
    }
    return params;
  }

  // ---- expressions (jinja2's precedence) ----

  expr_ptr node(expr::kind k, int line, std::vector<expr_ptr> args, std::string name = {}) {
    return std::make_unique<expr>(expr{.k = k, .line = line, .name = std::move(name), .args = std::move(args)});
  }
  template <class... E>
  static std::vector<expr_ptr> list_of(E&&... e) {
    std::vector<expr_ptr> v;
    (v.push_back(std::forward<E>(e)), ...);
    return v;
  }

  struct depth_guard {
    int& d;
    explicit depth_guard(int& depth, const parser& p) : d(depth) {
      if (++d > max_nesting) p.fail("expressions nest too deeply");
    }
    ~depth_guard() { --d; }
  };

  expr_ptr expression(bool with_condition = true) {
    depth_guard g(depth_, *this);
    auto e = or_expr();
    while (with_condition && is_name("if")) {
      const int line = take().line;
      auto cond = or_expr();
      expr_ptr otherwise;
      if (accept_name("else")) otherwise = expression();
      e = node(expr::kind::cond, line, list_of(std::move(e), std::move(cond), std::move(otherwise)));
    }
    return e;
  }

  expr_ptr or_expr() {
    auto e = and_expr();
    while (is_name("or")) {
      const int line = take().line;
      e = node(expr::kind::or_, line, list_of(std::move(e), and_expr()));
    }
    return e;
  }

  expr_ptr and_expr() {
    auto e = not_expr();
    while (is_name("and")) {
      const int line = take().line;
      e = node(expr::kind::and_, line, list_of(std::move(e), not_expr()));
    }
    return e;
  }

  expr_ptr not_expr() {
    if (is_name("not")) {
      depth_guard g(depth_, *this);
      const int line = take().line;
      return node(expr::kind::not_, line, list_of(not_expr()));
    }
    return compare();
  }

  expr_ptr compare() {
    auto e = math1();
    for (;;) {
      const int line = cur().line;
      std::string op;
      if (cur().kind == token_kind::op &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">="))) {
        op = take().text;
      } else if (accept_name("in")) {
        op = "in";
      } else if (is_name("not") && peek().kind == token_kind::name && peek().text == "in") {
        i_ += 2;
        op = "notin";
      } else {
        return e;
      }
      e = node(expr::kind::binary, line, list_of(std::move(e), math1()), op);
    }
  }

  expr_ptr math1() {
    auto e = concat();
    while (is_op("+") || is_op("-")) {
      const token op = take();
      e = node(expr::kind::binary, op.line, list_of(std::move(e), concat()), op.text);
    }
    return e;
  }

  expr_ptr concat() {
    auto e = math2();
    while (is_op("~")) {
      const int line = take().line;
      e = node(expr::kind::binary, line, list_of(std::move(e), math2()), "~");
    }
    return e;
  }

  expr_ptr math2() {
    auto e = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const token op = take();
      e = node(expr::kind::binary, op.line, list_of(std::move(e), power()), op.text);
    }
    return e;
  }

  expr_ptr power() {
    auto e = unary(true);
    while (is_op("**")) {
      const int line = take().line;
      e = node(expr::kind::binary, line, list_of(std::move(e), unary(true)), "**");
    }
    return e;
  }

  expr_ptr unary(bool with_filter) {
    depth_guard g(depth_, *this);
    const int line = cur().line;
    expr_ptr e;
    if (accept_op("-")) {
      e = node(expr::kind::neg, line, list_of(unary(false)));
    } else if (accept_op("+")) {
      e = node(expr::kind::pos, line, list_of(unary(false)));
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    return with_filter ? filters(std::move(e), false) : std::move(e);
  }

  expr_ptr primary() {
    const token tk = take();
    switch (tk.kind) {
      case token_kind::name: {
        if (tk.text == "true" || tk.text == "True") return literal(value(true), tk.line);
        if (tk.text == "false" || tk.text == "False") return literal(value(false), tk.line);
        if (tk.text == "none" || tk.text == "None") return literal(value(nullptr), tk.line);
        return std::make_unique<expr>(expr{.k = expr::kind::name, .line = tk.line, .name = tk.text});
      }
      case token_kind::string: {
        std::string s = tk.text;
        while (cur().kind == token_kind::string) s += take().text;  // "a" "b" is "ab"
        return literal(value(std::move(s)), tk.line);
      }
      case token_kind::integer: {
        std::int64_t i = 0;
        const auto [p, ec] = std::from_chars(tk.text.data(), tk.text.data() + tk.text.size(), i);
        if (ec != std::errc()) fail("the integer " + tk.text + " is too large");
        return literal(value(i), tk.line);
      }
      case token_kind::floating: return literal(value(std::stod(tk.text)), tk.line);
      case token_kind::op: {
        if (tk.text == "(") {
          if (accept_op(")")) return node(expr::kind::tuple, tk.line, {});
          auto e = expression();
          if (!is_op(",")) {
            expect_op(")");
            return e;
          }
          std::vector<expr_ptr> items;
          items.push_back(std::move(e));
          while (accept_op(",") && !is_op(")")) items.push_back(expression());
          expect_op(")");
          return node(expr::kind::tuple, tk.line, std::move(items));
        }
        if (tk.text == "[") {
          std::vector<expr_ptr> items;
          while (!accept_op("]")) {
            items.push_back(expression());
            if (!is_op("]")) expect_op(",");
          }
          return node(expr::kind::list, tk.line, std::move(items));
        }
        if (tk.text == "{") {
          std::vector<expr_ptr> items;
          while (!accept_op("}")) {
            items.push_back(expression());
            expect_op(":");
            items.push_back(expression());
            if (!is_op("}")) expect_op(",");
          }
          return node(expr::kind::dict, tk.line, std::move(items));
        }
        break;
      }
      default: break;
    }
    --i_;
    fail("unexpected " + describe());
  }

  expr_ptr literal(value v, int line) {
    return std::make_unique<expr>(expr{.k = expr::kind::literal, .line = line, .lit = std::move(v)});
  }

  expr_ptr postfix(expr_ptr e) {
    for (;;) {
      const int line = cur().line;
      if (accept_op(".")) {
        if (cur().kind == token_kind::integer) {
          e = node(expr::kind::item, line, list_of(std::move(e), primary()));
        } else {
          e = node(expr::kind::attr, line, list_of(std::move(e)), expect_name());
        }
      } else if (accept_op("[")) {
        e = subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  expr_ptr subscript(expr_ptr e, int line) {
    std::vector<expr_ptr> parts(3);
    bool is_slice = false;
    if (!is_op(":")) parts[0] = expression();
    if (accept_op(":")) {
      is_slice = true;
      if (!is_op(":") && !is_op("]")) parts[1] = expression();
      if (accept_op(":") && !is_op("]")) parts[2] = expression();
    }
    expect_op("]");
    if (!is_slice) return node(expr::kind::item, line, list_of(std::move(e), std::move(parts[0])));
    return node(expr::kind::slice, line,
                list_of(std::move(e), std::move(parts[0]), std::move(parts[1]), std::move(parts[2])));
  }

  // callee(args, name=value, ...)
  expr_ptr call(expr_ptr callee) {
    const int line = cur().line;
    auto c = node(expr::kind::call, line, list_of(std::move(callee)));
    arguments(*c);
    return c;
  }

  void arguments(expr& into) {
    expect_op("(");
    while (!accept_op(")")) {
      if (cur().kind == token_kind::name && peek().kind == token_kind::op && peek().text == "=") {
        std::string key = take().text;
        ++i_;
        into.kwargs.emplace_back(std::move(key), expression());
      } else {
        if (!into.kwargs.empty()) fail("a positional argument follows a keyword argument");
        into.args.push_back(expression());
      }
      if (!is_op(")")) expect_op(",");
    }
  }

  // | filter(args) and `is [not] test(args)`, and calls on their results; a filter block starts
  // right at the filter's name.
  expr_ptr filters(expr_ptr e, bool first_is_filter) {
    for (bool pending = first_is_filter;; pending = false) {
      const int line = cur().line;
      if (pending || accept_op("|")) {
        std::string name = expect_name();
        while (accept_op(".")) name += "." + expect_name();
        auto f = node(expr::kind::filter, line, list_of(std::move(e)), name);
        if (is_op("(")) arguments(*f);
        e = std::move(f);
      } else if (accept_name("is")) {
        const bool negated = accept_name("not");
        auto t = node(expr::kind::test, line, list_of(std::move(e)), expect_name());
        t->negated = negated;
        if (is_op("(")) {
          arguments(*t);
        } else if ((cur().kind == token_kind::name || cur().kind == token_kind::string ||
                    cur().kind == token_kind::integer || cur().kind == token_kind::floating || is_op("[") ||
                    is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") && !is_name("is")) {
          t->args.push_back(postfix(primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::vector<token> t_;
  std::size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

body parse(std::string_view source) { return parser(tokenize(source)).run(); }

}  // namespace anvil::model::jinja
