// What a networked rank's wide-area averages cost, for its heartbeats (transport::RankReport):
// a histogram of their durations, and per lane the bytes it sent and the rate it achieved over
// its last few syncs. The status endpoint turns them into per-link rates and histograms.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>

#include "desloc/transport/wire.hpp"

namespace desloc::sync {

class SyncMeter {
 public:
  // The recent rate is over this many syncs of a lane.
  static constexpr std::size_t kRecentSyncs = 8;
  struct LaneSample {
    std::uint64_t bytes = 0;  // sent on the lane by this average
    double seconds = 0.0;     // the lane's all-reduce, start to finish
  };
  // One average of this rank's shard that took `seconds` (guard and all lanes), with what each
  // lane did (lane 0: the ring; lane 1: the reversed ring). Safe from any thread: averages run
  // on the communication thread under overlap.
  void record(double seconds, std::span<const LaneSample> lanes);
  // Writes the histogram and the lanes into `report`, leaving its other fields.
  void fill(transport::RankReport& report) const;
  // Lane `i`'s bytes and recent rate (a region's averages: their meter's lane 0).
  transport::LaneReport lane(std::size_t i) const;

 private:
  struct Lane {
    std::uint64_t bytes = 0;
    std::deque<LaneSample> recent;
  };
  mutable std::mutex mu_;
  std::array<std::uint64_t, transport::kSyncBuckets> buckets_{};
  double seconds_ = 0.0;
  std::array<Lane, 2> lanes_;
};

}  // namespace desloc::sync
