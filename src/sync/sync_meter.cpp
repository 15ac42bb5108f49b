#include "desloc/sync/sync_meter.hpp"

#include <algorithm>

#include "desloc/core/error.hpp"

namespace desloc::sync {

void SyncMeter::record(double seconds, std::span<const LaneSample> lanes) {
  if (lanes.size() > lanes_.size())
    throw Error("sync meter: " + std::to_string(lanes.size()) + " lanes, at most 2");
  const auto& bounds = transport::kSyncBucketBounds;
  const auto bucket = static_cast<std::size_t>(
      std::lower_bound(bounds.begin(), bounds.end(), seconds) - bounds.begin());
  const std::lock_guard lock(mu_);
  ++buckets_[bucket];
  seconds_ += seconds;
  for (std::size_t i = 0; i < lanes.size(); ++i) {
    Lane& lane = lanes_[i];
    lane.bytes += lanes[i].bytes;
    lane.recent.push_back(lanes[i]);
    if (lane.recent.size() > kRecentSyncs) lane.recent.pop_front();
  }
}

void SyncMeter::fill(transport::RankReport& report) const {
  for (std::size_t i = 0; i < lanes_.size(); ++i) report.lanes[i] = lane(i);
  const std::lock_guard lock(mu_);
  report.sync_buckets = buckets_;
  report.sync_seconds = seconds_;
}

transport::LaneReport SyncMeter::lane(std::size_t i) const {
  const std::lock_guard lock(mu_);
  const Lane& l = lanes_.at(i);
  std::uint64_t bytes = 0;
  double seconds = 0.0;
  for (const LaneSample& s : l.recent) {
    bytes += s.bytes;
    seconds += s.seconds;
  }
  return {l.bytes, seconds > 0.0 ? static_cast<float>(double(bytes) / seconds) : 0.0f};
}

}  // namespace desloc::sync
