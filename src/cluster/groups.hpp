// A rank's UCX groups: the ports it opens before it registers (their addresses travel in its
// Hello or Recover), and the groups it connects once the membership names its peers: the site
// group, one wide-area ring per segment it owns (sync::ShardMap; one, rank r of every site, for
// sites alike), each with its reversed ring (the second lane), the same over its region
// (job.regions), and profiling's pairs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cluster/session.hpp"
#include "desloc/train/config.hpp"
#include "desloc/transport/collective.hpp"
#include "desloc/transport/control_plane.hpp"
#include "desloc/transport/ucx_collective.hpp"

namespace desloc::cluster {

// This rank's freshly opened UCX ports, and their addresses packed for the control plane.
struct Ports {
  std::unique_ptr<transport::UcxPort> site;
  // Per segment this rank owns, in segment order: the ring, its reverse, the region's ring
  // and its reverse (null where not needed).
  struct Segment {
    int segment = 0;
    std::unique_ptr<transport::UcxPort> ring, reverse, region, region_reverse;
  };
  std::vector<Segment> segments;
  std::vector<std::unique_ptr<transport::UcxPort>> pairs;
  std::vector<std::uint8_t> packed;
};

// $DESLOC_INJECT_CRASH (fault_plan.hpp) as it concerns `site` in epoch `epoch` (epoch 1 only):
// whether it exits at membership, and the average whose ring it dies in (step < 0: none).
struct CrashInjection {
  bool at_membership = false;
  transport::OpLabel in_average;
};
CrashInjection crash_injection(const std::string& site, std::uint64_t epoch);

// The site's group runs over NCCL (the cuda backend, a site of several ranks).
bool uses_nccl(const train::JobConfig& cfg, int site_ranks);

// Opens the ports for any world the job can become (with `pair_groups`, profiling's: the pairs
// and segment 0's ring at rank 0 alone): a recovery opens them before it knows
// whether the next epoch shrinks (a site lost) or grows back (a site rejoins), so the wide-area
// ports follow every site of the job, not the current epoch's. With 2 survivors of 3 the
// current epoch runs one lane, but a rejoin brings back the third site and the reversed ring.
Ports open_ports(const train::JobConfig& cfg, const Session& ss, bool pair_groups);

// Builds the session's groups for membership m (whose ring is ss.sites), consuming the ports.
void connect_groups(const train::JobConfig& cfg, Session& ss, Ports ports,
                    const transport::Membership& m);

}  // namespace desloc::cluster
