// An Averager over a transport::Collective: each process (rank) holds one replica and the
// mean is an all-reduce over the group divided by its size. The networked counterpart of
// VirtualAverager; the trainer cannot tell them apart.
#pragma once

#include "desloc/sync/averager.hpp"
#include "desloc/transport/collective.hpp"

namespace desloc::sync {

class CollectiveAverager final : public Averager {
 public:
  // The group must outlive the averager. Every rank of the group must call average() for the
  // same states in the same order (the SyncPolicy guarantees that: it is a function of t).
  explicit CollectiveAverager(transport::Collective& group) : group_(group) {}
  // `local` holds exactly one replica. Its elements are summed over the group in the
  // collective's fixed order (ring order, in float), then scaled by 1/size; for integer-valued
  // inputs this equals VirtualAverager's mean exactly.
  void average(optim::StateKind kind, std::span<const std::span<float>> local) override;
  int workers() const override { return group_.size(); }
  // Wire bytes are what the collective actually sent, not a formula.
  const Traffic& traffic(int w) const override;

 private:
  transport::Collective& group_;
  Traffic traffic_;
};

}  // namespace desloc::sync
