// A rank's membership in a running job: its control-plane client, the membership it received
// and its UCX groups. join_job does the rendezvous; training and profiling both start here.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "desloc/cluster/cluster.hpp"
#include "desloc/sync/collective_averager.hpp"
#include "desloc/sync/shard_map.hpp"
#include "desloc/transport/collective.hpp"
#include "desloc/transport/control_plane.hpp"

namespace desloc::cluster {

struct Session {
  std::string name;                // "site/rank"
  std::vector<std::string> sites;  // the current epoch's sites in ring order
  int S = 1, R = 1;                // R: this rank's site's ranks
  int site_index = 0, rank = 0;    // site_index: position in `sites`, the current ring
  int home_site = 0;               // index in job.sites: the data partition, fixed for the job
  std::unique_ptr<transport::RankClient> client;
  transport::Membership membership;
  // The job's wide-area shard map (JobConfig::wan_map): which segments this rank owns.
  std::shared_ptr<const sync::ShardMap> map;
  std::unique_ptr<transport::Collective> site_group;  // null when R = 1
  // One segment's ring over some sites, each joined by the rank that owns the segment there,
  // and its lane 2 (the reversed ring, 3 sites or more at transport.lanes = 2), or null.
  struct Rings {
    int segment = 0;
    std::unique_ptr<transport::Collective> ring, reverse;
  };
  std::vector<Rings> wan;  // every live site, one per segment this rank owns, in segment order
  // Hierarchical DES-LOC (job.regions): the same over the live sites of this site's region, in
  // the region's ring order; empty without regions or when the region has one live site.
  std::vector<Rings> region;
  std::vector<int> region_sites;  // their positions in `sites` (ring positions), in that order
  // The first segment's ring (every site, one rank each): the sites' size and this site's
  // position are the same in each.
  transport::Collective* wan_group() const {
    return wan.empty() ? nullptr : wan.front().ring.get();
  }
  // The rings as the averagers hold them.
  static std::vector<sync::WanRing> views(const std::vector<Rings>& rings);
  // Profiling only, rank 0 of each site: pairs[k] is a 2-rank group with site k's rank 0
  // (the lower site index is rank 0); null for this site and for other ranks.
  std::vector<std::unique_ptr<transport::Collective>> pairs;

  // Barriers on both groups, so nobody tears down its UCX worker while a peer still finishes.
  void leave();
  // After a broken collective: drops the groups, reports `snapshots` (the steps this rank can
  // roll back to) to the coordinator, waits for the next epoch and rebuilds the groups over
  // its sites. Returns the step to roll back to. PeerFailure when this site was dropped or
  // the job ended.
  std::int64_t recover(const train::JobConfig& cfg, std::span<const std::int64_t> snapshots,
                       const std::string& reason);
};

// Opens the ports, registers with opts.coordinator, waits for the membership and connects the
// groups (with pair_groups, profiling's: one 2-rank group per other site and segment 0's ring for
// rank 0, no wide-area ring for the other ranks).
Session join_job(const train::JobConfig& cfg, const WorkerOptions& opts, bool pair_groups);

}  // namespace desloc::cluster
