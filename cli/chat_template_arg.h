// `--chat-template FILE` (serve, generate): a Jinja chat template that overrides the one the GGUF
// carries (or gives one to a file without), read at start-up; an unreadable or empty file stops
// the command with a message naming it, and a template that does not parse stops the engine.
#pragma once

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

namespace anvil::cli {

inline void add_chat_template_option(CLI::App* cmd, std::string& path) {
  cmd->add_option("--chat-template", path,
                  "Jinja chat template file used instead of the model's tokenizer.chat_template (as in "
                  "transformers' tokenizer_config.json)");
}

// The source in `path`, or "" when no path was given.
inline std::string read_chat_template_file(const std::string& path) {
  if (path.empty()) return {};
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("--chat-template: cannot read " + path);
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty()) throw std::runtime_error("--chat-template: " + path + " is empty");
  return text.str();
}

}  // namespace anvil::cli
