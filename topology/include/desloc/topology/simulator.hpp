// The simulator: a discrete-event model of a whole job on a topology. Each site advances its
// own clock by its compute step; a due average is a barrier (it starts when the last site
// arrives) followed by the all-reduce time of the schedule (planner.hpp's cost model), one
// all-reduce per averaged state. With mode Overlap::kStep (sync.overlap = "step") the averages of a
// step start when the last site begins it and run under its compute: each site ends the step
// at the later of its compute and the averages (the gradient's average, DDP, still blocks).
// With a delayed mode (sync.overlap = "delayed") a site's step with averages first waits for the
// batch still on the wire; the new batch (its control exchange, then each state's all-reduce)
// leaves when the last site has started it and occupies the link while the sites compute, and a
// state's fold tau steps later waits, at each site, for that state's average to be done (the
// last step drains every batch). No step is a barrier between the sites. Each mode is one step
// function of the simulation (simulator.cpp).
// With overlap (a what-if beyond what desloc does: averages that may run under any number of
// following steps) a sync runs in the background and only delays the sites if the previous one
// has not finished.
// Averages that overlap compute also take CPU from it: each site's steal per byte (its
// SiteProfile) times the bytes it sends for the average, plus the codec's seconds, lengthen
// its compute, spread over the delay's steps (delayed) or in the step itself (the others).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "desloc/core/sync_schedule.hpp"
#include "desloc/topology/topology.hpp"

namespace desloc::topology {

// The methods `desloc simulate` compares by default. simulate() models every SyncMethod: the
// favg methods move x only.
inline constexpr std::array<SyncMethod, 4> kSimulatedMethods{
    SyncMethod::kNone, SyncMethod::kDdp, SyncMethod::kLocalAdam, SyncMethod::kDesloc};

struct SimJob {
  // Which states are averaged when: the trainer's own rule (desloc/core/sync_schedule.hpp).
  SyncSchedule schedule{SyncMethod::kDesloc, 1, 3, 6, 0, 0, 0};
  std::int64_t steps = 1000;
  double state_bytes = 0;         // one state buffer (4 x parameters)
  std::vector<std::string> ring;  // WAN ring order; empty = the topology's site order
  // Compressed averages, by state x, u, v (PlanRequest's): wire bytes per fp32 byte, and the
  // codec's seconds per average of the whole state, added to that average's time.
  std::array<double, 3> wire_ratio{1.0, 1.0, 1.0};
  std::array<double, 3> codec_s{};
  int lanes = 1;            // 2 = also the reversed ring (3+ sites)
  double lane_share = 0.5;  // with 2 lanes: the part on the ring (transport.lane_share)
  bool overlap = false;     // the unbounded what-if (beyond any sync.overlap)
  // sync.overlap as the job runs it, and with delayed averages the tau of x, u and v.
  Overlap mode = Overlap::kNone;
  std::array<std::int64_t, 3> delay{};
  bool delayed() const { return delays(mode); }
  // Step-to-step compute noise: at site s each step takes step_s * exp(N(-j^2 / 2, j)), whose
  // mean is step_s, with j = jitter, or the site's measured step_jitter when jitter is unset;
  // drawn from a fixed seed, so a slow step makes the others wait at the next sync.
  std::optional<double> jitter;
  std::uint64_t seed = 1;
  // Hierarchical DES-LOC (job.regions): each region's sites in its ring order, and the
  // regions' schedule. A state due there but not in `schedule` is averaged by every region
  // over its own ring, at once: only a region's sites wait for each other, and in fp32 (the
  // codecs of wire_ratio and codec_s compress the job-wide averages only). With delayed
  // averages the regions average every state they are due at the step's start, blocking, and
  // the job-wide batch (fragments allowed) streams as without regions. Not with the unbounded
  // `overlap` what-if (ConfigError).
  std::vector<std::vector<std::string>> regions;
  SyncSchedule region_schedule{};
  // Period switches (sync.switches, or a re-planned run's): from the step after `first` on, the
  // schedule `second`, in order of `first`. Whole-state averages only.
  std::vector<std::pair<std::int64_t, SyncSchedule>> switches;
  // The schedule in force at `step`.
  const SyncSchedule& schedule_at(std::int64_t step) const {
    for (auto it = switches.rbegin(); it != switches.rend(); ++it)
      if (it->first < step) return it->second;
    return schedule;
  }
};

struct SimResult {
  double total_s = 0;    // time to the last step, all sites done
  double step_s = 0;     // total / steps
  double compute_s = 0;  // the slowest site's compute alone
  double comm_s = 0;     // time spent in all-reduces (on the critical path without overlap)
  double wait_s = 0;     // mean per site of time spent waiting for slower sites at syncs
  std::vector<double> wait_by_site;  // each site's, by the topology's site order
  double steal_s = 0;                // mean per site of compute time lost to overlapped averages
  std::int64_t syncs = 0;            // all-reduces performed
  double bytes_per_site = 0;         // wide-area bytes each site sends (ring: 2(n-1)/n per state)
};

SimResult simulate(const Topology& t, const SimJob& job);

}  // namespace desloc::topology
