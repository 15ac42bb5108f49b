// The training loop (training_run.hpp): M sites (M = 1 is plain single-site training), each
// with its own data shard and optimizer state, synchronised in the order of DES-LOC's Alg. 1.
// In-process every site is a virtual replica and its R ranks are R micro-batches; as a
// networked rank (RankContext) the process holds one site's replica, all-reduces gradients
// with the site's other ranks and averages states across sites through the context's Averager.
#include "train/training_run.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include "desloc/core/cpu_time.hpp"
#include "desloc/core/error.hpp"
#include "desloc/core/hash.hpp"
#include "desloc/core/log.hpp"
#include "desloc/core/signals.hpp"
#include "desloc/optim/optimizer.hpp"
#include "desloc/topology/planner.hpp"
#include "desloc/train/checkpoint.hpp"
#include "desloc/train/resume_agreement.hpp"
#include "desloc/transport/ring_order.hpp"

namespace desloc::train {
namespace {

// The stop signal received, 0 if none. A lock-free atomic: the handler runs on whichever thread
// the kernel picks (a UCX, OpenMP or coordinator thread), and the training thread reads it.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "used from a signal handler");
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// SIGINT/SIGTERM for the duration of a run, from no stop yet; the old handlers after.
class StopSignals {
 public:
  StopSignals() : scope_((g_stop_signal.store(0), on_stop_signal)) {}

