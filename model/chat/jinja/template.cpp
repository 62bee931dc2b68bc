// The interpreter: statements run in scopes as Jinja's do (a for loop's or a macro's assignments
// stay inside it; `if` opens no scope; namespace() objects carry values out of loops).
#include "model/chat/jinja/template.h"

#include <unordered_map>

#include "model/chat/jinja/ast.h"
#include "model/chat/jinja/builtins.h"
#include "model/chat/jinja/parser.h"

namespace anvil::model::jinja {
namespace {

// Whether a namespace() object is inside `v` (or is `v`).
bool holds_namespace(const value& v) {
  if (v.is_dict()) {
    if (v.as_dict().is_namespace) return true;
    for (const auto& kv : v.as_dict().items) {
      if (holds_namespace(kv.second)) return true;
    }
  } else if (v.is_list()) {
    for (const value& x : v.as_list().items) {
      if (holds_namespace(x)) return true;
    }
  }
  return false;
}

class renderer {
 public:
  renderer(const std::vector<std::pair<std::string, value>>& variables, const std::tm& now, const render_limits& limits)
      : now_(now), limits_(limits) {
    frames_.emplace_back();
    for (const auto& [k, v] : variables) frames_[0][k] = v;
    frames_.emplace_back();  // the template's own top-level assignments
  }

  std::string run(const body& b) {
    std::string out;
    exec(b, out);
    return out;
  }

 private:
  enum class flow { normal, break_, continue_ };
  using frame = std::unordered_map<std::string, value>;

  // ---- scopes ----

  value lookup(const std::string& name) {
    for (std::size_t i = frames_.size(); i-- > base_;) {
      if (auto it = frames_[i].find(name); it != frames_[i].end()) return it->second;
    }
    for (std::size_t i : {std::size_t(1), std::size_t(0)}) {
      if (i >= base_) continue;
      if (auto it = frames_[i].find(name); it != frames_[i].end()) return it->second;
    }
    return global_value(name, now_);
  }
  void assign(const std::string& name, value v) { frames_.back()[name] = std::move(v); }

  struct frame_guard {
    renderer& r;
    std::size_t saved_base;
    frame_guard(renderer& rr, bool isolated) : r(rr), saved_base(rr.base_) {
      r.frames_.emplace_back();
      if (isolated) r.base_ = r.frames_.size() - 1;
    }
    ~frame_guard() {
      r.frames_.pop_back();
      r.base_ = saved_base;
    }
  };

  void step() {
    if (++steps_ > limits_.max_steps) throw template_error{"the template runs too long (more than " + std::to_string(limits_.max_steps) + " steps)"};
  }
  void append(std::string& out, std::string_view s) {
    if (out.size() + s.size() > limits_.max_output_bytes) {
      throw template_error{"the template's output passes " + std::to_string(limits_.max_output_bytes) + " bytes"};
    }
    out += s;
  }

  // ---- statements ----

  flow exec(const body& b, std::string& out) {
    for (const stmt_ptr& s : b) {
      const flow f = exec_at(*s, out);
      if (f != flow::normal) return f;
    }
    return flow::normal;
  }

  flow exec_at(const stmt& s, std::string& out) {
    try {
      return exec(s, out);
    } catch (template_error& e) {
      if (e.line == 0) e.line = s.line;
      throw;
    }
  }

  flow exec(const stmt& s, std::string& out) {
    step();
    switch (s.k) {
      case stmt::kind::text: append(out, s.text); break;
      case stmt::kind::output: append(out, to_str(eval(*s.e))); break;
      case stmt::kind::if_:
        for (const auto& [cond, b] : s.branches) {
          if (eval(*cond).truthy()) return exec(b, out);
        }
        return exec(s.else_body, out);
      case stmt::kind::for_: return loop(s, out);
      case stmt::kind::set: assign_targets(s, eval(*s.e)); break;
      case stmt::kind::set_block: {
        std::string captured;
        exec(s.main, captured);
        assign(s.names[0], value(std::move(captured)));
        break;
      }
      case stmt::kind::macro: assign(s.name, macro(s, s.name)); break;
      case stmt::kind::call_block: {
        frame_guard g(*this, false);
        assign("caller", macro(s, "caller"));
        append(out, to_str(eval(*s.e)));
        break;
      }
      case stmt::kind::filter_block: {
        std::string captured;
        exec(s.main, captured);
        frame_guard g(*this, false);
        assign("\x01body", value(std::move(captured)));
        append(out, to_str(eval(*s.e)));
        break;
      }
      case stmt::kind::break_: return flow::break_;
      case stmt::kind::continue_: return flow::continue_;
    }
    return flow::normal;
  }

