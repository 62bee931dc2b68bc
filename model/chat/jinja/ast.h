// The parsed form of a template: expressions and statements, each with its source line.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/chat/jinja/value.h"

namespace anvil::model::jinja {

struct expr;
using expr_ptr = std::unique_ptr<expr>;

struct expr {
  enum class kind {
    literal,  // lit
    name,     // name
    list,     // args: items
    tuple,    // args: items
    dict,     // args: key, value, key, value, ...
    attr,     // args[0].name
    item,     // args[0][args[1]]
    slice,    // args[0][args[1]:args[2]:args[3]] (null parts omitted)
    call,     // args[0](args[1..], kwargs)
    filter,   // args[0] | name(args[1..], kwargs)
    test,     // args[0] is [not] name(args[1..])
    neg,      // -args[0]
    pos,      // +args[0]
    not_,     // not args[0]
    binary,   // args[0] <name> args[1]: + - * / // % ** ~ == != < <= > >= in notin
    and_,     // args[0] and args[1]
    or_,      // args[0] or args[1]
    cond,     // args[0] if args[1] else args[2] (args[2] may be null)
  };
  kind k;
  int line = 0;
  value lit{};
  std::string name{};
  std::vector<expr_ptr> args{};
  std::vector<std::pair<std::string, expr_ptr>> kwargs{};
  bool negated = false;  // test: `is not`
};

struct stmt;
using stmt_ptr = std::unique_ptr<stmt>;
using body = std::vector<stmt_ptr>;

struct stmt {
  enum class kind {
    text,        // text
    output,      // {{ e }}
    if_,         // branches (cond, body) in order; else_body
    for_,        // for names in e [if cond]: main; else_body
    set,         // set names = e, or set names[0].attr = e
    set_block,   // set names[0] %} main {% endset
    macro,       // macro name(params) main
    call_block,  // call e %} main {% endcall: e is a call; `caller()` renders main
    filter_block,// filter e %} main {% endfilter: e is a filter applied to the rendered main
    break_,
    continue_,
  };
  kind k;
  int line = 0;
  std::string text{};
  expr_ptr e{};
  std::vector<std::string> names{};
  std::string attr{};
  std::string name{};
  expr_ptr cond{};
  std::vector<std::pair<expr_ptr, body>> branches{};
  body main{};
  body else_body{};
  std::vector<std::pair<std::string, expr_ptr>> params{};  // macro parameters and their defaults
};

}  // namespace anvil::model::jinja
