// The planner's parts that its translation units share (not installed): the streaming search,
// the simulated overhead of a schedule, and the sites' steal.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "desloc/core/sync_schedule.hpp"
#include "desloc/topology/planner.hpp"

namespace desloc::topology::detail {

// A streaming plan: delayed averages of P fragments (u's and v's counts may differ).
struct Streaming {
  std::int64_t kx = 0, tau = 0, phase_u = 0, phase_v = 0;
  int fragments = 1, fragments_u = 0, fragments_v = 0;  // 0: as x
  double batch_s = 0;     // the largest batch of fragments due at one step, on the wire
  double fragment_s = 0;  // one fragment of x's all-reduce
  double overhead = 0;    // simulated
  // The plan with the least Kx, when the weighted choice (PlanRequest::delay_weight) differs.
  std::int64_t least_kx = 0, least_kx_tau = 0;
};

// u's and v's phases a third and two thirds into an x window of kx >= 3 steps; with regions
// at most a step short of the regions' Ku and Kv (the config requires a phase within its
// periods at both levels).
std::pair<std::int64_t, std::int64_t> third_phases(std::int64_t kx, std::int64_t region_ku = 0,
                                                   std::int64_t region_kv = 0);

// The overhead the plan may reach in simulation: the target, plus the regions' own share when
// the plan is hierarchical.
double overhead_budget(const PlanRequest& req);

// The Kx the search may try: a multiple of the regions' period when there are regions.
std::int64_t kx_multiple(const PlanRequest& req);

// The site whose overlapped averages take the most compute per byte sent (the first on a tie);
// `t` has sites (the topology's loader requires one).
const SiteProfile& most_steal(const Topology& t);

// The least Kx at which the compute overlapped averages take (simulate()'s steal: each site's
// steal per byte sent plus the codec's work, on the 1 + 1/a + 1/b averages of an x window)
// can fit the target at all: a site whose step is s and the slowest's S has
// (K s + window) / (K S) - 1 <= target only for K >= window / ((1 + target) S - s). Waiting
// for the wire only adds to it. 0 where nothing is taken.
double steal_floor_kx(const Topology& t, double step_s, double bytes, double codec_s,
                      double averages_per_window, double target);

// The overhead simulate() predicts for averages on `sched`, delayed by tau (0: blocking): total
// time over compute time, less one, over 2 Kv + Kx steps; with the regions' averages when the
// request has regions.
double simulated_overhead(const Topology& t, const PlanRequest& req, const Schedule& ring,
                          const SyncSchedule& sched, std::int64_t tau);

// The streaming plan with Kx in [lowest, highest] (multiples of kx_multiple(req)) of the least
// Kx + delay_weight * tau, the least Kx on a tie (planner.hpp's header comment), or nullopt.
// At each Kx the least tau that fits. Ku = a Kx, Kv = b Kx.
std::optional<Streaming> plan_streaming(const Topology& t, const PlanRequest& req,
                                        const Schedule& ring, double step_s, std::int64_t a,
                                        std::int64_t b, std::int64_t lowest, std::int64_t highest);

}  // namespace desloc::topology::detail