  void assign_targets(const stmt& s, value v) {
    if (!s.attr.empty()) {
      const value target = lookup(s.names[0]);
      if (!target.is_dict() || !target.as_dict().is_namespace) {
        throw template_error{"TemplateRuntimeError: cannot assign attribute on non-namespace object"};
      }
      if (holds_namespace(v)) {  // could close a cycle, which nothing would free or print
        throw template_error{"a namespace attribute may not hold a namespace"};
      }
      target.as_dict().set(s.attr, std::move(v));
      return;
    }
    if (s.names.size() == 1) return assign(s.names[0], std::move(v));
    unpack(s.names, v);
  }

  void unpack(const std::vector<std::string>& names, const value& v) {
    const std::vector<value> items = iterate(v);
    if (items.size() != names.size()) {
      throw template_error{"ValueError: expected " + std::to_string(names.size()) + " values to unpack, got " +
                           std::to_string(items.size())};
    }
    for (std::size_t i = 0; i < names.size(); ++i) assign(names[i], items[i]);
  }

  flow loop(const stmt& s, std::string& out) {
    const value seq = eval(*s.e);
    if (seq.is_none() || seq.is_number() || seq.is_callable()) {
      throw template_error{"TypeError: '" + std::string(seq.type_name()) + "' object is not iterable"};
    }
    std::vector<value> items = iterate(seq);
    frame_guard g(*this, false);
    if (s.cond) {  // `for x in xs if cond`: filtered before loop.index counts
      std::vector<value> kept;
      for (const value& item : items) {
        bind(s.names, item);
        if (eval(*s.cond).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const std::int64_t n = std::int64_t(items.size());
    for (std::int64_t i = 0; i < n; ++i) {
      step();
      bind(s.names, items[std::size_t(i)]);
      value prev = i > 0 ? items[std::size_t(i - 1)] : value(undefined{"there is no previous item"});
      value next = i + 1 < n ? items[std::size_t(i + 1)] : value(undefined{"there is no next item"});
      value loop_obj = value::dict({{"index", value(i + 1)},
                                    {"index0", value(i)},
                                    {"revindex", value(n - i)},
                                    {"revindex0", value(n - i - 1)},
                                    {"first", value(i == 0)},
                                    {"last", value(i == n - 1)},
                                    {"length", value(n)},
                                    {"depth", value(std::int64_t(1))},
                                    {"depth0", value(std::int64_t(0))},
                                    {"previtem", std::move(prev)},
                                    {"nextitem", std::move(next)},
                                    {"cycle", value::function("cycle", [i](call_args& a) -> value {
                                       if (a.positional.empty()) throw template_error{"TypeError: no items for cycling given"};
                                       return a.positional[std::size_t(i) % a.positional.size()];
                                     })}});
      assign("loop", std::move(loop_obj));
      if (exec(s.main, out) == flow::break_) break;
    }
    if (n == 0) exec(s.else_body, out);
    return flow::normal;
  }

  void bind(const std::vector<std::string>& names, const value& item) {
    if (names.size() == 1) {
      assign(names[0], item);
    } else {
      unpack(names, item);
    }
  }

  // A macro (or a call block's `caller`) as a function value: arguments bound in a scope of its
  // own, which sees the template's top-level names, not the caller's locals.
  value macro(const stmt& s, const std::string& name) {
    const stmt* def = &s;
    return value::function(name, [this, def, name](call_args& a) -> value {
      if (++call_depth_ > limits_.max_call_depth) {
        --call_depth_;
        throw template_error{"macro calls nest deeper than " + std::to_string(limits_.max_call_depth)};
      }
      struct depth_restore {
        int& d;
        ~depth_restore() { --d; }
      } restore{call_depth_};
      frame_guard g(*this, true);
      if (a.positional.size() > def->params.size()) {
        throw template_error{"TypeError: macro '" + name + "' takes not more than " + std::to_string(def->params.size()) +
                             " argument(s)"};
      }
      for (std::size_t i = 0; i < def->params.size(); ++i) {
        const std::string& pname = def->params[i].first;
        const expr_ptr& dflt = def->params[i].second;
        value v;
        if (i < a.positional.size()) {
          v = a.positional[i];
        } else if (auto it = std::find_if(a.keywords.begin(), a.keywords.end(), [&](const auto& kw) { return kw.first == pname; });
                   it != a.keywords.end()) {
          v = it->second;
        } else if (dflt) {
          v = eval(*dflt);
        } else {
          v = value(undefined{"'" + pname + "' is undefined"});
        }
        assign(pname, std::move(v));
      }
      std::string out;
      exec(def->main, out);
      return value(std::move(out));
    });
  }

  // ---- expressions ----

  value eval(const expr& e) {
    try {
      return eval_here(e);
    } catch (template_error& err) {
      if (err.line == 0) err.line = e.line;
      throw;
    }
  }

  value eval_here(const expr& e) {
    switch (e.k) {
      case expr::kind::literal: return e.lit;
      case expr::kind::name: {
        value v = lookup(e.name);
        if (v.is_undefined() && std::get<undefined>(v.v).hint.empty()) v = value(undefined{"'" + e.name + "' is undefined"});
        return v;
      }
      case expr::kind::list:
      case expr::kind::tuple: {
        std::vector<value> items;
        items.reserve(e.args.size());
        for (const expr_ptr& a : e.args) items.push_back(eval(*a));
        return value::list(std::move(items), e.k == expr::kind::tuple);
      }
      case expr::kind::dict: {
        auto d = std::make_shared<dict_value>();
        for (std::size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const value k = eval(*e.args[i]);
          if (!k.is_string()) throw template_error{"dict literals take string keys, not " + std::string(k.type_name())};
          d->set(k.str(), eval(*e.args[i + 1]));
        }
        return value(std::move(d));
      }
      case expr::kind::attr: return get_attribute(eval(*e.args[0]), e.name);
      case expr::kind::item: return get_item(eval(*e.args[0]), eval(*e.args[1]));
      case expr::kind::slice: {
        const auto part = [&](std::size_t i) { return e.args[i] ? eval(*e.args[i]) : value(nullptr); };
        return get_slice(eval(*e.args[0]), part(1), part(2), part(3));
      }
      case expr::kind::call: {
        const value callee = eval(*e.args[0]);
        require_defined(callee);
        if (!callee.is_callable()) throw template_error{"TypeError: '" + std::string(callee.type_name()) + "' object is not callable"};
        call_args a = arguments(e);
        return callee.as_callable().call(a);
      }
      case expr::kind::filter: {
        const value operand = eval(*e.args[0]);
        call_args a = arguments(e);
        return apply_filter(e.name, operand, a);
      }
      case expr::kind::test: {
        const value operand = eval(*e.args[0]);
        call_args a = arguments(e);
        return value(apply_test(e.name, operand, a) != e.negated);
      }
      case expr::kind::neg:
      case expr::kind::pos: {
        const value x = eval(*e.args[0]);
        require_defined(x);
        if (!x.is_number()) throw template_error{"TypeError: bad operand type for unary " + std::string(e.k == expr::kind::neg ? "-" : "+") + ": '" + std::string(x.type_name()) + "'"};
        if (e.k == expr::kind::pos) return x.is_bool() ? value(std::int64_t(std::get<bool>(x.v))) : x;
        if (x.is_float()) return value(-x.as_double());
        return value(-std::int64_t(x.as_double()));
      }
      case expr::kind::not_: return value(!eval(*e.args[0]).truthy());
      case expr::kind::and_: {
        value l = eval(*e.args[0]);
        return l.truthy() ? eval(*e.args[1]) : l;
      }
      case expr::kind::or_: {
        value l = eval(*e.args[0]);
        return l.truthy() ? l : eval(*e.args[1]);
      }
      case expr::kind::cond:
        if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : value(undefined{"the condition was false and there is no else"});
      case expr::kind::binary: return binary_op(e.name, eval(*e.args[0]), eval(*e.args[1]));
    }
    return value();
  }

  // The arguments of a call, filter or test: args[1..] positional, then keywords.
  call_args arguments(const expr& e) {
    call_args a;
    for (std::size_t i = 1; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) a.keywords.emplace_back(k, eval(*v));
    return a;
  }

  std::vector<frame> frames_;
  std::size_t base_ = 2;  // frames below this (but 0 and 1) are hidden: a macro's caller's locals
  std::tm now_;
  render_limits limits_;
  std::size_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace

template_program::template_program(std::string_view source)
    : body_(std::make_shared<const body>(parse(source))) {}

std::string template_program::render(const std::vector<std::pair<std::string, value>>& variables, const std::tm& now,
                                     const render_limits& limits) const {
  renderer r(variables, now, limits);
  return r.run(*body_);
}

}  // namespace anvil::model::jinja
