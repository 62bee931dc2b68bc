// Template source → tokens, with Jinja's whitespace rules as transformers configures them:
// trim_blocks (the first newline after a block tag or comment goes), lstrip_blocks (spaces and
// tabs before a block tag or comment on its own line go), `-` on a tag's side strips all
// whitespace on that side, `+` turns the two options off for that side; newlines become "\n"
// and one trailing newline of the source is dropped (keep_trailing_newline=False).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace anvil::model::jinja {

enum class token_kind {
  text,         // template text, printed as it is
  block_begin,  // {%
  block_end,    // %}
  var_begin,    // {{
  var_end,      // }}
  name,         // identifiers and keywords (if, for, and, not, true, none, ...)
  string,       // a string literal, escapes decoded
  integer,
  floating,
  op,           // operators and punctuation: + - * / // % ** ~ == != < <= > >= = . , : | ( ) [ ] { }
  end,          // end of the template
};

struct token {
  token_kind kind;
  std::string text;  // the text, name, literal value or operator
  int line = 1;      // 1-based line of the token's start in the source
};

// Throws template_error ("line N: ...") for an unterminated tag, comment or string literal.
std::vector<token> tokenize(std::string_view source);

}  // namespace anvil::model::jinja
