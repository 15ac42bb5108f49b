// The `desloc report` subcommand: its options, and running it. main.cpp registers it with
// add_report_command and, when it was chosen, calls run_report_command inside its try block.
#pragma once

namespace CLI {
class App;
}

namespace desloc::cli {

// Adds `report` with --out, --title and positional RUNS... to app; returns the subcommand so the
// caller can test `if (*report)` after parsing.
CLI::App* add_report_command(CLI::App& app);

// Writes the report for the parsed options; prints the output path and returns 0. Throws
// desloc::ConfigError for a run path that holds no metrics, desloc::DataError for a bad file.
int run_report_command();

}  // namespace desloc::cli
