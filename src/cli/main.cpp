// The desloc command-line program: the subcommands (commands.hpp) and how their outcome
// becomes an exit status.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"
#include "desloc/model/model.hpp"
#include "desloc/transport/ucx_info.hpp"

namespace {

// Edit distance, for "did you mean" on a mistyped command.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The command a user typed: the first argument that is no top-level flag (the top level has
// flags only: -v, --verbose, --version, -h, --help). CLI11 would call an unknown or a missing
// one "A subcommand is required"; this names it and lists the valid ones. Returns an exit
// status, or -1 to go on parsing.
int refuse_unknown_command(CLI::App& app, int argc, char** argv) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  const std::string list = fmt::format("{}", fmt::join(names, ", "));
  bool only_verbose = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    only_verbose = only_verbose && (arg == "-v" || arg == "--verbose");
    if (arg.starts_with("-")) continue;
    if (std::find(names.begin(), names.end(), arg) != names.end()) return -1;
    std::string hint;
    std::size_t best = 3;  // suggest only close matches
    for (const auto& n : names)
      if (const std::size_t d = edit_distance(arg, n); d < best) {
        best = d;
        hint = fmt::format("; did you mean '{}'?", n);
      }
    std::fprintf(stderr,
                 "desloc: unknown command '%s'%s\nThe commands are: %s\nRun `desloc --help` "
                 "for what each does.\n",
                 arg.c_str(), hint.c_str(), list.c_str());
    return 2;
  }
  if (!only_verbose) return -1;  // --help, --version, or an option CLI11 will name
  std::fprintf(stderr,
               "desloc: no command given. The commands are: %s\nRun `desloc --help` for what "
               "each does.\n",
               list.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "desloc: a multi-site trainer for language models built on DES-LOC (desynced "
      "low-communication adaptive optimizers, arXiv 2505.22549).\n`prepare` tokenizes a corpus; "
      "`train` runs a whole job in one process (every site a virtual worker); `launch` runs it "
      "as one process per rank on this machine; `coordinator` and `worker` run it across "
      "machines. `plan` chooses periods from a topology file, `simulate` predicts a job on one, "
      "and `profile` measures one. `config` prints or checks a job config, `report` compares "
      "runs."};
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "debug logging");
  app.set_version_flag("--version", [] {
    return fmt::format("desloc 0.1.0 (UCX {}, CUDA backend {})", desloc::transport::ucx_version(),
                       !desloc::model::backend_compiled(desloc::model::Backend::kCuda) ? "not built"
                       : desloc::model::backend_available(desloc::model::Backend::kCuda)
                           ? "built, device present"
                           : "built, no CUDA device visible");
  });

  // Errors name the process: with many ranks in one log, "which rank said this" matters.
  desloc::cli::ProcessName name;
  std::vector<desloc::cli::Command> commands{desloc::cli::add_prepare(app)};
  for (auto& c : desloc::cli::add_job_commands(app, name)) commands.push_back(std::move(c));
  commands.push_back(desloc::cli::add_config(app));
  for (auto& c : desloc::cli::add_topology_commands(app)) commands.push_back(std::move(c));
  commands.push_back(desloc::cli::add_report(app));
  for (auto& c : desloc::cli::add_model_commands(app)) commands.push_back(std::move(c));

  app.footer(
      "Exit status: 0 done; 1 failed (the message names what and where); 2 bad input (the "
      "command line or a config, named with file:line:column and key, or the flag); 130 stopped "
      "by SIGINT or SIGTERM.");

  if (const int status = refuse_unknown_command(app, argc, argv); status >= 0) return status;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help and --version exit 0; every command-line error is bad input.
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (verbose) desloc::log::set_level(desloc::log::Level::kDebug);
  // CLI11 gives an option that takes a value the next word, whatever it is: `config --check
  // --help` asks for help, not for the config file "--help".
  for (const auto& c : commands)
    if (*c.app)
      for (const CLI::Option* o : c.app->get_options())
        for (const std::string& value : o->results())
          if (value == "--help" || value == "-h") {
            std::fputs(c.app->help().c_str(), stdout);
            return 0;
          }

  try {
    for (const auto& c : commands)
      if (*c.app) return c.run();
  } catch (const desloc::ConfigError& e) {
    std::fprintf(stderr, "%s: config error: %s\n", name.text.c_str(), e.message().c_str());
    return 2;
  } catch (const desloc::Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", name.text.c_str(), e.message().c_str());
    desloc::log::debug("thrown at: {}", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: unexpected error: %s\n", name.text.c_str(), e.what());
    return 1;
  }
  return 0;
}
