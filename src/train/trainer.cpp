// The training loop: M sites (M = 1 is plain single-site training), each with its own data
// shard and optimizer state, synchronised by a SyncPolicy through an Averager in the order of
// DES-LOC's Alg. 1: gradients at the un-averaged x, then the due averages, then the local
// update. In-process, every site is a virtual worker and its R ranks are R micro-batches; as
// a networked rank (RankContext) the process holds one site's replica, all-reduces gradients
// with the site's other ranks and averages states across sites through the injected Averager.
#include "desloc/train/trainer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <limits>
#include <optional>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/core/hash.hpp"
#include "desloc/core/log.hpp"
#include "desloc/data/loader.hpp"
#include "desloc/model/model.hpp"
#include "desloc/optim/optimizer.hpp"
#include "desloc/sync/averager.hpp"
#include "desloc/sync/collective_averager.hpp"
#include "desloc/sync/outer_optimizer.hpp"
#include "desloc/sync/sync_policy.hpp"
#include "desloc/sync/synced_step.hpp"
#include "desloc/train/checkpoint.hpp"
#include "desloc/train/resume_agreement.hpp"
#include "desloc/transport/ring_order.hpp"
#include "train/metrics.hpp"
#include "train/progress.hpp"

namespace desloc::train {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

// Installs SIGINT/SIGTERM handlers for the duration of a run, restoring the old ones after.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {
  }, old_term_{};
};

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  return fmt::format("{:.7g}", v);
}

// A JSON string literal (quotes included) for free text such as a reason.
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Fault injection for the fault suite: $DESLOC_INJECT_POISON = "SITE:STEP[:nan|huge]" corrupts
// that site's parameters right before their first average at or after STEP, as a bug or a
// hostile site would; the payload guard must leave it out of that average.
struct Poison {
  std::string site;
  std::int64_t step = 0;
  bool huge = false;  // x1000 instead of NaN
};
std::optional<Poison> poison_from_environment() {
  const char* env = std::getenv("DESLOC_INJECT_POISON");
  if (env == nullptr || *env == '\0') return std::nullopt;
  const std::string text(env);
  const auto a = text.find(':');
  const auto b = text.find(':', a == std::string::npos ? a : a + 1);
  if (a == std::string::npos)
    throw ConfigError("$DESLOC_INJECT_POISON = '" + text + "': expected SITE:STEP[:nan|huge]");
  Poison p;
  p.site = text.substr(0, a);
  p.step = std::atoll(text.substr(a + 1, b == std::string::npos ? b : b - a - 1).c_str());
  p.huge = b != std::string::npos && text.substr(b + 1) == "huge";
  log::warn(
      "fault injection: site {} sends a {} parameter payload at its first x average from "
      "step {}",
      p.site, p.huge ? "1000x" : "NaN", p.step);
  return p;
}

std::string json_exact(float v) {
  if (!std::isfinite(v)) return "null";
  return fmt::format("{:.9g}", v);  // round-trips a float
}

// One site: its replica of x, its gradient, its optimizer state (u, v) and the data loaders of
// the ranks it holds (R in-process, 1 for a networked rank), with their gradient buffers.
struct Worker {
  std::vector<float> x, g;
  optim::Optimizer opt;
  std::vector<data::DataLoader> loaders;
  std::vector<std::vector<float>> micro_g;  // per-rank gradients when R > 1 in-process
};

// What a ring all-reduce over the site's ranks followed by "/ R" leaves, for in-process runs:
// bit for bit the networked rank's result (transport::ring_sum_reference).
void site_mean(std::span<const std::vector<float>> parts, std::span<float> out) {
  std::vector<std::span<const float>> views(parts.begin(), parts.end());
  transport::ring_sum_reference(views, out);
  const auto r = static_cast<float>(parts.size());
  for (float& x : out) x /= r;
}

std::vector<sync::Replica> replicas_of(std::vector<Worker>& workers) {
  std::vector<sync::Replica> out;
  out.reserve(workers.size());
  for (auto& w : workers) out.push_back({w.x, w.g, &w.opt});
  return out;
}

// Mean of one state over the in-process workers, without touching them (evaluation, elastic
// join), in the same order as the training averages.
std::vector<float> mean_of(std::vector<Worker>& workers, optim::StateKind kind, int ranks,
                           int lanes) {
  auto replicas = replicas_of(workers);
  const auto all = sync::state_views(replicas, kind);
  std::vector<float> mean(all[0].begin(), all[0].end());
  if (all.size() > 1) {
    std::vector<std::vector<float>> copies;
    for (auto& s : all) copies.emplace_back(s.begin(), s.end());
    std::vector<std::span<float>> views(copies.begin(), copies.end());
    sync::VirtualAverager ring(static_cast<int>(views.size()), sync::SumOrder::kRing, ranks, lanes);
    ring.average(kind, views);
    mean = std::move(copies[0]);
  }
  return mean;
}

