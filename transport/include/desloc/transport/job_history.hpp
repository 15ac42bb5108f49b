// What the coordinator remembers of a job for its status endpoint: every membership epoch (the
// ring, who joined, why it began), each site's loss curve, and the wide-area bytes each link
// carried. Bounded whatever the job's length: a loss curve keeps at most kMaxPoints points,
// thinning itself as it grows.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "desloc/transport/wire.hpp"

namespace desloc::transport {

struct EpochEvent {
  std::uint64_t epoch = 0;
  double at_s = 0.0;              // seconds since the coordinator started
  std::vector<std::string> ring;  // the live sites in ring order
  std::vector<std::string> joining;
  std::string note;  // why it began ("" for the first)
};

struct LossPoint {
  std::uint64_t step = 0;
  float loss = 0.0f;
};

// A directed wide-area link, named by its sites.
using LinkKey = std::pair<std::string, std::string>;

class JobHistory {
 public:
  static constexpr std::size_t kMaxPoints = 512;  // per site
  static constexpr std::size_t kMaxEpochs = 256;  // the first and the newest are kept

  // Hierarchical DES-LOC (job.regions): each region's sites in its ring order. A rank's region
  // lane is charged to the link to the next live site of its region.
  void set_regions(std::vector<std::vector<std::string>> regions) { regions_ = std::move(regions); }
  // Records `m` when its epoch is new.
  void membership(const Membership& m, double at_s);
  // A heartbeat of rank `rank` of `site` in the current membership: its site's loss (rank 0
  // only) and the bytes its lanes sent since its last heartbeat, charged to the links to its
  // ring neighbours now (lane 0: the next site; lane 1: the previous one).
  void heartbeat(const std::string& site, std::uint32_t rank, std::uint64_t step,
                 const RankReport& report);

  // The kept epochs: the first and the newest kMaxEpochs - 1.
  const std::vector<EpochEvent>& epochs() const { return epochs_; }
  // Sites that rejoined, over every epoch (kept or not).
  std::uint64_t rejoins() const { return rejoins_; }
  const std::map<std::string, std::vector<LossPoint>>& losses() const { return losses_; }
  const std::map<LinkKey, std::uint64_t>& link_bytes() const { return link_bytes_; }
  // The sites a site's lanes send to under the current membership (lane 0, lane 1), "" for
  // none.
  std::pair<std::string, std::string> neighbours(const std::string& site) const;
  // The site a site's region lane sends to: the next site of its region that is live in the
  // current membership; "" without regions or when it is alone in its region.
  std::string region_next(const std::string& site) const;

 private:
  struct Curve {
    std::uint64_t stride = 1;  // steps between kept points, doubled when the curve is full
  };
  std::vector<EpochEvent> epochs_;
  std::uint64_t rejoins_ = 0;
  std::map<std::string, std::vector<LossPoint>> losses_;
  std::map<std::string, Curve> curves_;
  std::map<LinkKey, std::uint64_t> link_bytes_;
  std::map<std::pair<std::string, std::uint32_t>, std::array<std::uint64_t, 3>> lane_seen_;
  std::vector<std::vector<std::string>> regions_;
};

}  // namespace desloc::transport
