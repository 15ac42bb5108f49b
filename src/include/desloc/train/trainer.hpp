// Training: the loop that drives model, optimizer, data, sync, evaluation, metrics and
// checkpoints, for one site or M in-process virtual sites.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "desloc/data/prepare.hpp"
#include "desloc/sync/averager.hpp"
#include "desloc/sync/collective_averager.hpp"
#include "desloc/train/config.hpp"
#include "desloc/transport/collective.hpp"
#include "desloc/transport/wire.hpp"

namespace desloc::train {

struct TrainOptions {
  bool resume = false;  // continue from the newest valid checkpoint in out_dir
  std::int64_t stop_after =
      -1;              // stop (with a checkpoint) once this many steps are done; -1 = run all
  int progress = -1;   // 1 = progress bar, 0 = log lines, -1 = bar only if stderr is a TTY
  bool quiet = false;  // no progress or status lines at all (warnings and errors still print)
  // Start afresh over another run's checkpoints and metrics in out_dir, or resume from an
  // older step than some ranks hold (discarding their newer work). Without it both refuse.
  bool force = false;
};

struct TrainResult {
  std::int64_t start_step = 0;
  std::int64_t steps_done = 0;  // optimizer steps completed in total (including before a resume)
  // The last step's training loss of one site: site 0 of job.sites in-process, this rank's
  // site when networked, so that `desloc train` and the leader of `desloc launch` report the
  // same quantity. train_loss_site names it.
  float last_train_loss = 0.0f;
  std::string train_loss_site;
  float last_val_loss = 0.0f;             // NaN when no evaluation ran
  double last_val_bpb = 0.0;              // bits per byte of that evaluation (NaN likewise)
  double unigram_entropy_nats = 0;        // of the training split, for comparison with val loss
  double tokens_per_s = 0;                // mean over this run's steps
  int sites = 1;                          // sites at the end of the run
  std::uint64_t bytes_sent_per_site = 0;  // ring all-reduce wire bytes of site 0, this run
  bool interrupted = false;               // stopped by SIGINT/SIGTERM after saving a checkpoint
  bool already_finished = false;          // resumed a run that had reached train.steps: nothing ran
  std::string last_checkpoint;
  std::string metrics;  // this process's metrics.jsonl (a networked rank's own: metrics_path)
};

// One networked rank of a multi-site job (set up by `desloc worker`): it holds its site's
// replica only. Without one, run_training runs every site in-process as a virtual site, and
// each site's R ranks as R micro-batches summed in the same ring order: the exact reference
// a multi-process run must reproduce.
struct RankContext {
  int site = 0;  // index into cfg.site_names(): the site's data partition and ring position
  int rank = 0;  // within the site, 0..R-1
  // The GPU of a cuda-backend rank: rank r of a site uses device r, for its model and for its
  // site's NCCL communicator alike (cluster::join_job).
  int device = 0;
  std::string name;  // "site/rank", for messages
  // The wide-area link this rank sends on (its WAN ring successor): every byte it reports as
  // wire traffic crossed "name -> wan_successor".
  std::string wan_successor;
  // The current ring's sites, as indices into cfg.site_names(), in ring order (the averager's
  // weights follow them).
  std::vector<int> live_sites;
  sync::Averager* averager = nullptr;           // across sites (CollectiveAverager)
  transport::Collective* site_group = nullptr;  // the site's R ranks; nullptr when R = 1
  // The rings of the wide-area segments this rank owns (sync::ShardMap), in segment order:
  // one, rank r of every site, for sites alike.
  std::vector<sync::WanRing> wan_rings;
  const sync::ShardMap* shard_map = nullptr;  // the job's (JobConfig::wan_map); null: even
  // The first ring: every site, one rank each (its size and this site's position are those of
  // every ring); null before the groups are bound.
  transport::Collective* wan_group() const {
    return wan_rings.empty() ? nullptr : wan_rings.front().ring;
  }
  // The rings alone, in segment order (for transport::gather_job).
  std::vector<transport::Collective*> rings() const {
    std::vector<transport::Collective*> out;
    for (const sync::WanRing& w : wan_rings) out.push_back(w.ring);
    return out;
  }
  std::function<void(std::int64_t)> on_step;  // after each step (heartbeats)
  // After each step's record: this rank's site loss, tokens/s, wide-area bytes sent so far and
  // the sites the payload guard has left out (what the heartbeats report to the coordinator's
  // status endpoint; the caller adds the sync timings).
  std::function<void(const transport::RankReport&)> on_progress;
  // Where this rank writes metrics and checkpoints. The leader (site 0, rank 0) uses
  // train.out_dir itself; the others use train.out_dir/ranks/<site>-<r>.
  bool leader() const { return site == 0 && rank == 0; }
  // This rank evaluates the mean model: rank 0 of the first live site (the leader while
  // site 0 lives).
  bool evaluates = false;
  std::uint64_t epoch = 1;  // the membership epoch of the groups above
  // Sites (WAN ranks of the current ring) that join in this epoch and need the state at the
  // resume step from a peer; `joining` when this rank's own site is one of them (a restarted
  // site), which then starts at join_step.
  std::vector<int> joining_sites;
  bool joining = false;
  std::int64_t join_step = 0;
  // Elastic recovery (job.on_site_failure = "continue"); empty otherwise. recovery_pending:
  // the coordinator closed the epoch. recover: rebuilds the groups in the next epoch (the
  // pointers above change) and returns the step to roll back to, one of `snapshots`.
  std::function<bool()> recovery_pending;
  std::function<std::int64_t(std::span<const std::int64_t> snapshots, const std::string& reason)>
      recover;
};

// The dataset in cfg.data.dir as data.format says: desloc's dataset.toml, or another tool's
// token files (data::external_dataset, whose vocabulary is model.vocab). Nothing is read but
// descriptions and headers.
data::DatasetInfo dataset_of(const JobConfig& cfg);

// The run's dataset (cfg.data.dir), checked against the model: DataError naming the file when
// it is missing or does not match what dataset.toml records, ConfigError when its vocabulary
// exceeds model.vocab. A networked rank calls it before it registers, so that bad data ends it
// before the job counts on it.
data::DatasetInfo load_training_data(const JobConfig& cfg);

// Runs training. Throws ConfigError/DataError with context (file, key, step) on bad input,
// and Error("loss is not finite at step N ...") if training diverges.
TrainResult run_training(const JobConfig& cfg, const TrainOptions& opts,
                         RankContext* rank = nullptr);

// Where run_training puts things inside cfg.train.out_dir. A rank's own directory: out_dir for
// the leader (site 0, rank 0), out_dir/ranks/<site>-<rank> for the others (`site` indexes
// cfg.site_names()).
std::string output_dir(const JobConfig& cfg, int site, int rank);
std::string metrics_path(const JobConfig& cfg, const RankContext* rank = nullptr);
std::string checkpoint_dir(const JobConfig& cfg, const RankContext* rank = nullptr);

}  // namespace desloc::train
