// The elastic side of a networked rank's training run (job.on_site_failure = "continue"):
// rollback points before steps that talk across sites, the rollback into the coordinator's
// next membership epoch, and taking in a site that (re)joins. The decisions live in
// cluster::Recovery and the coordinator; this file applies them to the run.
#include <fmt/format.h>

#include "desloc/core/cpu_time.hpp"
#include "desloc/core/error.hpp"
#include "train/training_run.hpp"

namespace desloc::train {

// Only exchanges that span every site count: the rollback points kept before them are what
// every survivor holds (Recovery::keep). With regions, sites of different regions drift apart
// between job-wide averages by up to their period, so points kept before the regions' own
// averages could leave survivors of different regions without a common one (the fault suite
// hit that).
bool TrainingRun::talks_across_sites(std::int64_t t) const {
  const bool eval_due =
      (cfg_.train.eval_every > 0 && t % cfg_.train.eval_every == 0) || t == total_;
  return policy_.global_at(t).any() || (eval_due && evaluator_.talks_across_sites());
}

void TrainingRun::before_step(std::int64_t t) {
  if (!networked_) return;
  auto keep_point = [&] {
    if (recovery_ && talks_across_sites(t))
      recovery_->keep(capture_state(step_, tokens_seen_, sites_, shared(), recovery_->spare(step_)),
                      traffic_of(0).total_wire());
  };
  // A rejoining rank has nothing worth keeping until its state arrived.
  if (!(pending_transfer_ && rank_->joining)) keep_point();
  if (pending_transfer_) {
    const bool was_joining = rank_->joining;
    receive_joined_state();
    pending_transfer_ = false;
    if (was_joining) keep_point();
  }
  if (recovery_ && rank_->recovery_pending())
    throw PeerFailure(
        fmt::format("{}: the coordinator closed membership epoch {}", rank_->name, rank_->epoch));
}

// The sites that join in this epoch receive x, u, v and the optimizer step at the resume step
// from a peer; this rank gives, receives or passes scratch (cluster::transfer_state).
void TrainingRun::receive_joined_state() {
  const auto t0 = Clock::now();
  const std::uint64_t moved = cluster::transfer_state(*rank_, step_, sites_[0], shared());
  if (rank_->joining) {
    // Its own data partition, at the position of a site that never left.
    sites_[0].loaders = make_site(rank_->site).loaders;
    for (auto& l : sites_[0].loaders) l.skip(static_cast<std::uint64_t>(step_));
    tokens_seen_ = static_cast<std::uint64_t>(step_) * tokens_per_step_;
    const int S = rank_->wan_group->size();
    const double took = seconds_since(t0);
    metrics_->write(RejoinRecord{step_, rank_->epoch, S, moved, took});
    progress_->message(fmt::format(
        "{}: rejoined at step {} (epoch {}, {} sites): {} bytes of state in {:.2f} s, CRC32C "
        "checked",
        rank_->name, step_, rank_->epoch, S, moved, took));
    rank_->joining = false;
  }
  rank_->joining_sites.clear();
  replan_reset(step_ + 1);  // every rank: the epoch's sites measure afresh
}

// The context's averager and groups after a new epoch.
void TrainingRun::bind_groups() {
  averager_ = rank_->averager;
  reducer_ = sync::SiteReducer(rank_->site_group);
  evaluator_.bind(rank_);
  live_sites_ = rank_->wan_group->size();
  pending_transfer_ = !rank_->joining_sites.empty();
}

void TrainingRun::recover(const std::string& what) {
  const auto t_fail = Clock::now();
  const std::int64_t failed_at = step_ + 1;
  const std::uint64_t wire_now = traffic_of(0).total_wire();
  traffic_base_ += averager_->traffic(0);
  evaluator_.unbind();
  averager_ = nullptr;
  cluster::Recovery::Rollback back = recovery_->recover(failed_at, what, wire_now);
  bind_groups();
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
