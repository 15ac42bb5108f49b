// The elastic side of a networked rank's training run (job.on_site_failure = "continue"): what
// the fault tolerance (fault_tolerance.hpp) needs of the run, and applying its rollback. The
// decisions live there and in the coordinator.
#include <fmt/format.h>

#include "desloc/core/cpu_time.hpp"
#include "desloc/core/error.hpp"
#include "train/training_run.hpp"

namespace desloc::train {

// Only exchanges that span every site count: the rollback points kept before them are what
// every survivor holds (FaultTolerance::before_step). With regions, sites of different regions drift apart
// between job-wide averages by up to their period, so points kept before the regions' own
// averages could leave survivors of different regions without a common one (the fault suite
// hit that).
bool TrainingRun::talks_across_sites(std::int64_t t) const {
  const bool eval_due =
      (cfg_.train.eval_every > 0 && t % cfg_.train.eval_every == 0) || t == total_;
  return policy_.global_at(t).any() || (eval_due && evaluator_.talks_across_sites());
}

TrainState TrainingRun::capture(TrainState reuse) {
  return capture_state(step_, tokens_seen_, sites_, shared(), std::move(reuse));
}

// A state transfer at `step` ended. A site that joined takes its own data partition, at the
// position of a site that never left; every rank's replanner measures the epoch's sites afresh.
void TrainingRun::transferred(std::int64_t step, bool joined, std::uint64_t bytes,
                              double seconds) {
  if (joined) {
    sites_[0].loaders = make_site(rank_->site).loaders;
    for (auto& l : sites_[0].loaders) l.skip(static_cast<std::uint64_t>(step));
    tokens_seen_ = static_cast<std::uint64_t>(step) * tokens_per_step_;
    const int S = rank_->wan_group()->size();
    metrics_->write(RejoinRecord{step, rank_->epoch, S, bytes, seconds});
    progress_->message(fmt::format(
        "{}: rejoined at step {} (epoch {}, {} sites): {} bytes of state in {:.2f} s, CRC32C "
        "checked",
        rank_->name, step, rank_->epoch, S, bytes, seconds));
  }
  replan_reset(step + 1);
}

// Before the groups are rebuilt: the traffic of the averager that goes with them is kept, and
// nothing uses them.
void TrainingRun::release_groups() {
  if (averager_ != nullptr) traffic_base_ += averager_->traffic(0);
  evaluator_.unbind();
  averager_ = nullptr;
}

// The context's averager and groups after a new epoch.
void TrainingRun::bind_groups() {
  averager_ = rank_->averager;
  reducer_ = sync::SiteReducer(rank_->site_group);
  evaluator_.bind(rank_);
  live_sites_ = rank_->wan_group()->size();
}

void TrainingRun::recover(const std::string& what) {
  const auto t_fail = Clock::now();
  const std::int64_t failed_at = step_ + 1;
  FaultTolerance::Rollback back = ft_->recover(failed_at, what);
  step_ = back.step;
  metrics_->rewind(back.step);
  if (!back.state) return;  // this site joins: a peer sends the state before the next step
  tokens_seen_ = restore_state(std::move(*back.state), sites_, shared());
  replan_reset(step_ + 1);
  const double took = seconds_since(t_fail);
  metrics_->write(RecoveryRecord{back.step, failed_at, rank_->epoch, live_sites_,
                                 failed_at - 1 - back.step, took, back.bytes_resent});
  progress_->message(fmt::format(
      "{}: membership epoch {} with {} site(s); rolled back to step {} ({} step(s) to replay, "
      "{} WAN bytes to resend), {:.2f} s after noticing the failure",
      rank_->name, rank_->epoch, live_sites_, back.step, failed_at - 1 - back.step,
      back.bytes_resent, took));
}

}  // namespace desloc::train
