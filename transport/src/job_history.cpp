#include "desloc/transport/job_history.hpp"

#include <algorithm>

namespace desloc::transport {

void JobHistory::membership(const Membership& m, double at_s) {
  if (!epochs_.empty() && epochs_.back().epoch >= m.epoch) return;
  rejoins_ += m.joining.size();
  EpochEvent e{m.epoch, at_s, {}, m.joining, m.note};
  for (const std::uint32_t i : m.ring_order) e.ring.push_back(m.sites.at(i));
  if (epochs_.size() == kMaxEpochs) epochs_.erase(epochs_.begin() + 1);
  epochs_.push_back(std::move(e));
}

std::pair<std::string, std::string> JobHistory::neighbours(const std::string& site) const {
  if (epochs_.empty()) return {};
  const std::vector<std::string>& ring = epochs_.back().ring;
  const auto at = std::find(ring.begin(), ring.end(), site);
  const std::size_t n = ring.size();
  if (at == ring.end() || n < 2) return {};
  const auto i = static_cast<std::size_t>(at - ring.begin());
  return {ring[(i + 1) % n], n >= 3 ? ring[(i + n - 1) % n] : std::string()};
}

std::string JobHistory::region_next(const std::string& site) const {
  if (epochs_.empty()) return {};
  const std::vector<std::string>& live = epochs_.back().ring;
  for (const auto& region : regions_) {
    const auto at = std::find(region.begin(), region.end(), site);
    if (at == region.end()) continue;
    const std::size_t n = region.size(), i = static_cast<std::size_t>(at - region.begin());
    for (std::size_t k = 1; k < n; ++k) {
      const std::string& next = region[(i + k) % n];
      if (std::find(live.begin(), live.end(), next) != live.end()) return next;
    }
    return {};
  }
  return {};
}

void JobHistory::heartbeat(const std::string& site, std::uint32_t rank, std::uint64_t step,
                           const RankReport& report) {
  if (rank == 0 && step > 0) {
    std::vector<LossPoint>& curve = losses_[site];
    Curve& c = curves_[site];
    if (curve.empty() || step >= curve.back().step + c.stride) {
      curve.push_back({step, report.loss});
      if (curve.size() > kMaxPoints) {  // keep every other point, the newest included
        std::vector<LossPoint> kept;
        for (std::size_t i = curve.size() % 2 == 0 ? 1 : 0; i < curve.size(); i += 2)
          kept.push_back(curve[i]);
        curve = std::move(kept);
        c.stride *= 2;
      }
    }
  }
  std::array<std::uint64_t, 3>& seen = lane_seen_[{site, rank}];
  const auto [next, previous] = neighbours(site);
  const std::string region = region_next(site);
  for (std::size_t lane = 0; lane < 3; ++lane) {  // the two rings, then the region's
    const std::uint64_t now =
        lane < 2 ? report.lanes[lane].bytes_sent : report.region_lane.bytes_sent;
    // A counter that went back belongs to a restarted rank: count it from zero.
    const std::uint64_t delta = now >= seen[lane] ? now - seen[lane] : now;
    seen[lane] = now;
    const std::string& to = lane == 0 ? next : lane == 1 ? previous : region;
    if (delta > 0 && !to.empty()) link_bytes_[{site, to}] += delta;
  }
}

}  // namespace desloc::transport
