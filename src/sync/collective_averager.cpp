// The networked averager: WAN all-reduce of this rank's shard, scale, intra-site all-gather.
#include "desloc/sync/collective_averager.hpp"

#include <algorithm>
#include <exception>
#include <string>
#include <thread>

#include "desloc/core/error.hpp"
#include "desloc/transport/ring_order.hpp"

namespace desloc::sync {

CollectiveAverager::CollectiveAverager(transport::Collective& wan, transport::Collective* site,
                                       transport::Collective* wan_reverse)
    : wan_(wan),
      site_(site != nullptr && site->size() > 1 ? site : nullptr),
      wan_reverse_(wan_reverse != nullptr && wan_reverse->size() >= 3 ? wan_reverse : nullptr) {}

void CollectiveAverager::average(optim::StateKind kind, std::span<const std::span<float>> local) {
  using transport::CollectiveOp;
  if (local.size() != 1)
    throw Error("collective averager: WAN rank " + std::to_string(wan_.rank()) + " got " +
                std::to_string(local.size()) + " replicas of '" + optim::to_string(kind) +
                "'; a networked rank holds exactly one");
  const std::span<float> data = local[0];
  const int sites = wan_.size();
  if (sites == 1) return;
  const int ranks = site_ != nullptr ? site_->size() : 1;
  const int r = site_ != nullptr ? site_->rank() : 0;
  const transport::Range mine = transport::block(data.size(), ranks, r);
  const std::span<float> shard = data.subspan(mine.offset, mine.count);

  const auto k = static_cast<std::size_t>(kind);
  const std::uint64_t wan_before = wan_.bytes()[CollectiveOp::kAllReduce].sent;
  const std::uint64_t reverse_before =
      wan_reverse_ != nullptr ? wan_reverse_->bytes()[CollectiveOp::kAllReduce].sent : 0;
  const transport::OpLabel label{step_, static_cast<std::uint8_t>(kind),
                                 static_cast<std::uint32_t>(r)};
  wan_.set_label(label);
  const int kept = guard(kind, data.size(), shard);
  if (wan_reverse_ == nullptr) {
    wan_.all_reduce_sum(shard);
  } else {
    // Two lanes at once, one thread each (a collective serves one thread at a time).
    const transport::Range a = transport::block(shard.size(), 2, 0);
    const transport::Range b = transport::block(shard.size(), 2, 1);
    wan_reverse_->set_label(label);
    std::exception_ptr lane_error;
    std::thread lane([&] {
      try {
        wan_reverse_->all_reduce_sum(shard.subspan(b.offset, b.count));
      } catch (...) {
        lane_error = std::current_exception();
      }
    });
    try {
      wan_.all_reduce_sum(shard.subspan(a.offset, a.count));
    } catch (...) {
      lane.join();
      throw;
    }
    lane.join();
    if (lane_error) std::rethrow_exception(lane_error);
    traffic_.wire[static_cast<std::size_t>(kind)] +=
        wan_reverse_->bytes()[CollectiveOp::kAllReduce].sent - reverse_before;
  }
  const auto size = static_cast<float>(kept);
  for (float& x : shard) x /= size;  // a division, not a reciprocal: correctly rounded
  traffic_.wire[k] += wan_.bytes()[CollectiveOp::kAllReduce].sent - wan_before;

  if (site_ != nullptr) {
    // Equal blocks for the all-gather: the last shards may be shorter, so pad into place.
    const std::size_t blk = transport::block(data.size(), ranks, 0).count;
    gathered_.assign(blk * static_cast<std::size_t>(ranks), 0.0f);
    std::copy(shard.begin(), shard.end(), gathered_.begin() + static_cast<std::ptrdiff_t>(r * blk));
    const std::uint64_t site_before = site_->bytes()[CollectiveOp::kAllGather].sent;
    site_->all_gather(std::span<const float>(gathered_).subspan(r * blk, blk), gathered_);
    traffic_.site_wire[k] += site_->bytes()[CollectiveOp::kAllGather].sent - site_before;
    for (int q = 0; q < ranks; ++q) {
      const transport::Range b = transport::block(data.size(), ranks, q);
      std::copy_n(gathered_.begin() + static_cast<std::ptrdiff_t>(q * blk), b.count,
                  data.begin() + static_cast<std::ptrdiff_t>(b.offset));
    }
  }
  traffic_.payload[k] += data.size() * sizeof(float);
}

int CollectiveAverager::guard(optim::StateKind kind, std::size_t elements, std::span<float> shard) {
  const int sites = wan_.size();
  if (!guard_.enabled) return sites;
  // The site's figure is the sum of its ranks' shard figures in rank order: every rank of the
  // site holds the same bits, even when one rank's shard is the bad one. The WAN all-gather
  // then gives every rank of the job the same table, so all take the same decision.
  PayloadHealth mine = measure_payload(shard);
  if (site_ != nullptr) {
    health_.assign(static_cast<std::size_t>(site_->size()), PayloadHealth{});
    site_->all_gather(std::as_bytes(std::span<const PayloadHealth>(&mine, 1)),
                      std::as_writable_bytes(std::span<PayloadHealth>(health_)));
    mine = PayloadHealth{};
    for (const PayloadHealth& h : health_) mine += h;
  }
  health_.assign(static_cast<std::size_t>(sites), PayloadHealth{});
  wan_.all_gather(std::as_bytes(std::span<const PayloadHealth>(&mine, 1)),
                  std::as_writable_bytes(std::span<PayloadHealth>(health_)));
  const std::vector<Rejection> rejected = judge_payloads(health_, elements, guard_, step_, kind);
  rejections_.insert(rejections_.end(), rejected.begin(), rejected.end());
  // One warning per site (its rank 0), not one per rank.
  const bool log = site_ == nullptr || site_->rank() == 0;
  const int kept = enforce_rejections(rejected, sites, guard_, log);
  for (const Rejection& r : rejected)
    if (r.site == wan_.rank()) std::fill(shard.begin(), shard.end(), 0.0f);
  return kept;
}

const Traffic& CollectiveAverager::traffic(int w) const {
  if (w != 0)
    throw Error("collective averager: WAN rank " + std::to_string(wan_.rank()) +
                " only knows its own traffic (worker 0 of its local replicas), not worker " +
                std::to_string(w));
  return traffic_;
}

}  // namespace desloc::sync