float evaluate(model::Model& m, const data::EvalLoader& eval, int batches, int B, int T) {
  std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tgt(in.size());
  const std::uint64_t n =
      std::min<std::uint64_t>(static_cast<std::uint64_t>(batches), eval.num_batches());
  if (n == 0) return std::numeric_limits<float>::quiet_NaN();
  double sum = 0.0;
  for (std::uint64_t i = 0; i < n; ++i) {
    eval.batch(i, in, tgt);
    sum += m.forward({in, tgt, B, T});
  }
  return static_cast<float>(sum / double(n));
}

}  // namespace

namespace {
std::filesystem::path rank_dir(const JobConfig& cfg, const RankContext* rank) {
  std::filesystem::path dir(cfg.train.out_dir);
  if (rank == nullptr || rank->leader()) return dir;
  const auto sites = cfg.site_names();
  return dir / "ranks" /
         fmt::format("{}-{}", sites.at(static_cast<std::size_t>(rank->site)), rank->rank);
}
}  // namespace

std::string metrics_path(const JobConfig& cfg, const RankContext* rank) {
  return (rank_dir(cfg, rank) / "metrics.jsonl").string();
}
std::string checkpoint_dir(const JobConfig& cfg, const RankContext* rank) {
  return (rank_dir(cfg, rank) / "checkpoints").string();
}

