// A Jinja template, parsed once and rendered many times: the interpreter anvil runs a model's
// chat template with. It implements the subset of Jinja2 Hugging Face chat templates use, as
// transformers' apply_chat_template configures it (ImmutableSandboxedEnvironment, trim_blocks,
// lstrip_blocks, loopcontrols, the `tojson`, `raise_exception` and `strftime_now` additions), so
// a rendering is byte for byte what transformers produces (tests/data/chat/goldens.json).
//
// Templates come from model files and are untrusted: parsing bounds nesting, rendering bounds
// output size, loop iterations and macro depth, and every failure is a template_error with the
// line it happened on, never a crash.
#pragma once

#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/chat/jinja/value.h"

namespace anvil::model::jinja {

struct stmt;

struct render_limits {
  std::size_t max_output_bytes = std::size_t(32) << 20;
  std::size_t max_steps = 1'000'000;  // statements executed + loop iterations
  int max_call_depth = 64;             // nested macro calls
};

class template_program {
 public:
  // Throws template_error (with its line) for a syntax error.
  explicit template_program(std::string_view source);

  // Renders with `variables` as the template's context; `now` is what strftime_now formats.
  // Throws template_error (with its line) for an error the template makes or raises.
  std::string render(const std::vector<std::pair<std::string, value>>& variables, const std::tm& now,
                     const render_limits& limits = {}) const;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<stmt>>> body_;
};

}  // namespace anvil::model::jinja
