// Elastic recovery of one networked rank (job.on_site_failure = "continue"): the rollback
// points kept before steps that talk across sites, the rollback into the coordinator's next
// membership epoch when a collective breaks, and the state transfer to a site that joins.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <optional>
#include <string>

#include "desloc/sync/outer_optimizer.hpp"
#include "desloc/train/trainer.hpp"
#include "train/replica.hpp"

namespace desloc::cluster {

class Recovery {
 public:
  // Whether a failure can be mended by a new membership epoch: a broken transport, a wait past
  // its deadline or a failed peer. A device, data or configuration error cannot.
  static bool recoverable(const std::exception& e);

  // `rank` must have its recover callback set; it must outlive this object.
  explicit Recovery(train::RankContext& rank) : rank_(rank) {}

  // Keeps `state` (taken before the step after state.step) as a rollback point. Survivors
  // are at most one cross-site exchange apart (passing one needs every rank in it), so two
  // suffice; an older point at the same or a later step is replaced.
  void keep(train::TrainState state, std::uint64_t wire_bytes);
  // The point keep() would drop to make room for one taken at `step`, handed out beforehand
  // so that the new one is captured into its buffers (train::capture_state's `reuse`); an
  // empty state when keep() would drop none.
  train::TrainState spare(std::int64_t step);

  struct Rollback {
    std::int64_t step = 0;
    // The state to restore; nullopt when this rank's site joins in the new epoch (a restarted
    // site that offered no usable point): a peer sends it (transfer_state).
    std::optional<train::TrainState> state;
    std::uint64_t bytes_resent = 0;  // WAN bytes of completed collectives the replay repeats
  };
  // Step `failed_at` failed with `what`: offers the rollback points to the coordinator, waits
  // for its next epoch (the context's groups change) and returns where to continue. Throws
  // PeerFailure after kMaxFailuresOfOneStep failures of one step in fresh epochs (a fault
  // that travels with the data, not a site failure), or when the coordinator picks a step
  // this rank holds no point of.
  Rollback recover(std::int64_t failed_at, const std::string& what, std::uint64_t wire_now);

  static constexpr int kMaxFailuresOfOneStep = 3;

 private:
  struct Point {
    train::TrainState state;
    std::uint64_t wire = 0;  // WAN bytes sent before this step
  };
  train::RankContext& rank_;
  std::deque<Point> points_;
  std::int64_t last_failed_at_ = -1;
  int failures_of_step_ = 0;
};

// Brings the sites that join in this epoch (rank.joining_sites) up to date at `step`. For each
// joining site, its nearest ring predecessor that is not joining is the donor (the ring is the
// planner's choice from measured bandwidth, so that link is a measured one): WAN ring r carries
// block r of x, u and v behind a header (step, optimizer step, CRC32C of each block), and the
// receiver checks every block before using it. The joining site's ranks then all-gather their
// blocks. Everyone else passes scratch buffers. The outer optimizer's state and the
// compressed states' references, the same on every site, travel whole; the joining site's
// error feedback starts at zero (what its first life dropped is not the others' to resend).
// Returns the bytes of state moved.
std::uint64_t transfer_state(train::RankContext& rank, std::int64_t step,
                             train::SiteReplica& replica, train::SharedState shared);

}  // namespace desloc::cluster
