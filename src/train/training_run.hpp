// One training run (run_training): the sites' replicas, the step engine and everything around
// the loop (resume, evaluation, checkpoints, metrics, elastic recovery), as one object whose
// run() reads like DES-LOC's Alg. 1.
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "desloc/core/fault_plan.hpp"
#include "desloc/data/loader.hpp"
#include "desloc/model/model.hpp"
#include "desloc/sync/averager.hpp"
#include "desloc/sync/outer_optimizer.hpp"
#include "desloc/sync/regional_averager.hpp"
#include "desloc/sync/replanner.hpp"
#include "desloc/sync/site_reducer.hpp"
#include "desloc/sync/sync_engine.hpp"
#include "desloc/sync/sync_policy.hpp"
#include "desloc/train/config.hpp"
#include "desloc/train/resume_agreement.hpp"
#include "desloc/train/trainer.hpp"
#include "train/evaluation.hpp"
#include "train/fault_tolerance.hpp"
#include "train/metrics.hpp"
#include "train/progress.hpp"
#include "train/replica.hpp"

namespace desloc::train {

class TrainingRun : private FaultTolerance::Run {
 public:
  TrainingRun(const JobConfig& cfg, const TrainOptions& opts, RankContext* rank);
  TrainResult run();

 private:
  using Clock = std::chrono::steady_clock;
  struct StepResult {
    sync::SyncDecision due;
    float loss = 0, grad_norm = 0, lr = 0;
    double seconds = 0;
    double sync_seconds = 0;  // of `seconds`, in the sync engine's begin() and finish()
    double cpu_seconds = 0;   // the process's CPU meanwhile, every thread's
  };

  SiteReplica make_site(int index) const;
  void start(bool rejoining);  // the start agreements, then start_fresh or resume
  void start_fresh();
  void resume();
  void check_run_identity(const std::string& path, const Checkpoint& ck);
  void write_run_record();
  StartIntent start_intent() const;
  // The name this process's checkpoints carry: its rank's "site/r", or "in-process".
  std::string writer() const { return networked_ ? rank_->name : "in-process"; }
  // The outer optimizer and the compressed states, which travel with the replicas.
  SharedState shared() override {
    return {outer_ ? &*outer_ : nullptr, &compression_, &policy_, &run_id_};
  }
  bool stop_requested();

  StepResult take_step(std::int64_t t);                // Alg. 1: gradients, averages, update
  float site_gradient(std::size_t i, std::int64_t t);  // forward/backward + site mean
  void inject_poison(std::int64_t t, const sync::SyncDecision& due);
  void record_step(const StepResult& s);
  void evaluate(std::int64_t step);
  void save(std::int64_t step);
  // What a checkpoint and the run record carry: the config hash with the data's tokenizer.
  std::uint64_t job_hash() const { return cfg_.hash(dataset_.tokenizer_identity()); }
  void maybe_join(std::int64_t t);  // in-process elastic join

  // Elastic recovery (elastic.cpp): what the fault tolerance (ft_) needs of the run.
  bool talks_across_sites(std::int64_t t) const;
  void recover(const std::string& what);  // rolls back into the next membership epoch
  TrainState capture(TrainState reuse) override;
  std::uint64_t wire_bytes() override { return traffic_of(0).total_wire(); }
  SiteReplica& replica() override { return sites_[0]; }
  void transferred(std::int64_t step, bool joined, std::uint64_t bytes, double seconds) override;
  void release_groups() override;
  void bind_groups() override;  // a networked rank's averager, reducer and evaluator
  sync::Traffic traffic_of(int w) const;
  // sync.replan: after step t's job-wide average, what its control exchange measured; every
  // rank of the job decides alike and switches periods after the same step.
  void replan(std::int64_t t);
  // The replanner measures afresh from the periods in force at step `next`: a new epoch, a
  // resume or a rollback (every rank at the same step) forget its target too; `keep_target`
  // after a switch every rank made.
  void replan_reset(std::int64_t next, bool keep_target = false);

  const JobConfig& cfg_;
  const TrainOptions& opts_;
  RankContext* rank_;  // null in-process
  const bool networked_;
  // Site i of sites_'s index in cfg.site_names() (networked: this rank's site).
  int site_index(std::size_t i) const { return networked_ ? rank_->site : static_cast<int>(i); }
  // Tokens the live sites train on per step, together.
  std::uint64_t job_tokens_per_step() const;
  // The sites' weights on the in-process averagers (set_weights), for sites_ as it is now.
  void weigh_sites();

  const int T_;
  const sync::ShardMap shard_map_;  // the wide-area shards of each state (JobConfig::wan_map)
  const std::int64_t total_;
  // Per site: sites_[0]'s ranks each read its batch x T tokens.
  const std::uint64_t tokens_per_step_;
  sync::SyncPolicy policy_;                   // a re-plan adds period switches
  std::optional<sync::Replanner> replanner_;  // sync.replan on a networked rank
  data::DatasetInfo dataset_;
  // The training tokens, opened (and checked) once and read in place by every loader here.
  std::shared_ptr<const data::TokenStream> train_tokens_;
  std::unique_ptr<model::Model> model_;
  std::vector<SiteReplica> sites_;  // in-process: every site; networked: this rank's
  std::optional<sync::OuterNesterov> outer_;
  sync::CompressionState compression_;  // inactive unless a sync.codec_* is set
  sync::VirtualAverager virtual_averager_;
  // With job.regions in one process: each region's own averages, and the two levels as one.
  std::optional<sync::GroupedAverager> region_averager_;
  std::optional<sync::RegionalAverager> regional_;
  sync::Averager* averager_;  // a networked rank's changes when a recovery rebuilds the groups
  sync::SiteReducer reducer_;
  sync::SyncEngine engine_;
  Evaluator evaluator_;
  // The fault suite's: a poisoned payload (any run), a re-plan (a networked rank with
  // sync.replan).
  FaultPlan faults_;
  bool poisoned_ = false;  // the poison is injected once
  std::optional<MetricsWriter> metrics_;
  std::optional<ProgressReporter> progress_;
  std::optional<FaultTolerance> ft_;  // elastic networked ranks only

  TrainResult result_;
  // Drawn at a fresh start (agreed by every rank), read back on resume, received on a rejoin;
  // every checkpoint and the run record carry it.
  std::uint64_t run_id_ = 0;
  std::int64_t step_ = 0;
  std::uint64_t guard_rejections_ = 0;  // sites the payload guard left out, all steps
  // This site's wait at its latest average with a control exchange, and all of them summed
  // (the heartbeats' report).
  double last_wait_ms_ = 0.0, wait_seconds_ = 0.0;
  std::uint64_t tokens_seen_ = 0;  // per site
  int live_sites_;                 // fewer after a site failed
  std::vector<float> site_losses_;
  bool site_stop_ = false;      // a rank of this site asked to stop (networked)
  bool stop_agreed_ = false;    // the sites agreed to stop after this step
  sync::Traffic traffic_base_;  // of averagers that earlier membership epochs used
  std::vector<std::int32_t> inputs_, targets_;
};

}  // namespace desloc::train
