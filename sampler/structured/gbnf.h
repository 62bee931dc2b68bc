// Grammars in GBNF (the BNF dialect llama.cpp's `grammar` field reads) as regular expressions
// (regex.h), so a `grammar` request is decoded through the same byte DFA and token masks as a
// regex.
//
// Syntax: rules `name ::= body`, one per `::=` (a body may span lines); `root` is the start.
// A body is alternatives (`|`) of sequences of: "literals" and [classes] / [^negated] with the
// escapes \n \r \t \\ \" \] \- \xHH \uHHHH \UHHHHHHHH, `.` (any character), rule names, groups
// ( ), and the repeats * + ? {m} {m,} {m,n}. `#` starts a comment.
//
// Recursion: a rule that refers back to itself, directly or through others, is unrolled: any one
// rule appears at most `max_nesting` times inside itself (the alternatives that would go deeper
// are left out), so every output matches the grammar and nesting deeper than that is not
// generated, the bound JSON schemas' `$ref` has too. A rule whose every alternative needs deeper
// nesting (no way out) is refused, as are undefined names, chains of rules more than 100 deep and
// grammars whose unrolled expression exceeds 4 MB.
#pragma once

#include <string>
#include <string_view>

#include "sampler/structured/regex.h"

namespace anvil::sampler::structured {

// Throws structured_error naming the problem (and the line) for a grammar it cannot compile.
std::string gbnf_regex(std::string_view grammar, int max_nesting);

// The grammar's automaton with the deepest nesting, up to 3, whose automaton fits (regex.h's
// state limit): llama.cpp's json.gbnf gets 3 levels per rule (11,764 states, ~0.2 s to build).
dfa compile_gbnf(std::string_view grammar);

}  // namespace anvil::sampler::structured
