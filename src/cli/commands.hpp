// The desloc subcommands. Each add_* registers one or more subcommands on the program's CLI::App
// with their flags, and returns what runs each after parsing; main() parses, runs the one chosen,
// and turns errors into exit statuses.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace desloc::cli {

// One subcommand: its parser and what running it does. run is called only when the subcommand
// was chosen, inside main's error handling; it returns the exit status, and throws
// desloc::ConfigError for bad input (exit 2) and desloc::Error for a failure (exit 1).
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// How errors name this process ("desloc", "desloc worker east/0"): a command that learns a more
// precise name while running (the worker, once it knows its identity) sets it.
struct ProcessName {
  std::string text = "desloc";
};

// prepare: fetch and tokenize a corpus (cmd_prepare.cpp).
Command add_prepare(CLI::App& app);
// train, launch, coordinator, worker, profile: running a job (cmd_jobs.cpp).
std::vector<Command> add_job_commands(CLI::App& app, ProcessName& name);
// plan and simulate: from a measured topology (cmd_topology.cpp).
std::vector<Command> add_topology_commands(CLI::App& app);
// config: defaults, or check a file (cmd_config.cpp).
Command add_config(CLI::App& app);
// report: compare runs in an HTML page (cmd_report.cpp).
Command add_report(CLI::App& app);
// export and sample: using a trained model (cmd_model.cpp).
std::vector<Command> add_model_commands(CLI::App& app);

}  // namespace desloc::cli
