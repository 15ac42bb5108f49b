// The simulator: a discrete-event model of a whole job on a topology. Each site advances its
// own clock by its compute step; a due average is a barrier (it starts when the last site
// arrives) followed by the all-reduce time of the schedule (planner.hpp's cost model), one
// all-reduce per averaged state. With overlap (a what-if: desloc's syncs block) a sync runs
// in the background and only delays the sites if the previous one has not finished.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "desloc/topology/topology.hpp"

namespace desloc::topology {

// The methods simulate() models.
inline constexpr std::array<std::string_view, 4> kSimulatedMethods{"none", "ddp", "local_adam",
                                                                   "desloc"};

struct SimJob {
  std::string method = "desloc";  // one of kSimulatedMethods
  std::int64_t steps = 1000;
  std::int64_t kx = 1, ku = 3, kv = 6;
  std::int64_t phase_x = 0, phase_u = 0, phase_v = 0;
  double state_bytes = 0;         // one state buffer (4 x parameters)
  std::vector<std::string> ring;  // WAN ring order; empty = the topology's site order
  int lanes = 1;                  // 2 = also the reversed ring (3+ sites)
  bool overlap = false;
  // Step-to-step compute noise: each step takes step_s * exp(N(0, jitter)) at each site,
  // drawn from a fixed seed, so a slow step makes the others wait at the next sync.
  double jitter = 0.0;
  std::uint64_t seed = 1;
};

struct SimResult {
  double total_s = 0;         // time to the last step, all sites done
  double step_s = 0;          // total / steps
  double compute_s = 0;       // the slowest site's compute alone
  double comm_s = 0;          // time spent in all-reduces (on the critical path without overlap)
  double wait_s = 0;          // mean per site of time spent waiting for slower sites at syncs
  std::int64_t syncs = 0;     // all-reduces performed
  double bytes_per_site = 0;  // wide-area bytes each site sends (ring: 2(n-1)/n per state)
};

SimResult simulate(const Topology& t, const SimJob& job);

}  // namespace desloc::topology
