// Fuzz target: structured output's compilers on arbitrary request text (`regex`, a
// `response_format` schema and `grammar` all come from clients). The first byte picks which; the
// rest is the pattern, the schema's JSON or the GBNF source. Checked: each compiles or throws
// structured_error (the engine turns it into a 400 naming the field); no other exception, crash,
// hang or huge allocation. The automaton is capped lower than the engine's so that a single input
// stays fast under the sanitizers; every compiled automaton is walked over the input's bytes.
#include <cstdint>
#include <string>
#include <string_view>

#include "sampler/structured/gbnf.h"
#include "sampler/structured/json_schema.h"
#include "sampler/structured/regex.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace anvil::sampler::structured;
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  constexpr std::int32_t max_states = 2000;
  try {
    std::string pattern;
    switch (data[0] % 3) {
      case 0: pattern = std::string(text); break;
      case 1: pattern = json_schema_regex_of(text); break;
      default: pattern = gbnf_regex(text, 2); break;
    }
    const dfa d = compile_regex(pattern, max_states);
    (void)d.walk(d.start, text);
  } catch (const structured_error&) {
  }
  return 0;
}
