// Fault tolerance of one networked rank (job.on_site_failure = "continue"), in one place: the
// rollback points kept before steps that talk across sites, the rollback into the
// coordinator's next membership epoch when a collective breaks, the retried start, and the
// state transfer to a site that (re)joins. The training loop sees three calls (before_step,
// recover, retry_start) and implements a small interface (Run) for what they need of it; the
// membership itself (the control plane, the groups) stays behind the rank's context, which
// cluster::run_worker fills.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <optional>
#include <string>

#include "desloc/core/error.hpp"
#include "desloc/train/trainer.hpp"
#include "train/replica.hpp"

namespace desloc::train {

class FaultTolerance {
 public:
  // What the fault tolerance needs of the run it protects (TrainingRun implements it).
  class Run {
   public:
    // The state before the next step, captured into `reuse`'s buffers where they fit.
    virtual TrainState capture(TrainState reuse) = 0;
    // The wide-area bytes this rank sent so far, every membership epoch's together.
    virtual std::uint64_t wire_bytes() = 0;
    // What a state transfer moves: this rank's replica and what every site shares.
    virtual SiteReplica& replica() = 0;
    virtual SharedState shared() = 0;
    // A state transfer at `step` ended; `joined` when this rank's site received it, having
    // moved `bytes` in `seconds`.
    virtual void transferred(std::int64_t step, bool joined, std::uint64_t bytes,
                             double seconds) = 0;
    // Before the membership moves to a new epoch, every user of the groups lets go of them;
    // after it, the run binds the context's new groups.
    virtual void release_groups() = 0;
    virtual void bind_groups() = 0;

   protected:
    ~Run() = default;
  };

  // Whether a failure can be mended by a new membership epoch: a broken transport, a wait past
  // its deadline or a failed peer. A device, data or configuration error cannot.
  static bool recoverable(const std::exception& e);
  static constexpr int kMaxFailuresOfOneStep = 3;

  // `rank` must have its recover callback set; `rank` and `run` must outlive this object.
  // `resuming`: the run resumes from its own checkpoint (train --resume).
  FaultTolerance(RankContext& rank, Run& run, bool resuming);

  // This rank's site restarts into a running job at rank.join_step (not resuming): its state
  // arrives from a peer before its first step.
  bool rejoining() const { return rejoining_; }

  // The run starts at `step`: survivors that have not reached a cross-site step yet can roll
  // back there.
  void started(std::int64_t step);

  // Before step t: keeps a rollback point when the step talks across sites, brings the sites
  // that join in this epoch up to date (this rank gives, receives or passes scratch), and
  // throws PeerFailure when the coordinator closed the epoch (the loop then recovers).
  void before_step(std::int64_t t, bool talks_across_sites);

  struct Rollback {
    std::int64_t step = 0;
    // The state to restore; nullopt when this rank's site joins in the new epoch (a restarted
    // site that offered no usable point): a peer sends it before the next step.
    std::optional<TrainState> state;
    std::uint64_t bytes_resent = 0;  // WAN bytes of completed collectives the replay repeats
  };
  // Step `failed_at` failed with `what`: the groups are released, the rollback points offered
  // to the coordinator, its next epoch awaited and bound, and where to continue returned.
  // Throws PeerFailure after kMaxFailuresOfOneStep failures of one step in fresh epochs (a
  // fault that travels with the data, not a site failure), or when the coordinator picks a
  // step this rank holds no point of.
  Rollback recover(std::int64_t failed_at, const std::string& what);

  // The job's start (attempt `attempt`) failed with `e`: true once the survivors moved to the
  // next epoch and the start should be agreed again; false when a new epoch cannot mend it.
  bool retry_start(const Error& e, int attempt);

 private:
  struct Point {
    TrainState state;
    std::uint64_t wire = 0;  // WAN bytes sent before this step
  };
  // Survivors are at most one cross-site exchange apart (passing one needs every rank in it),
  // so two points suffice; an older point at the same or a later step is replaced. The point
  // keep_point would drop is captured into (capture_state's `reuse`).
  void keep_point(std::int64_t step);
  void transfer(std::int64_t step);

  RankContext& rank_;
  Run& run_;
  bool rejoining_ = false;
  bool transfer_due_ = false;  // sites join in this epoch: the state moves before the next step
  std::deque<Point> points_;
  std::int64_t last_failed_at_ = -1;
  int failures_of_step_ = 0;
};

// Brings the sites that join in this epoch (rank.joining_sites) up to date at `step`. For each
// joining site, its nearest ring predecessor that is not joining is the donor (the ring is the
// planner's choice from measured bandwidth, so that link is a measured one): each segment's
// ring (sync::ShardMap; rank r's ring r for sites alike) carries that segment of x, u and v
// behind a header (step, optimizer step, CRC32C of each segment), and the receiver checks
// every segment before using it; then the same segment of the outer optimizer's state and of
// the compressed states' references (the same on every site). The joining site's ranks then
// all-gather their ranges. Everyone else passes scratch buffers. The joining site's error
// feedback starts at zero (what its first life dropped is not the others' to resend).
// Returns the bytes of state moved.
std::uint64_t transfer_state(RankContext& rank, std::int64_t step, SiteReplica& replica,
                             SharedState shared);

}  // namespace desloc::train
