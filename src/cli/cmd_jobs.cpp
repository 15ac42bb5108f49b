// Running a job: `desloc train` (every site in this process), `launch` (one process per rank on
// this machine), `profile` (measure the topology the same way), and across machines
// `coordinator` and `worker`.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "desloc/cluster/cluster.hpp"
#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"
#include "desloc/train/config.hpp"
#include "desloc/train/memory_estimate.hpp"
#include "desloc/train/trainer.hpp"
#include "flag_checks.hpp"
#include "startup_signals.hpp"

namespace desloc::cli {
namespace {

using train::ProcessRole;

// Flags that override config keys (train, worker). Each goes through the key's own declaration
// in config.cpp, so --threads meets train.threads' range check.
struct Overrides {
  std::string out_dir;
  std::int64_t threads = 0;
  CLI::Option* threads_flag = nullptr;

  std::vector<train::KeyOverride> list() const {
    std::vector<train::KeyOverride> o;
    if (!out_dir.empty()) o.push_back({"--out-dir", "train", "out_dir", out_dir});
    if (threads_flag != nullptr && threads_flag->count() > 0)
      o.push_back({"--threads", "train", "threads", threads});
    return o;
  }
};

train::JobConfig load_with(const std::string& config_path, const Overrides& o) {
  return train::load_config(config_path, o.list());
}

// "3.1975 nats, 1.2345 bits/byte (2.2% above the unigram entropy 3.1288)": the sign becomes
// the word.
std::string describe_val_loss(float loss, double bpb, double unigram_entropy) {
  if (!std::isfinite(loss)) return "not evaluated";
  const std::string bits = std::isfinite(bpb) ? fmt::format(", {:.4f} bits/byte", bpb) : "";
  if (!(unigram_entropy > 0)) return fmt::format("{:.4f} nats{}", loss, bits);
  const double below = 100.0 * (1.0 - loss / unigram_entropy);
  return fmt::format("{:.4f} nats{} ({:.1f}% {} the unigram entropy {:.4f})", loss, bits,
                     std::abs(below), below >= 0 ? "below" : "above", unigram_entropy);
}

int train_and_report(const train::JobConfig& cfg, const train::TrainOptions& opts,
                     const cluster::WorkerOptions* worker) {
  const auto r =
      worker != nullptr ? cluster::run_worker(cfg, *worker) : train::run_training(cfg, opts);
  if (opts.quiet) return r.interrupted ? 130 : 0;
  // This process's own file: after the leader's site was lost, the rank that evaluates in its
  // place writes the evaluations to its own directory.
  const std::string metrics = r.metrics.empty() ? train::metrics_path(cfg) : r.metrics;
  if (r.steps_done == r.start_step) {
    // No step ran: there is no train loss of this run to report.
    if (r.start_step >= cfg.train.steps)
      std::printf(
          "nothing to do: the run already finished at step %lld (train.steps = %lld); its "
          "results are in %s\n",
          static_cast<long long>(r.start_step), static_cast<long long>(cfg.train.steps),
          metrics.c_str());
    else
      std::printf("stopped at step %lld before training a step; metrics: %s\n",
                  static_cast<long long>(r.start_step), metrics.c_str());
    return r.interrupted ? 130 : 0;
  }
  std::printf(
      "trained steps %lld..%lld: final train loss %.4f (site %s), val loss %s, %.0f tokens/s\n",
      static_cast<long long>(r.start_step), static_cast<long long>(r.steps_done), r.last_train_loss,
      r.train_loss_site.c_str(),
      describe_val_loss(r.last_val_loss, r.last_val_bpb, r.unigram_entropy_nats).c_str(),
      r.tokens_per_s);
  if (!r.last_checkpoint.empty()) std::printf("checkpoint: %s\n", r.last_checkpoint.c_str());
  std::printf("metrics: %s\n", metrics.c_str());
  if (r.interrupted) return 130;
  return 0;
}

Command add_train(CLI::App& app) {
  struct Options {
    std::string config_path;
    Overrides overrides;
    train::TrainOptions train;
    bool no_progress = false;
  };
  auto opts = std::make_shared<Options>();
  Options& o = *opts;
  auto* cmd = app.add_subcommand(
      "train",
      "train a job in this one process: every site an in-process virtual worker, its ranks "
      "micro-batches summed in the network's order (the exact reference for `launch`)");
  cmd->add_option("-c,--config", o.config_path, "job config (TOML), e.g. configs/quickstart.toml")
      ->required();
  cmd->add_flag("--resume", o.train.resume,
                "continue bit-exactly from the newest valid checkpoint in out_dir");
  cmd->add_flag("--force", o.train.force,
                "start afresh even though out_dir holds another run's checkpoints and "
                "metrics (they are overwritten); without it such a start is refused");
  cmd->add_option("--stop-after", o.train.stop_after,
                  "stop after this many total steps (checkpointing first); the schedule still "
                  "spans train.steps")
      ->check(whole_in(1, INT64_MAX, "a step count"));
  cmd->add_option("--out-dir", o.overrides.out_dir, "override train.out_dir");
  o.overrides.threads_flag = cmd->add_option(
      "--threads", o.overrides.threads, "override train.threads (checked like the key: 0..1024)");
  cmd->add_flag("--no-progress", o.no_progress, "plain log lines instead of a progress bar");
  return {cmd, [opts] {
            const StartupSignals stop("desloc train");
            if (opts->no_progress) opts->train.progress = 0;
            const auto cfg = load_with(opts->config_path, opts->overrides);
            train::check_memory(cfg, ProcessRole::kInProcess);
            return train_and_report(cfg, opts->train, nullptr);
          }};
}

// Every rank of the job runs on this machine.
train::JobConfig load_local_job(const std::string& config_path, const std::string& out_dir) {
  Overrides o;
  o.out_dir = out_dir;
  auto cfg = load_with(config_path, o);
  train::check_memory(cfg, ProcessRole::kRank, cfg.ranks_of_sites(cfg.sync.sites));
  return cfg;
}

constexpr const char* kHttpHelp =
    "host:port of a read-only status endpoint: a live dashboard at /, /metrics (Prometheus text "
    "format) and /api/state (JSON); port 0 = any. Loopback unless the job token is configured, "
    "which requests to another address must then send (`Authorization: Bearer <token>`, or as "
    "the password a browser asks for)";
constexpr const char* kTopologyHelp =
    "with --http: a topology.toml (desloc profile) whose link rates the dashboard and /metrics "
    "compare each ring link's achieved rate with";

Command add_launch(CLI::App& app) {
  struct Options {
    std::string config_path;
    cluster::LaunchOptions launch;
    bool quiet = false, resume = false, force = false;
  };
  auto opts = std::make_shared<Options>();
  Options& o = *opts;
  auto* cmd = app.add_subcommand(
      "launch",
      "run a whole multi-site job on this machine: the coordinator and one process per rank "
      "([job] sites x ranks_per_site) over loopback, with one combined progress view; Ctrl-C "
      "stops every rank at a common step with a checkpoint");
  cmd->add_option("-c,--config", o.config_path, "job config (TOML)")->required();
  cmd->add_option("--out-dir", o.launch.out_dir, "override train.out_dir");
  cmd->add_option("--http", o.launch.status.http, kHttpHelp);
  cmd->add_option("--topology", o.launch.status.topology, kTopologyHelp);
  cmd->add_flag("--quiet", o.quiet, "no progress lines, only warnings and errors");
  cmd->add_flag("--resume", o.resume,
                "restart the job from the newest checkpoint every rank holds intact (corrupt "
                "or partial ones are skipped and named)");
  cmd->add_flag("--force", o.force,
                "start afresh over another run's results in out_dir, or resume from an older "
                "step than some ranks hold (discarding their newer work); refused without it");
  return {cmd, [opts] {
            const StartupSignals stop("desloc launch");
            const auto cfg = load_local_job(opts->config_path, opts->launch.out_dir);
            auto launch = opts->launch;
            launch.config_path = opts->config_path;
            launch.progress = !opts->quiet;
            if (opts->resume) launch.worker_args.push_back("--resume");
            if (opts->force) launch.worker_args.push_back("--force");
            return cluster::run_launch(cfg, launch);
          }};
}

Command add_profile(CLI::App& app) {
  struct Options {
    std::string config_path, out = "topology.toml";
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "profile",
      "measure a job's topology on this machine (one process per rank, like launch): latency "
      "and bandwidth of every site pair, one at a time and all at once, the compute step, and "
      "the compute the communication's CPU takes per MB sent (steal); writes topology.toml. Across "
      "machines: `desloc worker --profile FILE` on every rank");
  cmd->add_option("-c,--config", opts->config_path, "job config (TOML)")->required();
  cmd->add_option("--out", opts->out, "where to write the topology")->capture_default_str();
  return {cmd, [opts] {
            const StartupSignals stop("desloc profile");
            const auto cfg = load_local_job(opts->config_path, "");
            cluster::LaunchOptions p;
            p.config_path = opts->config_path;
            p.worker_args = {"--profile", std::filesystem::absolute(opts->out).string()};
            return cluster::run_launch(cfg, p);
          }};
}

Command add_coordinator(CLI::App& app) {
  struct Options {
    std::string config_path, listen;
    cluster::StatusEndpoint status;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "coordinator",
      "serve rendezvous, authentication, membership and heartbeats for a job's ranks; exits "
      "when they have all left");
  cmd->add_option("-c,--config", opts->config_path, "job config (TOML)")->required();
  cmd->add_option("--listen", opts->listen,
                  "host:port to listen on (default: job.coordinator; port 0 = any)");
  cmd->add_option("--http", opts->status.http, kHttpHelp);
  cmd->add_option("--topology", opts->status.topology, kTopologyHelp);
  return {cmd, [opts] {
            const auto cfg = train::load_config(opts->config_path);
            const bool given = !opts->listen.empty();
            const auto [host, port] =
                cluster::parse_endpoint(given ? opts->listen : cfg.job.coordinator,
                                        given ? "--listen" : cfg.source + ": job.coordinator");
            return cluster::run_coordinator(cfg, host, port, opts->status);
          }};
}

struct WorkerCommand {
  std::string config_path, profile;
  cluster::WorkerOptions worker;
  Overrides overrides;
  bool no_progress = false;
  CLI::Option* site_flag = nullptr;
  CLI::Option* rank_flag = nullptr;
};

int run_worker(WorkerCommand& o, ProcessName& name) {
  const StartupSignals stop("desloc worker");
  const auto cfg = load_with(o.config_path, o.overrides);
  auto& w = o.worker;
  const bool site_given = o.site_flag->count() > 0, rank_given = o.rank_flag->count() > 0;
  if (site_given != rank_given)
    throw ConfigError(fmt::format(
        "worker: {} given without {}: give both, or neither to take the identity from Slurm "
        "or Open MPI",
        site_given ? "--site" : "--rank", site_given ? "--rank" : "--site"));
  if (!site_given) {
    const auto env = cluster::identity_from_environment(cfg);
    if (!env)
      throw ConfigError(
          "worker: no identity: pass --site and --rank, or run under Slurm (SLURM_PROCID, "
          "SLURM_NTASKS) or Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE)");
    w.id = *env;
  }
  name.text = "desloc worker " + w.id.site + "/" + std::to_string(w.id.rank);
  train::check_memory(cfg, ProcessRole::kRank);
  if (w.coordinator.empty()) w.coordinator = cfg.job.coordinator;
  w.train.progress = o.no_progress ? 0 : -1;
  if (w.train.quiet) log::set_level(log::Level::kWarn);
  if (!o.profile.empty()) return cluster::run_profile_worker(cfg, w, o.profile);
  return train_and_report(cfg, w.train, &w);
}

Command add_worker(CLI::App& app, ProcessName& name) {
  auto opts = std::make_shared<WorkerCommand>();
  WorkerCommand& o = *opts;
  auto* cmd = app.add_subcommand(
      "worker",
      "run one rank of a multi-site job: register with the coordinator, then train. The identity "
      "comes from --site/--rank, or from Slurm (SLURM_PROCID) or Open MPI "
      "(OMPI_COMM_WORLD_RANK); the token from job.token_file, job.token or $DESLOC_JOB_TOKEN");
  cmd->add_option("-c,--config", o.config_path, "job config (TOML)")->required();
  o.site_flag = cmd->add_option("--site", o.worker.id.site,
                                "this rank's site (a name in job.sites); with --rank");
  o.rank_flag = cmd->add_option("--rank", o.worker.id.rank,
                                "this rank's index within its site (0 to its ranks - 1: "
                                "job.ranks_per_site, or its [[job.site]] table's); with --site")
                    ->check(whole_in(0, INT64_MAX, "this rank's index within its site"));
  cmd->add_option("--coordinator", o.worker.coordinator,
                  "host:port of the coordinator (default: job.coordinator)");
  cmd->add_option("--out-dir", o.overrides.out_dir, "override train.out_dir");
  o.overrides.threads_flag = cmd->add_option(
      "--threads", o.overrides.threads, "override train.threads (checked like the key: 0..1024)");
  cmd->add_flag("--no-progress", o.no_progress, "plain log lines instead of a bar");
  cmd->add_flag("--quiet", o.worker.train.quiet, "no progress lines, only warnings and errors");
  cmd->add_flag("--resume", o.worker.train.resume,
                "continue from the newest checkpoint that every rank of the job holds intact "
                "(every rank must be given --resume)");
  cmd->add_flag("--force", o.worker.train.force,
                "start afresh over another run's results in out_dir, or resume from an older "
                "step than some ranks hold; refused without it");
  cmd->add_option("--profile", o.profile,
                  "measure the topology instead of training; site 0 writes this file");
  return {cmd, [opts, &name] { return run_worker(*opts, name); }};
}

}  // namespace

std::vector<Command> add_job_commands(CLI::App& app, ProcessName& name) {
  return {add_train(app), add_launch(app), add_coordinator(app), add_worker(app, name),
          add_profile(app)};
}

}  // namespace desloc::cli
