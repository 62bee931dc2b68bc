// Tokens → statements: Jinja's grammar (the operator precedence of jinja2's parser) for the
// statements chat templates use: if / elif / else, for (with `if`, `else`, tuple targets), set
// (names, tuples, namespace attributes, blocks), macro, call, filter, break / continue, and
// transformers' `generation` block (rendered as its body).
#pragma once

#include <string_view>

#include "model/chat/jinja/ast.h"

namespace anvil::model::jinja {

// Throws template_error ("line N: ...") for a syntax error.
body parse(std::string_view source);

}  // namespace anvil::model::jinja
