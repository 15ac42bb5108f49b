// `desloc config`: print every key with its default, the table of sync features that go
// together, or check a config file (its hashes and the memory the job needs).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include "commands.hpp"
#include "desloc/train/config.hpp"
#include "desloc/train/memory_estimate.hpp"

namespace desloc::cli {
namespace {

// The memory a job needs, per rank and in one process, against this machine. Refuses a job whose
// single rank cannot fit; the rest is information.
void print_memory(const train::JobConfig& cfg) {
  using train::format_bytes;
  using train::ProcessRole;
  const auto available = train::available_memory();
  train::check_memory(cfg, ProcessRole::kRank, 1, available);
  const int world = cfg.ranks_of_sites(cfg.sync.sites);
  const double rank = train::estimate_memory(cfg, ProcessRole::kRank).bytes();
  const double one = train::estimate_memory(cfg, ProcessRole::kInProcess).bytes();
  std::printf(
      "memory: about %s per rank (`desloc launch`: %d ranks, %s in all), %s for `desloc train` "
      "(every site in one process); %s available (%s)\n",
      format_bytes(rank).c_str(), world, format_bytes(rank * world).c_str(),
      format_bytes(one).c_str(), format_bytes(available.bytes).c_str(), available.source.c_str());
}

struct ConfigOptions {
  bool defaults = false;
  bool features = false;
  std::string check_path;
};

int run_config(const ConfigOptions& o) {
  if (o.features) {
    std::fputs(train::sync_feature_table().c_str(), stdout);
    return 0;
  }
  if (o.check_path.empty()) {
    std::fputs(train::default_config_toml().c_str(), stdout);
    return 0;
  }
  const auto cfg = train::load_config(o.check_path);
  print_memory(cfg);
  std::printf(
      "%s: ok, config hash %016llx (what the job computes: checkpoints record it), agreement "
      "hash %016llx (what its ranks must share: the coordinator checks it)\n",
      o.check_path.c_str(), static_cast<unsigned long long>(cfg.hash()),
      static_cast<unsigned long long>(cfg.agreement_hash()));
  return 0;
}

}  // namespace

Command add_config(CLI::App& app) {
  auto opts = std::make_shared<ConfigOptions>();
  auto* cmd = app.add_subcommand("config", "print the default config or check a config file");
  cmd->add_flag("--defaults", opts->defaults, "print every key with its default and meaning");
  cmd->add_flag("--features", opts->features,
                "print which sync features go together: every feature against every other, "
                "with the reason for each pair that is refused (as docs/sync.md shows it)");
  cmd->add_option("--check", opts->check_path,
                  "parse and validate a config, print its hash and the memory it needs per "
                  "rank and in one process (refused if a rank cannot fit this machine)");
  return {cmd, [opts] { return run_config(*opts); }};
}

}  // namespace desloc::cli