 private:
  SignalScope scope_;
};

}  // namespace

namespace {
void check_rank_context(const JobConfig& cfg, const RankContext& rank) {
  const int R = cfg.site_ranks(rank.site);
  if (rank.averager == nullptr || rank.wan_group() == nullptr)
    throw Error("run_training: a networked rank needs its averager and WAN group");
  if ((R > 1) != (rank.site_group != nullptr && rank.site_group->size() > 1))
    throw Error(
        fmt::format("run_training: rank {} has a site group of {} but its site has {} rank(s)",
                    rank.name, rank.site_group ? rank.site_group->size() : 1, R));
  if (cfg.sync.join_step > 0)
    throw ConfigError(
        fmt::format("{}: sync.join_step: elastic join runs in-process only (`desloc train`); a "
                    "multi-process job changes membership through the coordinator (not built yet)",
                    cfg.source));
}

// The run's dataset, after the checks that need nothing allocated.
data::DatasetInfo checked_dataset(const JobConfig& cfg, const RankContext* rank) {
  if (rank != nullptr) check_rank_context(cfg, *rank);
  return load_training_data(cfg);
}

std::optional<sync::OuterNesterov> outer_of(const sync::SyncConfig& c) {
  if (c.outer != sync::OuterStep::kNesterov) return std::nullopt;
  return sync::OuterNesterov(c.outer_lr, c.outer_momentum);
}
}  // namespace

TrainingRun::TrainingRun(const JobConfig& cfg, const TrainOptions& opts, RankContext* rank)
    : cfg_(cfg),
      opts_(opts),
      rank_(rank),
      networked_(rank != nullptr),
      T_(cfg.seq_len()),
      shard_map_(cfg.wan_map()),
      total_(cfg.train.steps),
      tokens_per_step_(cfg.site_tokens_per_step(rank != nullptr ? rank->site : 0)),
      policy_(cfg.sync),
      dataset_(checked_dataset(cfg, rank)),
      train_tokens_(data::open_train_tokens(dataset_)),
      // The activations hold the largest batch this process computes (every site's in-process).
      model_(model::make_model(cfg.model,
                               {cfg.train.backend, cfg.train.threads,
                                rank != nullptr ? cfg.site_batch(rank->site) : cfg.max_batch(),
                                rank != nullptr ? rank->device : 0})),
      outer_(outer_of(cfg.sync)),
      compression_(cfg.sync.compression(), model_->layout().total(),
                   rank != nullptr ? 1 : cfg.sync.sites),
      virtual_averager_(cfg.sync.sites, sync::SumOrder::kRing, shard_map_, cfg.transport.lanes,
                        cfg.transport.lane_share),
      averager_(rank != nullptr ? rank->averager : &virtual_averager_),
      reducer_(rank != nullptr ? rank->site_group : nullptr),
      engine_(policy_,
              sync::step_options(cfg.sync, &cfg.clip, outer_ ? &*outer_ : nullptr, &compression_)),
      evaluator_(cfg, *model_, dataset_),
      faults_(FaultPlan::from_environment()),
      live_sites_(cfg.sync.sites),
      inputs_(static_cast<std::size_t>(cfg.max_batch()) * T_),
      targets_(inputs_.size()) {
  if (networked_)
    sites_.push_back(make_site(rank_->site));
  else
    for (int w = 0; w < cfg.sync.sites; ++w) sites_.push_back(make_site(w));
  sync::PayloadGuard guard;
  guard.site_names = cfg.site_names();
  virtual_averager_.set_payload_guard(guard);
  if (!networked_ && !cfg.job.regions.empty()) {
    const auto names = cfg.site_names();
    std::vector<std::vector<int>> groups;
    for (const auto& region : cfg.job.regions) {
      groups.emplace_back();
      for (const auto& site : region)
        groups.back().push_back(
            static_cast<int>(std::find(names.begin(), names.end(), site) - names.begin()));
    }
    region_averager_.emplace(std::move(groups), cfg.sync.sites, shard_map_, guard,
                             cfg.transport.lanes, cfg.transport.lane_share);
    regional_.emplace(virtual_averager_, *region_averager_);
    averager_ = &*regional_;
  }
  weigh_sites();
  evaluator_.bind(rank_);
  if (networked_ && rank_->recover)
    ft_.emplace(*rank_, static_cast<FaultTolerance::Run&>(*this), opts.resume);
  if (!networked_ || !cfg.sync.replan) faults_.replan.reset();
  if (const auto& p = faults_.poison)
    log::warn(
        "fault injection: site {} sends a {} parameter payload at its first x average from "
        "step {}",
        p->site, p->huge ? "1000x" : "NaN", p->step);
  if (const auto& r = faults_.replan)
    log::warn("fault injection: every rank re-plans kx to {} at the parameter average of step {}",
              r->kx, r->step);
  if (!networked_ && cfg.sync.replan)
    log::info(
        "sync.replan: one process measures no wide-area link, so the periods stay as "
        "configured; sync.switches replays a networked run's re-plans");
  result_.unigram_entropy_nats = dataset_.unigram_entropy_nats;
  result_.train_loss_site =
      cfg.site_names().at(networked_ ? static_cast<std::size_t>(rank_->site) : 0);
  result_.last_val_loss = std::numeric_limits<float>::quiet_NaN();
  result_.last_val_bpb = std::numeric_limits<double>::quiet_NaN();
}

// Data is partitioned for the largest site count the run will reach, so sites that join
// later never read a window another site already owns. Site s's rank r reads partition
// first_rank(s) + r (s * R + r for sites alike) of every site's ranks.
SiteReplica TrainingRun::make_site(int index) const {
  const std::size_t n = model_->layout().total();
  const int max_sites = std::max(cfg_.sync.sites, cfg_.sync.join_sites);
  SiteReplica s{{}, std::vector<float>(n), optim::Optimizer(cfg_.optim, model_->layout()), {}, {}};
  const int first = networked_ ? rank_->rank : 0;
  const int count = networked_ ? 1 : cfg_.site_ranks(index);
  const int partitions = cfg_.ranks_of_sites(max_sites);
  for (int r = first; r < first + count; ++r)
    s.loaders.emplace_back(train_tokens_, cfg_.site_batch(index), T_, cfg_.data.seed,
                           cfg_.first_rank(index) + r, partitions);
  if (count > 1) s.micro_g.assign(static_cast<std::size_t>(count), std::vector<float>(n));
  return s;
}

void TrainingRun::start_fresh() {
  if (!networked_) run_id_ = new_run_id();  // a networked rank's came from agree_on_start
  std::vector<float> x0(model_->layout().total());
  model::init_params(model_->layout(), cfg_.model, cfg_.train.seed, x0);
  for (auto& s : sites_) s.x = x0;  // every site starts from the same point
  if (outer_) outer_->reset(x0);
  compression_.reset(x0);
}

void TrainingRun::resume() {
  const std::string ckpt_dir = checkpoint_dir(cfg_, rank_);
  std::optional<FoundCheckpoint> found;
  if (networked_) {
    // A restarted job resumes where every rank can: the newest step all of them hold intact.
    ResumeAgreementOptions agreement{cfg_.site_names(), rank_->name, rank_->leader()};
    agreement.history_run_id = recorded_run_id(metrics_path(cfg_, rank_));
    const auto choice = agree_on_resume_step(scan_checkpoints(ckpt_dir, writer(), job_hash()),
                                             rank_->site_group, rank_->rings(), agreement);
    if (!choice.step)
      throw DataError(fmt::format(
          "--resume: the job's ranks share no intact checkpoint step ({}'s are in '{}'); run "
          "without --resume to start fresh",
          rank_->name, ckpt_dir));
    if (choice.diverged && !opts_.force)
      throw DataError(fmt::format(
          "--resume: the ranks' checkpoints went apart: the newest step all of them hold is {}, "
          "but some hold up to step {} (a site dropped from the run stops writing checkpoints; "
          "see the passed-over steps above). Resuming at {} would discard the newer metrics and "
          "checkpoints; pass --force to do it anyway",
          *choice.step, choice.newest.value_or(*choice.step), *choice.step));
    const std::string path = checkpoint_path(ckpt_dir, *choice.step);
    found = FoundCheckpoint{path, load_checkpoint(path)};
  } else {
    found = find_latest_checkpoint(ckpt_dir, writer());
  }
  if (!found)
    throw DataError("--resume: no valid checkpoint in '" + ckpt_dir +
                    "'; run without --resume to start fresh");
  Checkpoint& ck = found->checkpoint;
  check_run_identity(found->path, ck);
  if (ck.config_hash != job_hash())
    throw ConfigError(fmt::format(
        "--resume: checkpoint '{}' was written by a job with config hash {:016x}, but {} "
        "hashes to {:016x}; a change to the model, optimizer, schedule, data order, sync, "
        "seeds or step count cannot resume bit-exactly. Restore the original config or use a "
        "new train.out_dir",
        found->path, ck.config_hash, cfg_.source, job_hash()));
  for (const auto& w : ck.sites)
    if (w.params.size() != model_->layout().total())
      throw DataError(fmt::format("'{}' holds {} parameters; the model has {}", found->path,
                                  w.params.size(), model_->layout().total()));
  while (sites_.size() < ck.sites.size())
    sites_.push_back(make_site(static_cast<int>(sites_.size())));
  virtual_averager_.resize(static_cast<int>(sites_.size()));
  weigh_sites();
  const std::int64_t step = ck.step;
  std::vector<std::size_t> loaders;
  for (const SiteReplica& s : sites_) loaders.push_back(s.loaders.size());
  tokens_seen_ = restore_state(from_checkpoint(std::move(ck), loaders), sites_, shared());
  result_.start_step = step;
  result_.already_finished = step >= total_;
  if (result_.already_finished)
    log::info("{}: the run already finished at step {} (train.steps = {}); nothing to do",
              found->path, step, total_);
  else
    log::info("resumed from {} at step {} ({} site{})", found->path, step, sites_.size(),
              sites_.size() == 1 ? "" : "s");
}

void TrainingRun::write_run_record() {
  RunRecord r;
  r.name = std::filesystem::path(cfg_.train.out_dir).filename().string();
  r.method = to_string(cfg_.sync.method);
  r.workers = cfg_.sync.sites;
  if (cfg_.sync.averages_params()) r.kx = cfg_.sync.kx;
  if (cfg_.sync.method == SyncMethod::kDesloc) {
    r.ku = cfg_.sync.effective_ku();
    r.kv = cfg_.sync.effective_kv();
  }
  r.outer = std::string(to_string(cfg_.sync.outer));
  r.parameters = model_->layout().total();
  r.batch = cfg_.site_batch(site_index(0));
  r.seq_len = T_;
  r.steps = total_;
  r.config_hash = job_hash();
  r.run_id = run_id_;
  r.sites = fmt::format("{}", fmt::join(cfg_.site_names(), ","));
  r.ranks_per_site = cfg_.site_ranks(site_index(0));
  r.rank = networked_ ? rank_->name : "all";
  r.wan_link =
      networked_ && !rank_->wan_successor.empty() ? rank_->name + "->" + rank_->wan_successor : "";
  metrics_->write(r);
  const int sites = live_sites_;
  // "3 sites x 2 ranks", or each site as it is: "3 sites (ranks x batch: west 2x8, ...)".
  std::string shape = fmt::format("{} site{} x {} rank{}", sites, sites == 1 ? "" : "s",
                                  r.ranks_per_site, r.ranks_per_site == 1 ? "" : "s");
  if (!cfg_.sites_alike()) {
    std::vector<std::string> each;
    for (int s = 0; s < sites; ++s)
      each.push_back(fmt::format("{} {}x{}", cfg_.site_names().at(std::size_t(s)),
                                 cfg_.site_ranks(s), cfg_.site_batch(s)));
    shape = fmt::format("{} sites (ranks x batch: {})", sites, fmt::join(each, ", "));
  }
  progress_->message(fmt::format(
      "desloc train: {} parameters ({} backend), {} ({}{}), B={} T={}, {} steps, {} train / {} "
      "val tokens, unigram entropy {:.4f} nats",
      model_->layout().total(), model_->backend_name(), shape, to_string(cfg_.sync.method),
      networked_ ? ", this process is " + rank_->name : std::string(", in-process"), r.batch, T_,
      total_, dataset_.train_tokens, dataset_.val_tokens, dataset_.unigram_entropy_nats));
}

// A checkpoint continues the history its directory's metrics.jsonl holds: one copied in from
// another run of the same config would mix two runs. The run's id is the checkpoint's (or,
// for a checkpoint written before run ids, one derived from what every rank shares).
void TrainingRun::check_run_identity(const std::string& path, const Checkpoint& ck) {
  const std::string metrics = metrics_path(cfg_, rank_);
  const std::uint64_t history = recorded_run_id(metrics);
  if (ck.run_id != 0 && history != 0 && ck.run_id != history)
    throw ConfigError(fmt::format(
        "--resume: checkpoint '{}' belongs to run {:016x}, but '{}' records the history of run "
        "{:016x}: it was copied from another run. Put back this run's own checkpoints, or start "
        "afresh (without --resume, with --force to overwrite)",
        path, ck.run_id, metrics, history));
  run_id_ = ck.run_id != 0 ? ck.run_id
            : history != 0 ? history
                           : fnv1a64(fmt::format("{:016x}:{}", job_hash(), ck.step)) | 1;
}

// What this process's out_dir already holds, and how it was asked to start.
StartIntent TrainingRun::start_intent() const {
  namespace fs = std::filesystem;
  StartIntent it{opts_.resume, opts_.force, 0, 0, new_run_id()};
  std::error_code ec;
  for (fs::directory_iterator d(checkpoint_dir(cfg_, rank_), ec), end; !ec && d != end;
       d.increment(ec)) {
    const std::string name = d->path().filename().string();
    if (name.starts_with("step_") && name.ends_with(".ckpt")) ++it.checkpoints;
  }
  std::ifstream metrics(metrics_path(cfg_, rank_));
  for (std::string line; std::getline(metrics, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) ++it.metrics_records;
  return it;
}

// Before anything is written: every rank starts the same way, nobody overwrites another run's
// results unasked, and the state is the start's or the agreed checkpoint's. A site that fails
// in the middle (its ranks are the others' peers in the agreements) is dropped like any failed
// site, and the survivors agree again in the next epoch: nothing was written, so every one of
// them offers step 0, which only stands for "before the first step" here.
void TrainingRun::start(bool rejoining) {
  for (int attempt = 1;; ++attempt) {
    try {
      if (networked_ && !rejoining)
        run_id_ = agree_on_start(start_intent(), rank_->site_group, rank_->rings(),
                                 {cfg_.site_names(), rank_->name, rank_->leader()});
      else if (!networked_)
        check_fresh_start(start_intent(), cfg_.train.out_dir);
      if (opts_.resume)
        resume();
      else
        start_fresh();
      replan_reset(result_.start_step + 1);
      return;
    } catch (const Error& e) {
      if (!ft_ || !ft_->retry_start(e, attempt)) throw;
    }
  }
}

TrainResult TrainingRun::run() {
  // A restarted site rejoining a running job starts at the epoch's resume step; its state
  // arrives from a peer before its first step (receive_joined_state).
  const bool rejoining = ft_ && ft_->rejoining();
  start(rejoining);
  if (rejoining) {
    result_.start_step = rank_->join_step;
    log::info("{}: rejoining at step {}; waiting for the state from a peer", rank_->name,
              rank_->join_step);
  }
  // A rejoining site keeps the records of its first life (up to the step it rejoins at).
  result_.metrics = metrics_path(cfg_, rank_);
  metrics_.emplace(result_.metrics, opts_.resume || rejoining, result_.start_step);
  const bool tty = opts_.progress == 1 || (opts_.progress == -1 && ::isatty(STDERR_FILENO));
  progress_.emplace(result_.start_step, total_, tty, cfg_.train.log_every, opts_.quiet);
  if (!opts_.resume && !rejoining) write_run_record();

  const StopSignals signals;
  const auto run_start = Clock::now();
  step_ = result_.start_step;
  if (ft_) ft_->started(step_);
  while (step_ < total_) {
    if (stop_requested()) break;
    const std::int64_t t = step_ + 1;  // the 1-based number of the step being taken
    try {
      if (ft_) ft_->before_step(t, talks_across_sites(t));
      maybe_join(t);
      const StepResult s = take_step(t);
      ++step_;
      tokens_seen_ += tokens_per_step_;
      if (networked_ && rank_->on_step) rank_->on_step(step_);
      record_step(s);
      const bool last = step_ == total_;
      const bool checkpoint =
          (cfg_.train.checkpoint_every > 0 && step_ % cfg_.train.checkpoint_every == 0) || last;
      // Delayed averages in flight are folded in before a checkpoint (and the last step's
      // evaluation), so what is written and resumed holds nothing in flight.
      if (checkpoint) {
        std::vector<sync::Replica> replicas = views_of(sites_);
        engine_.drain(step_, replicas);
      }
      if ((cfg_.train.eval_every > 0 && step_ % cfg_.train.eval_every == 0) || last) {
        engine_.settle();  // the evaluation may use the averager's groups
        evaluate(step_);
      }
      if (checkpoint) save(step_);
    } catch (const Error& e) {
      engine_.abandon();  // averages in flight end (or fail) before their groups are rebuilt
      if (!ft_ || !FaultTolerance::recoverable(e)) throw;
      recover(e.message());
    }
  }
  if (step_ < total_ && step_ > result_.start_step) {  // stop_after or a signal
    std::vector<sync::Replica> replicas = views_of(sites_);
    engine_.drain(step_, replicas);
    save(step_);
  }
  progress_->finish();

  result_.steps_done = step_;
  result_.sites = static_cast<int>(sites_.size());
  result_.bytes_sent_per_site = traffic_of(0).total_wire();
  const double secs = seconds_since(run_start);
  if (step_ > result_.start_step && secs > 0)
    result_.tokens_per_s =
        double(step_ - result_.start_step) * double(job_tokens_per_step()) / secs;
  return result_;
}

// Sites stop together: a networked rank learns of a stop request (SIGINT/SIGTERM) from its
// site's ranks every step and from the other sites at each sync (the control exchange), and
// all stop after the same step. Without any cross-site sync (method = none) a site stops on
// its own.
bool TrainingRun::stop_requested() {
  if (opts_.stop_after >= 0 && step_ >= opts_.stop_after) return true;
  if ((networked_ || g_stop_signal.load() == 0) && !stop_agreed_) return false;
  progress_->message(fmt::format(
      "{} received: checkpointing at step {} and stopping",
      networked_ ? std::string("a stop request") : fmt::format("signal {}", g_stop_signal.load()),
      step_));
  result_.interrupted = true;
  return true;
}

TrainingRun::StepResult TrainingRun::take_step(std::int64_t t) {
  const auto t0 = Clock::now();
  const double cpu0 = process_cpu_seconds();
  StepResult s;
  // With sync.overlap = "step" the due averages of x, u and v start here and run while the
  // gradients are computed.
  std::vector<sync::Replica> replicas = views_of(sites_);
  s.due = engine_.begin(t, *averager_, replicas, site_stop_);
  s.sync_seconds = seconds_since(t0);
  site_losses_.resize(sites_.size());  // sites may have joined
  double loss_sum = 0.0;
  const auto t_compute = Clock::now();
  for (std::size_t i = 0; i < sites_.size(); ++i) {
    site_losses_[i] = site_gradient(i, t);
    loss_sum += site_losses_[i];
  }
  double compute_s = seconds_since(t_compute);
  inject_poison(t, s.due);  // under overlap the averages started from the unpoisoned values
  const auto t_finish = Clock::now();
  const bool stop = engine_.finish(replicas, site_stop_);
  s.sync_seconds += seconds_since(t_finish);
  if (networked_) {
    if (cfg_.sync.method == SyncMethod::kNone)
      stop_agreed_ = site_stop_;
    else
      stop_agreed_ = stop_agreed_ || stop;  // with delayed averages: known when settled
  }
  s.lr = optim::learning_rate(cfg_.schedule, step_, total_);
  const auto t_update = Clock::now();
  s.grad_norm = engine_.update(replicas, s.lr);
  compute_s += seconds_since(t_update);
  // The control exchanges carry it: each site's wait at an average (take_waits), and the
  // replanner's measure.
  if (networked_) averager_->note_compute(compute_s);
  if (replanner_) replan(t);
  s.loss = static_cast<float>(loss_sum / double(sites_.size()));
  s.seconds = seconds_since(t0);
  s.cpu_seconds = process_cpu_seconds() - cpu0;
  return s;
}

void TrainingRun::replan(std::int64_t t) {
  if (!policy_.global_at(t).x) return;
  const std::optional<sync::SyncMeasure> m = engine_.take_measure(*averager_);
  const bool injected = faults_.replan && faults_.replan->step == t;
  // Configured switches are the config's plan: re-planning starts after the last, measuring
  // afresh from the periods each puts in force.
  const std::vector<sync::PeriodSwitch>& configured = cfg_.sync.switches;
  if (!injected && !configured.empty() && configured.back().after >= t) {
    if (std::any_of(configured.begin(), configured.end(),
                    [t](const sync::PeriodSwitch& sw) { return sw.after == t; }))
      replan_reset(t + 1, true);
    return;
  }
  if (!injected && !m) return;
  const std::int64_t old_kx = replanner_->periods().kx;
  std::optional<sync::ReplanDecision> d;
  if (injected) {  // tests: a decision without a drift
    d = sync::ReplanDecision{};
    d->periods = replanner_->periods_of(faults_.replan->kx);
    d->reason = "fault injection ($DESLOC_INJECT_REPLAN)";
  } else {
    d = replanner_->observe(*m);
  }
  if (!d) return;
  if (policy_.switches().size() >= sync::kMaxPeriodSwitches) {
    log::warn(
        "{}: step {}: {}; the job already switched periods {} times, the most it keeps, "
        "so kx stays {}",
        rank_->name, t, d->reason, sync::kMaxPeriodSwitches, old_kx);
    replan_reset(t + 1, true);
    return;
  }
  policy_.add_switch({t, d->periods.kx, d->periods.ku, d->periods.kv});
  if (injected) replan_reset(t + 1, true);
  metrics_->write(ReplanRecord{t, d->periods.kx, d->periods.ku, d->periods.kv, old_kx,
                               d->state_seconds, d->compute_seconds, d->reference_seconds,
                               d->bytes_per_s, d->overhead, d->target, d->predicted_step_s,
                               d->reason});
  progress_->message(fmt::format(
      "{}: re-planned after step {}: kx {} -> {}, ku {}, kv {}, predicted step {:.3f} s ({})",
      rank_->name, t, old_kx, d->periods.kx, d->periods.ku, d->periods.kv, d->predicted_step_s,
      d->reason));
  if (d->periods.kx > topology::kValidatedKx)
    log::warn(
        "{}: kx {} is beyond the {} DES-LOC's convergence was shown at; the sites train "
        "nearly alone until the link recovers",
        rank_->name, d->periods.kx, topology::kValidatedKx);
}

void TrainingRun::replan_reset(std::int64_t next, bool keep_target) {
  if (!networked_ || !cfg_.sync.replan) return;
  const SyncSchedule& s = policy_.schedule_at(next);
  const sync::Periods in_force{s.kx, s.ku, s.kv};
  if (!replanner_) {
    const SyncSchedule base = cfg_.sync.schedule();
    const std::array<std::int64_t, 3> tau = cfg_.sync.effective_delays();
    sync::ReplanOptions o;
    o.target = cfg_.sync.replan_target;
    o.drift = cfg_.sync.replan_drift;
    o.syncs = cfg_.sync.replan_syncs;
    o.min_kx = *std::max_element(tau.begin(), tau.end()) + 1;
    o.max_kx = std::max<std::int64_t>(1, total_);
    o.hidden_steps = cfg_.sync.overlap == Overlap::kStep ? 1.0
                     : cfg_.sync.delays()                ? double(tau[0] + 1)
                                                         : 0.0;
    sync::Periods region;  // all 0 without regions
    if (cfg_.sync.regional())
      region = {cfg_.sync.region_kx, cfg_.sync.effective_region_ku(),
                cfg_.sync.effective_region_kv()};
    replanner_.emplace(cfg_.sync.method, sync::Periods{base.kx, base.ku, base.kv}, o, region);
  }
  replanner_->reset(in_force, keep_target);
}

// Site i's gradient at its un-averaged x: every rank's micro-batch held here, then the mean
// over the site's ranks. Returns the site's loss.
float TrainingRun::site_gradient(std::size_t i, std::int64_t t) {
  SiteReplica& w = sites_[i];
  std::copy(w.x.begin(), w.x.end(), model_->params().begin());
  model_->params_updated();
  std::vector<float> micro_loss(w.loaders.size());
  for (std::size_t m = 0; m < w.loaders.size(); ++m) {
    const int B = cfg_.site_batch(site_index(i));
    const std::span<std::int32_t> in = std::span(inputs_).first(std::size_t(B) * T_);
    const std::span<std::int32_t> tgt = std::span(targets_).first(in.size());
    w.loaders[m].next(in, tgt);
    const float loss = model_->forward_backward({in, tgt, B, T_});
    if (!std::isfinite(loss))
      throw Error(fmt::format(
          "loss is not finite ({}) at step {} on {}; lower schedule.lr or enable optim.clip "
          "(last good checkpoint: {})",
          loss, t, networked_ ? rank_->name : fmt::format("site {} rank {}", i, m),
          result_.last_checkpoint.empty() ? "none" : result_.last_checkpoint));
    const auto g = model_->grads();
    std::copy(g.begin(), g.end(), w.micro_g.empty() ? w.g.begin() : w.micro_g[m].begin());
    micro_loss[m] = loss;
  }
  const sync::SiteMean mean =
      reducer_.reduce(w.micro_g, w.g, micro_loss, g_stop_signal.load() != 0);
  site_stop_ = mean.stop;
  return mean.loss;
}

// After the gradients, before the averages of this step.
void TrainingRun::inject_poison(std::int64_t t, const sync::SyncDecision& due) {
  const std::optional<FaultPlan::Poison>& poison = faults_.poison;
  if (!poison || poisoned_ || t < poison->step || !due.x) return;
  for (std::size_t i = 0; i < sites_.size(); ++i) {
    const int site = networked_ ? rank_->site : static_cast<int>(i);
    if (cfg_.site_names().at(static_cast<std::size_t>(site)) != poison->site) continue;
    // Into the part of x this step averages (its fragment with sync.fragments).
    const transport::Range part = transport::block(sites_[i].x.size(), due.parts_x, due.frag_x);
    const std::span<float> x = std::span<float>(sites_[i].x).subspan(part.offset, part.count);
    if (poison->huge)
      for (float& v : x) v *= 1000.0f;
    else
      x[0] = std::numeric_limits<float>::quiet_NaN();
    poisoned_ = true;
    return;
  }
}

void TrainingRun::record_step(const StepResult& s) {
  TrainRecord r;
  r.step = step_;
  r.loss = s.loss;
  r.lr = s.lr;
  r.grad_norm = s.grad_norm;
  r.tokens_per_s = double(job_tokens_per_step()) / s.seconds;
  r.step_ms = s.seconds * 1e3;
  r.sync_ms = s.sync_seconds * 1e3;
  r.cpu_ms = s.cpu_seconds * 1e3;
  r.comm_cpu_ms = (engine_.comm_cpu_seconds() + averager_->helper_cpu_seconds()) * 1e3;
  r.wire_ms = engine_.wire_seconds() * 1e3;
  r.control_ms = engine_.control_seconds() * 1e3;
  r.tokens = tokens_seen_;
  r.workers = sites_.size();
  r.synced = fmt::format("{}{}{}{}", s.due.grad ? "g" : "", s.due.x ? "x" : "", s.due.u ? "u" : "",
                         s.due.v ? "v" : "");
  const sync::Traffic traffic = traffic_of(0);
  r.wire = traffic.wire;
  r.payload = traffic.payload;
  r.region_bytes_sent = traffic.total_region_wire();
  // Every replica's wire total: equal under a ring, except for sites that joined late.
  for (std::size_t i = 0; i < sites_.size(); ++i)
    r.wire_by_worker.push_back(traffic_of(static_cast<int>(i)).total_wire());
  r.loss_by_site = site_losses_;
  for (const double w : averager_->take_waits()) r.wait_ms_by_site.push_back(w * 1e3);
  r.site_bytes_sent =
      networked_ && rank_->site_group != nullptr ? rank_->site_group->bytes().total().sent : 0;
  result_.last_train_loss = site_losses_.at(0);
  metrics_->write(r);
  guard_rejections_ += averager_->rejections().size();
  if (networked_ && rank_->on_progress) {
    transport::RankReport report;
    report.loss = s.loss;
    report.tokens_per_s = static_cast<float>(r.tokens_per_s);
    report.wan_bytes_sent = r.wire_by_worker.at(0);
    report.guard_rejections = guard_rejections_;
    if (cfg_.sync.averages_params()) report.kx = policy_.schedule_at(step_ + 1).kx;
    report.replans =
        static_cast<std::uint32_t>(policy_.switches().size() - cfg_.sync.switches.size());
    const auto me = static_cast<std::size_t>(rank_->wan_group()->rank());
    if (me < r.wait_ms_by_site.size()) {
      last_wait_ms_ = r.wait_ms_by_site[me];
      wait_seconds_ += r.wait_ms_by_site[me] / 1e3;
    }
    report.last_wait_ms = static_cast<std::uint32_t>(std::lround(last_wait_ms_));
    report.wait_seconds = wait_seconds_;
    rank_->on_progress(report);
  }
  for (const sync::Rejection& rj : averager_->rejections())
    metrics_->write(RejectionRecord{rj.step, optim::to_string(rj.state),
                                    averager_->payload_guard().site_name(rj.site), rj.reason});
  averager_->clear_rejections();
  progress_->step(step_, s.loss, s.lr, r.tokens_per_s);
}

void TrainingRun::evaluate(std::int64_t step) {
  const auto t0 = Clock::now();
  const std::optional<Evaluation> val = evaluator_.evaluate(step, sites_);
  if (!val) return;  // this rank only took part in the average
  result_.last_val_loss = val->loss;
  result_.last_val_bpb = val->bits_per_byte;
  metrics_->write(
      EvalRecord{step, val->loss, seconds_since(t0), sites_.size(), val->bits_per_byte});
  progress_->message(
      fmt::format("step {}/{}: val_loss {:.4f}, {:.4f} bits/byte (unigram entropy "
                  "{:.4f})",
                  step, total_, val->loss, val->bits_per_byte, dataset_.unigram_entropy_nats));
}

void TrainingRun::save(std::int64_t step) {
  const std::string path = checkpoint_path(checkpoint_dir(cfg_, rank_), step);
  Checkpoint ck =
      to_checkpoint(capture_state(step, tokens_seen_, sites_, shared()), job_hash(), writer());
  ck.run_id = run_id_;
  ck.model = CheckpointModel{cfg_.model, dataset_.tokenizer, dataset_.tokenizer_hash,
                             dataset_.tokenizer_file.empty()
                                 ? std::string()
                                 : std::filesystem::absolute(dataset_.tokenizer_file).string()};
  save_checkpoint(path, ck);
  result_.last_checkpoint = path;
}

// Elastic join (in-process): at the first sync boundary from join_step on, new sites start
// from the average at that sync: the mean x, and the mean u and v when the method averages
// them (desloc, local_adam). Under keep-local methods (favg, favg_reset) optimizer state is
// never shared, so a newcomer starts Adam afresh (u = v = 0, bias correction from step 1).
void TrainingRun::maybe_join(std::int64_t t) {
  if (cfg_.sync.join_step <= 0 || t < cfg_.sync.join_step || !policy_.at(t).any() ||
      static_cast<int>(sites_.size()) >= cfg_.sync.join_sites)
    return;
  using optim::StateKind;
  const std::size_t n = model_->layout().total();
  const bool share_moments = shares_moments(cfg_.sync.method);
  const auto mean = [&](StateKind kind) {
    return mean_of(sites_, kind, shard_map_, cfg_.transport.lanes, cfg_.transport.lane_share,
                   virtual_averager_.weights());
  };
  const auto x = mean(StateKind::kX);
  const auto u = share_moments ? mean(StateKind::kU) : std::vector<float>(n, 0.0f);
  const auto v = share_moments ? mean(StateKind::kV) : std::vector<float>(n, 0.0f);
  const std::int64_t optim_t = share_moments ? sites_[0].opt.state().t : 0;
  const std::size_t before = sites_.size();
  while (static_cast<int>(sites_.size()) < cfg_.sync.join_sites) {
    SiteReplica w = make_site(static_cast<int>(sites_.size()));
    w.x = x;
    w.opt.state().u = u;
    w.opt.state().v = v;
    w.opt.state().t = optim_t;
    // Skip the windows this site would have consumed had it run from the start, so the
    // data order stays a function of (seed, site) alone.
    for (auto& l : w.loaders) l.skip(static_cast<std::uint64_t>(t - 1));
    sites_.push_back(std::move(w));
  }
  virtual_averager_.resize(static_cast<int>(sites_.size()));
  weigh_sites();
  metrics_->write(JoinRecord{t - 1, before, sites_.size()});
  progress_->message(fmt::format("step {}: {} sites joined (now {})", t - 1, sites_.size() - before,
                                 sites_.size()));
}

std::uint64_t TrainingRun::job_tokens_per_step() const {
  std::uint64_t tokens = 0;
  if (networked_)
    for (const int s : rank_->live_sites) tokens += cfg_.site_tokens_per_step(s);
  else
    for (std::size_t i = 0; i < sites_.size(); ++i) tokens += cfg_.site_tokens_per_step(int(i));
  return tokens;
}

void TrainingRun::weigh_sites() {
  const std::vector<double> weights = cfg_.site_weights(static_cast<int>(sites_.size()));
  virtual_averager_.set_weights(weights);
  if (region_averager_) region_averager_->set_weights(weights);
}

sync::Traffic TrainingRun::traffic_of(int w) const {
  sync::Traffic t = averager_->traffic(w);
  t += traffic_base_;
  return t;
}

}  // namespace desloc::train
