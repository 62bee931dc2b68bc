// The `anvil` command: subcommands live in cli/cmd_*.cpp. Errors at this edge print one line
// ("anvil: ...") and exit non-zero; nothing else is thrown past here.
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "actors/log.h"
#include "cli/build_info.h"
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"anvil: an LLM inference runtime for GGUF models"};
  app.set_version_flag("--version", std::string("anvil ") + anvil::build_info::version);
  app.add_option("--log-level", "trace, debug, info, warn, error, critical or off (default info)")
      ->each([](const std::string& level) {
        if (!anvil::log::set_level(level)) throw CLI::ValidationError("--log-level", "unknown level '" + level + "'");
      });
  app.require_subcommand(0, 1);

  int exit_code = 0;
  anvil::cli::add_info_command(app, exit_code);
  anvil::cli::add_inspect_command(app, exit_code);
  anvil::cli::add_synth_command(app, exit_code);
  anvil::cli::add_generate_command(app, exit_code);
  anvil::cli::add_serve_command(app, exit_code);
  anvil::cli::add_perplexity_command(app, exit_code);

  try {
    app.parse(argc, argv);
    if (app.get_subcommands().empty()) std::fputs(app.help().c_str(), stdout);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "anvil: %s\n", e.what());
    return 1;
  }
  return exit_code;
}
