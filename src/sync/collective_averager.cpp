// The networked averager: all-reduce, then scale.
#include "desloc/sync/collective_averager.hpp"

#include <string>

#include "desloc/core/error.hpp"

namespace desloc::sync {

void CollectiveAverager::average(optim::StateKind kind, std::span<const std::span<float>> local) {
  if (local.size() != 1)
    throw Error("collective averager: rank " + std::to_string(group_.rank()) + " got " +
                std::to_string(local.size()) + " replicas of '" + optim::to_string(kind) +
                "'; a networked rank holds exactly one");
  const std::span<float> data = local[0];
  const int n = group_.size();
  if (n == 1) return;
  const std::uint64_t sent_before = group_.bytes()[transport::CollectiveOp::kAllReduce].sent;
  group_.all_reduce_sum(data);
  const auto size = static_cast<float>(n);
  for (float& x : data) x /= size;  // a division, not a reciprocal: correctly rounded
  const auto k = static_cast<std::size_t>(kind);
  traffic_.payload[k] += data.size() * sizeof(float);
  traffic_.wire[k] += group_.bytes()[transport::CollectiveOp::kAllReduce].sent - sent_before;
}

const Traffic& CollectiveAverager::traffic(int w) const {
  if (w != 0)
    throw Error("collective averager: rank " + std::to_string(group_.rank()) +
                " only knows its own traffic (worker 0 of its local replicas), not worker " +
                std::to_string(w));
  return traffic_;
}

}  // namespace desloc::sync
