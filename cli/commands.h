// The `anvil` subcommands. Each adds itself to the app and runs from CLI11's callback; the exit
// code lands in `exit_code`. Errors at this edge (bad files, bad options) print one clear line.
#pragma once

#include <CLI/CLI.hpp>

namespace anvil::cli {

void add_info_command(CLI::App& app, int& exit_code);
void add_inspect_command(CLI::App& app, int& exit_code);
void add_synth_command(CLI::App& app, int& exit_code);
void add_generate_command(CLI::App& app, int& exit_code);
void add_serve_command(CLI::App& app, int& exit_code);
void add_perplexity_command(CLI::App& app, int& exit_code);

}  // namespace anvil::cli