TrainResult run_training(const JobConfig& cfg, const TrainOptions& opts, RankContext* rank) {
  using clock = std::chrono::steady_clock;
  using optim::StateKind;
  const int B = cfg.data.batch;
  const int T = cfg.seq_len();
  const int R = cfg.job.ranks_per_site;
  const std::int64_t total = cfg.train.steps;
  const sync::SyncPolicy policy(cfg.sync);
  // Data is partitioned for the largest worker count the run will reach, so workers that
  // join later never read a window another worker already owns. Site s's rank r reads
  // partition s * R + r.
  const int max_workers = std::max(cfg.sync.workers, cfg.sync.join_workers);
  const bool networked = rank != nullptr;
  if (networked) {
    if (rank->averager == nullptr || rank->wan_group == nullptr)
      throw Error("run_training: a networked rank needs its averager and WAN group");
    if ((R > 1) != (rank->site_group != nullptr && rank->site_group->size() > 1))
      throw Error(
          fmt::format("run_training: rank {} has a site group of {} but job.ranks_per_site = {}",
                      rank->name, rank->site_group ? rank->site_group->size() : 1, R));
    if (cfg.sync.join_step > 0)
      throw ConfigError(fmt::format(
          "{}: sync.join_step: elastic join runs in-process only (`desloc train`); a "
          "multi-process job changes membership through the coordinator (not built yet)",
          cfg.source));
  }

  const data::DatasetInfo dataset = data::load_dataset(cfg.data.dir);
  if (static_cast<int>(dataset.vocab) > cfg.model.vocab)
    throw ConfigError(
        fmt::format("{}: model.vocab = {} is smaller than the dataset's vocabulary {} ({})",
                    cfg.source, cfg.model.vocab, dataset.vocab, cfg.data.dir));

  auto model = model::make_model(cfg.model, {cfg.train.backend, cfg.train.threads, B, 0});
  const auto& layout = model->layout();
  const data::EvalLoader eval(dataset, B, T);
  auto make_worker = [&](int index) {
    Worker w{{}, std::vector<float>(layout.total()), optim::Optimizer(cfg.optim, layout), {}, {}};
    const int first = networked ? rank->rank : 0;
    const int count = networked ? 1 : R;
    for (int r = first; r < first + count; ++r)
      w.loaders.emplace_back(dataset, B, T, cfg.data.seed, index * R + r, max_workers * R);
    if (count > 1)
      w.micro_g.assign(static_cast<std::size_t>(count), std::vector<float>(layout.total()));
    return w;
  };
  std::vector<Worker> workers;
  if (networked)
    workers.push_back(make_worker(rank->site));
  else
    for (int w = 0; w < cfg.sync.workers; ++w) workers.push_back(make_worker(w));
  const int lanes = cfg.transport.lanes;
  sync::VirtualAverager virtual_averager(cfg.sync.workers, sync::SumOrder::kRing, R, lanes);
  // A networked rank's averager changes when a recovery rebuilds the groups.
  sync::Averager* averager = networked ? rank->averager : &virtual_averager;
  {
    sync::PayloadGuard guard;
    guard.site_names = cfg.site_names();
    virtual_averager.set_payload_guard(guard);
  }
  const std::optional<Poison> poison = poison_from_environment();
  bool poisoned = false;
  // The evaluation's parameter mean travels separately, so it never counts as training traffic.
  std::optional<sync::CollectiveAverager> eval_averager;
  if (networked) eval_averager.emplace(*rank->wan_group, rank->site_group, rank->wan_reverse);
  // Traffic of averagers that earlier membership epochs used (a recovery replaces it).
  sync::Traffic traffic_base;
  auto traffic_of = [&](int w) {
    sync::Traffic t = averager->traffic(w);
    for (std::size_t k = 0; k < t.wire.size(); ++k) {
      t.payload[k] += traffic_base.payload[k];
      t.wire[k] += traffic_base.wire[k];
      t.site_wire[k] += traffic_base.site_wire[k];
    }
    return t;
  };
  std::optional<sync::OuterNesterov> outer;
  if (cfg.sync.outer == "nesterov") outer.emplace(cfg.sync.outer_lr, cfg.sync.outer_momentum);

  TrainResult result;
  result.unigram_entropy_nats = dataset.unigram_entropy_nats;
  result.last_val_loss = std::numeric_limits<float>::quiet_NaN();
  std::uint64_t tokens_seen = 0;  // per worker
  const std::string ckpt_dir = checkpoint_dir(cfg, rank);

  if (opts.resume) {
    std::optional<FoundCheckpoint> found;
    if (networked) {
      // A restarted job resumes where every rank can: the newest step all of them hold intact.
      const auto choice =
          agree_on_resume_step(scan_checkpoints(ckpt_dir), rank->site_group, rank->wan_group,
                               {cfg.site_names(), rank->name, rank->leader()});
      if (!choice.step)
        throw DataError(fmt::format(
            "--resume: the job's ranks share no intact checkpoint step ({}'s are in '{}'); run "
            "without --resume to start fresh",
            rank->name, ckpt_dir));
      const std::string path = checkpoint_path(ckpt_dir, *choice.step);
      found = FoundCheckpoint{path, load_checkpoint(path)};
    } else {
      found = find_latest_checkpoint(ckpt_dir);
    }
    if (!found)
      throw DataError("--resume: no valid checkpoint in '" + ckpt_dir +
                      "'; run without --resume to start fresh");
    Checkpoint& ck = found->checkpoint;
    if (ck.config_hash != cfg.hash())
      throw ConfigError(
          fmt::format("--resume: checkpoint '{}' was written by a job with config hash {:016x}, "
                      "but {} hashes to {:016x}; "
                      "a change to the model, optimizer, schedule, data order, sync, seeds or step "
                      "count cannot resume "
                      "bit-exactly. Restore the original config or use a new train.out_dir",
                      found->path, ck.config_hash, cfg.source, cfg.hash()));
    for (const auto& w : ck.workers)
      if (w.params.size() != layout.total())
        throw DataError(fmt::format("'{}' holds {} parameters; the model has {}", found->path,
                                    w.params.size(), layout.total()));
    while (workers.size() < ck.workers.size())
      workers.push_back(make_worker(static_cast<int>(workers.size())));
    virtual_averager.resize(static_cast<int>(workers.size()));
    for (std::size_t i = 0; i < workers.size(); ++i) {
      workers[i].x = std::move(ck.workers[i].params);
      workers[i].opt.state().u = std::move(ck.workers[i].u);
      workers[i].opt.state().v = std::move(ck.workers[i].v);
      workers[i].opt.state().t = ck.workers[i].optim_t;
      // A site's ranks read the same number of windows per step from equal-sized
      // partitions, so one cursor describes them all (checked when saving).
      for (auto& l : workers[i].loaders) l.restore(ck.workers[i].loader);
    }
    if (outer) {
      outer->reference() = std::move(ck.outer_ref);
      outer->momentum() = std::move(ck.outer_momentum);
    }
    tokens_seen = ck.tokens_seen;
    result.start_step = ck.step;
    log::info("resumed from {} at step {} ({} worker{})", found->path, ck.step, workers.size(),
              workers.size() == 1 ? "" : "s");
  } else {
    std::vector<float> x0(layout.total());
    model::init_params(layout, cfg.model, cfg.train.seed, x0);
    for (auto& w : workers) w.x = x0;  // every worker starts from the same point
    if (outer) outer->reset(x0);
  }
  // A restarted site rejoining a running job starts at the epoch's resume step; its state
  // arrives from a peer before its first step (transfer_state below).
  const bool rejoining = networked && rank->joining && !opts.resume;
  if (rejoining) {
    result.start_step = rank->join_step;
    log::info("{}: rejoining at step {}; waiting for the state from a peer", rank->name,
              rank->join_step);
  }

  // A rejoining site keeps the records of its first life (up to the step it rejoins at).
  MetricsWriter metrics(metrics_path(cfg, rank), opts.resume || rejoining, result.start_step);
  const bool tty = opts.progress == 1 || (opts.progress == -1 && ::isatty(STDERR_FILENO));
  int sites = cfg.sync.workers;  // live sites: fewer after a site failed
  const std::string site_list = fmt::format("{}", fmt::join(cfg.site_names(), ","));
  ProgressReporter progress(result.start_step, total, tty, cfg.train.log_every, opts.quiet);
  if (!opts.resume && !rejoining) {
    metrics.write_line(fmt::format(
        R"({{"type":"run","name":"{}","method":"{}","workers":{},"kx":{},"ku":{},"kv":{},"outer":"{}",)"
        R"("parameters":{},"batch":{},"seq_len":{},"steps":{},"config_hash":"{:016x}",)"
        R"("sites":"{}","ranks_per_site":{},"rank":"{}","wan_link":"{}"}})",
        std::filesystem::path(cfg.train.out_dir).filename().string(), cfg.sync.method,
        cfg.sync.workers, cfg.sync.averages_params() ? std::to_string(cfg.sync.kx) : "null",
        cfg.sync.method == "desloc" ? std::to_string(cfg.sync.effective_ku()) : "null",
        cfg.sync.method == "desloc" ? std::to_string(cfg.sync.effective_kv()) : "null",
        cfg.sync.outer, layout.total(), B, T, total, cfg.hash(), site_list, R,
        networked ? rank->name : "all",
        networked && !rank->wan_successor.empty() ? rank->name + "->" + rank->wan_successor : ""));
    progress.message(fmt::format(
        "desloc train: {} parameters ({} backend), {} site{} x {} rank{} ({}{}), B={} T={}, {} "
        "steps, {} train / {} val tokens, unigram entropy {:.4f} nats",
        layout.total(), model->backend_name(), sites, sites == 1 ? "" : "s", R, R == 1 ? "" : "s",
        cfg.sync.method,
        networked ? ", this process is " + rank->name : std::string(", in-process"), B, T, total,
        dataset.train_tokens, dataset.val_tokens, dataset.unigram_entropy_nats));
  }

  auto save = [&](std::int64_t step) {
    Checkpoint ck;
    ck.config_hash = cfg.hash();
    ck.step = step;
    ck.tokens_seen = tokens_seen;
    for (auto& w : workers) {
      for (const auto& l : w.loaders)
        if (l.state().epoch != w.loaders[0].state().epoch ||
            l.state().cursor != w.loaders[0].state().cursor)
          throw Error(fmt::format(
              "checkpoint at step {}: the ranks of one site disagree on the data position; "
              "their partitions differ in size (report this with the dataset and batch)",
              step));
      ck.workers.push_back(
          {w.opt.state().t, w.loaders[0].state(), w.x, w.opt.state().u, w.opt.state().v});
    }
    if (outer) {
      ck.outer_ref = outer->reference();
      ck.outer_momentum = outer->momentum();
    }
    const std::string path = checkpoint_path(ckpt_dir, step);
    save_checkpoint(path, ck);
    result.last_checkpoint = path;
  };
  // Validation loss of the workers' mean parameters (the model DES-LOC would ship); for one
  // worker that is its own x. A networked job averages x across sites for it (every rank takes
  // part; the leader alone evaluates). Under ddp every site holds the same x, and under none
  // the sites are independent models: both evaluate site 0's own x, with no traffic.
  const bool eval_site0 = cfg.sync.method == "ddp" || cfg.sync.method == "none";
  auto run_eval = [&](std::int64_t step) {
    const auto t0 = clock::now();
    std::vector<float> mean_x;
    if (eval_site0) {
      if (networked && !rank->evaluates) return;
      mean_x = workers[0].x;
    } else if (networked) {
      mean_x = workers[0].x;
      std::span<float> view(mean_x);
      eval_averager->begin_step(step);
      eval_averager->average(StateKind::kX, std::span<const std::span<float>>(&view, 1));
      if (!rank->evaluates) return;
    } else {
      mean_x = mean_of(workers, StateKind::kX, R, lanes);
    }
    std::copy(mean_x.begin(), mean_x.end(), model->params().begin());
    model->params_updated();
    const float val = evaluate(*model, eval, cfg.train.eval_batches, B, T);
    const double secs = std::chrono::duration<double>(clock::now() - t0).count();
    result.last_val_loss = val;
    metrics.write_line(
        fmt::format(R"({{"type":"eval","step":{},"val_loss":{},"eval_s":{},"workers":{}}})", step,
                    json_number(val), json_number(secs), workers.size()));
    progress.message(fmt::format("step {}/{}: val_loss {:.4f} (unigram entropy {:.4f})", step,
                                 total, val, dataset.unigram_entropy_nats));
  };
  // Elastic join: at the first sync boundary from join_step on, new workers start from the
  // average at that sync: the mean x, and the mean u and v when the method averages them
  // (desloc, local_adam). Under keep-local methods (favg, favg_reset) optimizer state is never
  // shared, so a newcomer starts Adam afresh (u = v = 0, bias correction from step 1).
  auto maybe_join = [&](std::int64_t t, const sync::SyncDecision& due) {
    if (cfg.sync.join_step <= 0 || t < cfg.sync.join_step || !due.any() ||
        static_cast<int>(workers.size()) >= cfg.sync.join_workers)
      return;
    const bool share_moments = cfg.sync.method == "desloc" || cfg.sync.method == "local_adam";
    const auto x = mean_of(workers, StateKind::kX, R, lanes);
    const auto u = share_moments ? mean_of(workers, StateKind::kU, R, lanes)
                                 : std::vector<float>(layout.total(), 0.0f);
    const auto v = share_moments ? mean_of(workers, StateKind::kV, R, lanes)
                                 : std::vector<float>(layout.total(), 0.0f);
    const std::int64_t optim_t = share_moments ? workers[0].opt.state().t : 0;
    const std::size_t before = workers.size();
    while (static_cast<int>(workers.size()) < cfg.sync.join_workers) {
      Worker w = make_worker(static_cast<int>(workers.size()));
      w.x = x;
      w.opt.state().u = u;
      w.opt.state().v = v;
      w.opt.state().t = optim_t;
      // Skip the windows this worker would have consumed had it run from the start, so the
      // data order stays a function of (seed, worker) alone.
      for (auto& l : w.loaders) l.skip(static_cast<std::uint64_t>(t - 1));
      workers.push_back(std::move(w));
    }
    virtual_averager.resize(static_cast<int>(workers.size()));
    metrics.write_line(
        fmt::format(R"({{"type":"join","step":{},"workers_before":{},"workers_after":{}}})", t - 1,
                    before, workers.size()));
    progress.message(fmt::format("step {}: {} workers joined (now {})", t - 1,
                                 workers.size() - before, workers.size()));
  };

  StopSignals signals;
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(B) * T), targets(inputs.size());
  // Per site: its R ranks each read B sequences of T tokens.
  const std::uint64_t tokens_per_step =
      static_cast<std::uint64_t>(B) * static_cast<std::uint64_t>(T) * static_cast<std::uint64_t>(R);
  std::vector<float> site_losses;  // this step's loss of every site held here
  // Sites stop together: a networked rank learns of a stop request (SIGINT/SIGTERM) from its
  // site's ranks every step and from the other sites at each sync, and all stop after the
  // same step. Without any cross-site sync (method = none) a site stops on its own.
  bool stop_agreed = false;
  float site_stop = 0.0f;
  const auto run_start = clock::now();
  std::int64_t step = result.start_step;

  // Elastic recovery (a networked rank with job.on_site_failure = "continue"): before every
  // step that talks across sites, the rank keeps a snapshot of everything the step changes.
  // When a collective breaks (a site died, a link failed) the coordinator opens a new epoch
  // over the survivors at the newest step all of them hold, and each rolls back to it: a
  // partial average of the failed epoch is never applied. Survivors are at most one
  // cross-site exchange apart (passing one needs every rank in it), so two snapshots suffice.
  struct Snapshot {
    std::int64_t step = 0;
    std::vector<float> x, u, v;
    std::int64_t optim_t = 0;
    std::vector<data::LoaderState> loaders;
    std::uint64_t tokens_seen = 0;
    std::vector<float> outer_ref, outer_momentum;
    std::uint64_t wire = 0;  // WAN bytes sent before this step
  };
  std::deque<Snapshot> snapshots;
  bool pending_transfer = rejoining;  // sites join in this epoch: send or take the state
  const bool elastic = networked && static_cast<bool>(rank->recover);
  auto talks_across_sites = [&](std::int64_t t) {
    const bool eval_due = (cfg.train.eval_every > 0 && t % cfg.train.eval_every == 0) || t == total;
    return policy.at(t).any() || (eval_due && !eval_site0);
  };
  auto take_snapshot = [&] {
    while (!snapshots.empty() && snapshots.back().step >= step) snapshots.pop_back();
    Snapshot sn;
    const Worker& w = workers[0];
    sn.step = step;
    sn.x = w.x;
    sn.u = w.opt.state().u;
    sn.v = w.opt.state().v;
    sn.optim_t = w.opt.state().t;
    for (const auto& l : w.loaders) sn.loaders.push_back(l.state());
    sn.tokens_seen = tokens_seen;
    if (outer) {
      sn.outer_ref = outer->reference();
      sn.outer_momentum = outer->momentum();
    }
    sn.wire = traffic_of(0).total_wire();
    snapshots.push_back(std::move(sn));
    while (snapshots.size() > 2) snapshots.pop_front();
  };
  int recoveries = 0;
  // A step that fails again and again in fresh epochs is no site failure but a fault that
  // travels with the data (or a bug): give up rather than loop.
  constexpr int kMaxFailuresOfOneStep = 3;
  std::int64_t last_failed_at = -1;
  int failures_of_step = 0;
  auto recover = [&](const std::string& what) {
    const auto t_fail = clock::now();
    const std::int64_t failed_at = step + 1;
    failures_of_step = failed_at == last_failed_at ? failures_of_step + 1 : 1;
    last_failed_at = failed_at;
    if (failures_of_step > kMaxFailuresOfOneStep)
      throw PeerFailure(fmt::format(
          "{}: step {} failed {} times, each time in a new membership epoch; giving up (last "
          "failure: {})",
          rank->name, failed_at, failures_of_step, what));
    const std::uint64_t wire_at_failure = traffic_of(0).total_wire();
    const sync::Traffic old = averager->traffic(0);
    for (std::size_t k = 0; k < old.wire.size(); ++k) {
      traffic_base.payload[k] += old.payload[k];
      traffic_base.wire[k] += old.wire[k];
      traffic_base.site_wire[k] += old.site_wire[k];
    }
    eval_averager.reset();
    averager = nullptr;
    std::vector<std::int64_t> offer;
    for (const auto& sn : snapshots) offer.push_back(sn.step);
    log::warn("{}: step {} failed ({}); recovering with rollback point(s) [{}]", rank->name,
              failed_at, what, fmt::join(offer, ", "));
    const std::int64_t resume = rank->recover(offer, what);
    averager = rank->averager;
    eval_averager.emplace(*rank->wan_group, rank->site_group, rank->wan_reverse);
    pending_transfer = !rank->joining_sites.empty();
    if (rank->joining) {  // this rank offered no usable snapshot: a peer sends the state
      step = resume;
      sites = rank->wan_group->size();
      metrics.rewind(resume);
      return;
    }
    const auto it = std::find_if(snapshots.begin(), snapshots.end(),
                                 [&](const Snapshot& sn) { return sn.step == resume; });
    if (it == snapshots.end())
      throw PeerFailure(fmt::format(
          "{}: the coordinator resumes at step {}, which this rank holds no snapshot of ([{}])",
          rank->name, resume, fmt::join(offer, ", ")));
    Worker& w = workers[0];
    w.x = it->x;
    w.opt.state().u = it->u;
    w.opt.state().v = it->v;
    w.opt.state().t = it->optim_t;
    for (std::size_t i = 0; i < w.loaders.size(); ++i) w.loaders[i].restore(it->loaders[i]);
    tokens_seen = it->tokens_seen;
    if (outer) {
      outer->reference() = it->outer_ref;
      outer->momentum() = it->outer_momentum;
    }
    const std::uint64_t resent = wire_at_failure - it->wire;
    snapshots.erase(std::next(it), snapshots.end());
    step = resume;
    sites = rank->wan_group->size();
    ++recoveries;
    const double took = std::chrono::duration<double>(clock::now() - t_fail).count();
    metrics.rewind(resume);
    metrics.write_line(fmt::format(
        R"({{"type":"recovery","step":{},"failed_step":{},"epoch":{},"sites":{},)"
        R"("replayed_steps":{},"recover_s":{},"bytes_resent":{}}})",
        resume, failed_at, rank->epoch, sites, failed_at - 1 - resume, json_number(took), resent));
    progress.message(fmt::format(
        "{}: membership epoch {} with {} site(s); rolled back to step {} ({} step(s) to replay, "
        "{} WAN bytes to resend), {:.2f} s after noticing the failure",
        rank->name, rank->epoch, sites, resume, failed_at - 1 - resume, resent, took));
  };

  // Brings the sites that join in this epoch up to date. For each joining site (in ring order)
  // its nearest ring predecessor that is not joining is the donor (the ring is the planner's
  // choice from measured bandwidth, so that link is a measured one): WAN ring r carries block
  // r of x, u and v behind a header (step, optimizer step, CRC32C of each block), and the
  // receiver checks every block before using it. The joining site's ranks then all-gather
  // their blocks. Everyone else passes scratch buffers.
  auto transfer_state = [&] {
    transport::Collective& wan = *rank->wan_group;
    const int S = wan.size(), me = wan.rank();
    const auto& joining = rank->joining_sites;
    auto is_joining = [&](int site) {
      return std::find(joining.begin(), joining.end(), site) != joining.end();
    };
    Worker& w = workers[0];
    const std::size_t n = layout.total();
    const int ranks = rank->site_group != nullptr ? rank->site_group->size() : 1;
    const int r = rank->site_group != nullptr ? rank->site_group->rank() : 0;
    const transport::Range mine = transport::block(n, ranks, r);
    std::array<std::vector<float>*, 3> states{&w.x, &w.opt.state().u, &w.opt.state().v};
    std::vector<float> scratch(mine.count);
    const auto t0 = clock::now();
    std::uint64_t moved = 0;
    for (const int j : joining) {
      int donor = j;
      do donor = (donor - 1 + S) % S;
      while (is_joining(donor) && donor != j);
      if (donor == j)
        throw PeerFailure(
            fmt::format("{}: every site of epoch {} is joining; none can donate "
                        "the state",
                        rank->name, rank->epoch));
      const bool giving = me == donor, receiving = me == j;
      auto crc_of = [&](std::span<const float> v) {
        return crc32c({reinterpret_cast<const std::uint8_t*>(v.data()), v.size_bytes()});
      };
      std::array<std::int64_t, 5> head{step, w.opt.state().t, 0, 0, 0};
      for (int k = 0; k < 3; ++k)
        if (giving)
          head[std::size_t(2 + k)] = crc_of(
              std::span<const float>(*states[std::size_t(k)]).subspan(mine.offset, mine.count));
      wan.set_label({step, 255, static_cast<std::uint32_t>(r)});
      wan.broadcast(std::as_writable_bytes(std::span(head)), donor);
      for (int k = 0; k < 3; ++k) {
        std::span<float> buf =
            giving || receiving
                ? std::span<float>(*states[std::size_t(k)]).subspan(mine.offset, mine.count)
                : std::span<float>(scratch);
        wan.set_label({step, static_cast<std::uint8_t>(k + 1), static_cast<std::uint32_t>(r)});
        wan.broadcast(buf, donor);
        moved += buf.size_bytes();
        if (receiving && crc_of(buf) != static_cast<std::uint32_t>(head[std::size_t(2 + k)]))
          throw PeerFailure(fmt::format(
              "{}: the state transfer from {} failed its CRC32C check (block {} of '{}'); the "
              "job retries in a new epoch",
              rank->name, donor, r,
              k == 0   ? "x"
              : k == 1 ? "u"
                       : "v"));
      }
      if (receiving) {
        if (head[0] != step)
          throw PeerFailure(fmt::format("{}: the donor sent the state of step {}, expected {}",
                                        rank->name, head[0], step));
        w.opt.state().t = head[1];
      }
      if (outer) {  // the outer optimizer's state is the same on every site: send it whole
        for (std::vector<float>* v : {&outer->reference(), &outer->momentum()}) {
          std::vector<float> tmp = giving || receiving ? *v : std::vector<float>(v->size());
          wan.broadcast(std::span<float>(tmp), donor);
          if (receiving) *v = std::move(tmp);
        }
      }
    }
    if (rank->joining) {
      if (rank->site_group != nullptr) {  // the site's ranks share their blocks
        const std::size_t blk = transport::block(n, ranks, 0).count;
        std::vector<float> gathered(blk * static_cast<std::size_t>(ranks));
        for (std::vector<float>* v : states) {
          std::copy_n(v->begin() + static_cast<std::ptrdiff_t>(mine.offset), mine.count,
                      gathered.begin() + static_cast<std::ptrdiff_t>(r * blk));
          rank->site_group->all_gather(std::span<const float>(gathered).subspan(r * blk, blk),
                                       gathered);
          for (int q = 0; q < ranks; ++q) {
            const transport::Range b = transport::block(n, ranks, q);
            std::copy_n(gathered.begin() + static_cast<std::ptrdiff_t>(q * blk), b.count,
                        v->begin() + static_cast<std::ptrdiff_t>(b.offset));
          }
        }
      }
      // Its own data partition, at the position of a site that never left.
      for (auto& l : w.loaders) l.skip(static_cast<std::uint64_t>(step));
      tokens_seen = static_cast<std::uint64_t>(step) * tokens_per_step;
      const double took = std::chrono::duration<double>(clock::now() - t0).count();
      metrics.write_line(fmt::format(
          R"({{"type":"rejoin","step":{},"epoch":{},"sites":{},"state_bytes":{},"transfer_s":{}}})",
          step, rank->epoch, S, moved, json_number(took)));
      progress.message(fmt::format(
          "{}: rejoined at step {} (epoch {}, {} sites): {} bytes of state in {:.2f} s, CRC32C "
          "checked",
          rank->name, step, rank->epoch, S, moved, took));
      rank->joining = false;
    }
    rank->joining_sites.clear();
  };
  while (step < total) {
    if (opts.stop_after >= 0 && step >= opts.stop_after) break;
    if ((!networked && g_stop_signal != 0) || stop_agreed) {
      progress.message(fmt::format(
          "{} received: checkpointing at step {} and stopping",
          networked ? std::string("a stop request") : fmt::format("signal {}", int(g_stop_signal)),
          step));
      result.interrupted = true;
      break;
    }
    const std::int64_t t = step + 1;  // the 1-based number of the step being taken
    // A rejoining rank has nothing worth a snapshot until its state arrived.
    if (elastic && talks_across_sites(t) && !(pending_transfer && rank->joining)) take_snapshot();
    try {
      if (pending_transfer) {
        const bool was_joining = rank->joining;
        transfer_state();
        pending_transfer = false;
        if (was_joining && elastic && talks_across_sites(t)) take_snapshot();
      }
      if (elastic && rank->recovery_pending())
        throw PeerFailure(
            fmt::format("{}: the coordinator closed membership epoch {}", rank->name, rank->epoch));
      maybe_join(t, policy.at(t));
      site_losses.resize(workers.size());  // workers may have joined
      const auto t0 = clock::now();

      double loss_sum = 0.0;
      auto gradient = [&](std::size_t i) {
        Worker& w = workers[i];
        std::copy(w.x.begin(), w.x.end(), model->params().begin());
        model->params_updated();
        std::vector<std::vector<float>> micro_loss(w.loaders.size(), std::vector<float>(1));
        for (std::size_t m = 0; m < w.loaders.size(); ++m) {
          w.loaders[m].next(inputs, targets);
          const float loss = model->forward_backward({inputs, targets, B, T});
          if (!std::isfinite(loss))
            throw Error(fmt::format(
                "loss is not finite ({}) at step {} on {}; lower schedule.lr or enable "
                "optim.clip (last good checkpoint: {})",
                loss, t, networked ? rank->name : fmt::format("worker {} rank {}", i, m),
                result.last_checkpoint.empty() ? "none" : result.last_checkpoint));
          const auto g = model->grads();
          std::copy(g.begin(), g.end(), w.micro_g.empty() ? w.g.begin() : w.micro_g[m].begin());
          micro_loss[m][0] = loss;
        }
        float site_loss = micro_loss[0][0];
        if (!w.micro_g.empty()) {  // in-process: the site's R ranks, summed as the ring would
          site_mean(w.micro_g, w.g);
          std::vector<float> mean(1);
          site_mean(micro_loss, mean);
          site_loss = mean[0];
        } else if (networked && rank->site_group != nullptr) {
          rank->site_group->all_reduce_sum(w.g);
          const auto r = static_cast<float>(R);
          for (float& x : w.g) x /= r;
          // The loss and this rank's stop request ride one small all-reduce: element 0 sums in
          // rank order, as site_mean's does.
          std::array<float, 2> small{site_loss, g_stop_signal != 0 ? 1.0f : 0.0f};
          rank->site_group->all_reduce_sum(small);
          site_loss = small[0] / r;
          site_stop = small[1];
        } else if (networked) {
          site_stop = g_stop_signal != 0 ? 1.0f : 0.0f;
        }
        site_losses.at(i) = site_loss;
        // Fault injection: after the gradient, before the averages of this step.
        const int site_of_i = networked ? rank->site : static_cast<int>(i);
        if (poison && !poisoned && t >= poison->step && policy.at(t).x &&
            cfg.site_names().at(static_cast<std::size_t>(site_of_i)) == poison->site) {
          if (poison->huge)
            for (float& x : w.x) x *= 1000.0f;
          else
            w.x[0] = std::numeric_limits<float>::quiet_NaN();
          poisoned = true;
        }
        loss_sum += site_loss;
      };
      std::vector<sync::Replica> replicas = replicas_of(workers);
      const float lr = optim::learning_rate(cfg.schedule, step, total);
      const sync::StepReport report =
          sync::run_synced_step(t, policy, *averager, replicas, gradient, lr,
                                {&cfg.clip, outer ? &*outer : nullptr, false});
      const float grad_norm = report.grad_norm;
      ++step;
      tokens_seen += tokens_per_step;
      if (networked) {
        if (cfg.sync.method == "none") {
          stop_agreed = site_stop > 0.0f;
        } else if (report.due.any()) {
          std::array<float, 1> flag{site_stop};
          rank->wan_group->set_label({t, 255, static_cast<std::uint32_t>(rank->rank)});
          rank->wan_group->all_reduce_sum(flag);
          stop_agreed = flag[0] > 0.0f;
        }
        if (rank->on_step) rank->on_step(step);
      }

      const double step_s = std::chrono::duration<double>(clock::now() - t0).count();
      const double tps = double(tokens_per_step) * double(sites) / step_s;
      const float loss = static_cast<float>(loss_sum / double(workers.size()));
      result.last_train_loss = loss;
      const sync::Traffic traffic = traffic_of(0);
      // Every worker's wire total: equal under a ring, except for workers that joined late.
      std::string by_worker, loss_by_site;
      for (std::size_t i = 0; i < workers.size(); ++i) {
        by_worker +=
            fmt::format("{}{}", i ? "," : "", traffic_of(static_cast<int>(i)).total_wire());
        loss_by_site += fmt::format("{}{}", i ? "," : "", json_exact(site_losses[i]));
      }
      const std::uint64_t site_bytes =
          networked && rank->site_group != nullptr ? rank->site_group->bytes().total().sent : 0;
      metrics.write_line(fmt::format(
          R"({{"type":"train","step":{},"loss":{},"lr":{},"grad_norm":{},"tokens_per_s":{},"step_ms":{},)"
          R"("tokens":{},"workers":{},"synced":"{}{}{}{}","bytes_sent":{},)"
          R"("bytes_by_state":{{"grad":{},"x":{},"u":{},"v":{}}},)"
          R"("payload_by_state":{{"grad":{},"x":{},"u":{},"v":{}}},"bytes_sent_by_worker":[{}],)"
          R"("loss_by_site":[{}],"site_bytes_sent":{}}})",
          step, json_number(loss), json_number(lr), json_number(grad_norm), json_number(tps),
          json_number(step_s * 1e3), tokens_seen, workers.size(), report.due.grad ? "g" : "",
          report.due.x ? "x" : "", report.due.u ? "u" : "", report.due.v ? "v" : "",
          traffic.total_wire(), traffic.wire[0], traffic.wire[1], traffic.wire[2], traffic.wire[3],
          traffic.payload[0], traffic.payload[1], traffic.payload[2], traffic.payload[3], by_worker,
          loss_by_site, site_bytes));
      for (const sync::Rejection& rj : averager->rejections())
        metrics.write_line(fmt::format(
            R"({{"type":"rejection","step":{},"state":"{}","site":{},"reason":{}}})", rj.step,
            optim::to_string(rj.state), json_string(averager->payload_guard().site_name(rj.site)),
            json_string(rj.reason)));
      averager->clear_rejections();
      progress.step(step, loss, lr, tps);

      const bool last = step == total;
      if ((cfg.train.eval_every > 0 && step % cfg.train.eval_every == 0) || last) run_eval(step);
      if ((cfg.train.checkpoint_every > 0 && step % cfg.train.checkpoint_every == 0) || last)
        save(step);
    } catch (const TransportError& e) {
      if (!elastic) throw;
      recover(e.message());
    } catch (const TimeoutError& e) {
      if (!elastic) throw;
      recover(e.message());
    } catch (const PeerFailure& e) {
      if (!elastic) throw;
      recover(e.message());
    }
  }
  if (step < total && step > result.start_step)
    save(step);  // stop_after or a signal: keep the work
  progress.finish();

  result.steps_done = step;
  result.workers = static_cast<int>(workers.size());
  result.bytes_sent_per_worker = traffic_of(0).total_wire();
  const double secs = std::chrono::duration<double>(clock::now() - run_start).count();
  if (step > result.start_step && secs > 0)
    result.tokens_per_s =
        double(step - result.start_step) * double(tokens_per_step) * double(sites) / secs;
  return result;
}

}  // namespace desloc::train
