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
  const std::lock_guard lock(mu_);
  report.sync_buckets = buckets_;
  report.sync_seconds = seconds_;
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    std::uint64_t bytes = 0;
    double seconds = 0.0;
    for (const LaneSample& s : lanes_[i].recent) {
      bytes += s.bytes;
      seconds += s.seconds;
    }
    report.lanes[i].bytes_sent = lanes_[i].bytes;
    report.lanes[i].recent_bytes_per_s =
        seconds > 0.0 ? static_cast<float>(double(bytes) / seconds) : 0.0f;
  }
}

}  // namespace desloc::sync
