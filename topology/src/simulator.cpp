// The discrete-event job model.
#include "desloc/topology/simulator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>

#include "desloc/core/error.hpp"
#include "desloc/topology/planner.hpp"

namespace desloc::topology {
namespace {
// One batch of delayed averages: the step whose update folds a state in, and when the batch
// left the wire.
struct Fold {
  std::int64_t step;
  double ready;
};
// Compute time an overlapped average takes from one site: `per_step` in each step up to `last`.
struct Steal {
  std::int64_t last;
  double per_step;
};
}  // namespace

SimResult simulate(const Topology& t, const SimJob& job) {
  const SyncSchedule& plan = job.schedule;
  if (job.steps < 1) throw ConfigError("simulate: steps must be >= 1");
  if (averages_params(plan.method) &&
      (plan.kx < 1 || (plan.method == SyncMethod::kDesloc && (plan.ku < 1 || plan.kv < 1))))
    throw ConfigError("simulate: the periods kx, ku and kv must be >= 1");
  const std::vector<std::string> ring = job.ring.empty() ? t.site_names() : job.ring;
  const std::size_t n = t.sites.size();
  // With fragments every average carries 1/P of its state (P by state: x, u, v).
  const std::array<int, 3> parts = {std::max(1, plan.fragments), std::max(1, plan.parts_u()),
                                    std::max(1, plan.parts_v())};
  std::array<double, 3> sync{}, per_state_bytes{};
  for (std::size_t k = 0; k < 3; ++k) {
    const double bytes = job.state_bytes * job.wire_ratio[k] / double(parts[k]);
    sync[k] = ring_seconds(t, ring, bytes, job.lanes, job.lane_share) +
              (n > 1 ? job.codec_s[k] / double(parts[k]) : 0.0);
    per_state_bytes[k] = site_bytes(bytes, n);
  }
  // Regions: each region's sites (indices into t.sites) and its seconds and bytes per site for
  // one average of state k over its own ring.
  if (!job.switches.empty() && plan.fragments > 1)
    throw ConfigError("simulate: period switches are modelled with whole-state averages only");
  const bool regional = !job.regions.empty() && averages_params(plan.method);
  if (regional && (job.overlap || job.delayed() || plan.fragments > 1))
    throw ConfigError(
        "simulate: regions are modelled with blocking or step-overlapped averages of whole "
        "states only");
  struct Region {
    std::vector<std::size_t> sites;
    std::array<double, 3> seconds{}, bytes{};
  };
  std::vector<Region> regions;
  for (const auto& names : regional ? job.regions : std::vector<std::vector<std::string>>{}) {
    Region g;
    for (const auto& name : names)  // t.site() throws naming a site the topology lacks
      g.sites.push_back(static_cast<std::size_t>(&t.site(name) - t.sites.data()));
    // A region's averages are fp32: the codecs compress the job-wide ones only.
    for (std::size_t k = 0; k < 3; ++k) {
      g.seconds[k] = ring_seconds(t, names, job.state_bytes, 1);
      g.bytes[k] = site_bytes(job.state_bytes, names.size());
    }
    regions.push_back(std::move(g));
  }
  // The gradient (DDP) travels whole.
  const double grad_sync = ring_seconds(t, ring, job.state_bytes, job.lanes, job.lane_share);
  const double grad_bytes = site_bytes(job.state_bytes, n);

  std::vector<double> clock(n, 0.0), compute(n, 0.0);
  std::mt19937_64 gen(job.seed);
  std::normal_distribution<double> noise(0.0, 1.0);
  std::vector<double> jitter(n);  // each site's sigma of ln(step time)
  for (std::size_t s = 0; s < n; ++s) jitter[s] = job.jitter.value_or(t.sites[s].step_jitter);
  SimResult r;
  double link_free = 0.0;  // overlap: when the previous all-reduce finishes
  double waited = 0.0;
  // The control exchange of delayed averages: an all-gather of a few bytes, half a ring
  // all-reduce's hops.
  const double exchange = job.delayed() ? exchange_seconds(t, ring) : 0.0;
  std::vector<Fold> folds;
  // Overlapped averages take CPU from the compute: steal per byte times the bytes a site sends,
  // plus the codec's work (blocking averages cost no compute: the sites wait for them anyway).
  const bool overlapped = job.delayed() || (job.mode == Overlap::kStep) || job.overlap;
  std::vector<std::vector<Steal>> steals(n);
  double stolen = 0;
  for (std::int64_t step = 1; step <= job.steps; ++step) {
    const SyncDecision due = job.schedule_at(step).at(step);
    const int states = n < 2 ? 0 : due.states();
    const std::array<bool, 3> kinds = {due.x, due.u, due.v};
    double cost = 0, bytes = 0;
    if (states > 0) {
      for (std::size_t k = 0; k < 3; ++k)
        if (kinds[k]) {
          cost += sync[k];
          bytes += per_state_bytes[k];
        }
      if (due.grad) {
        cost += grad_sync;
        bytes += grad_bytes;
      }
    }
    if (overlapped && states > 0 && !due.grad) {
      for (std::size_t k = 0; k < 3; ++k) {
        if (!kinds[k]) continue;
        const std::int64_t over = job.delayed() && !job.overlap ? job.delay[k] : 1;
        for (std::size_t s = 0; s < n; ++s) {
          const double cpu =
              t.sites[s].steal_s_per_byte * per_state_bytes[k] + job.codec_s[k] / double(parts[k]);
          if (cpu > 0) steals[s].push_back({step + over - 1, cpu / double(over)});
        }
      }
    }
    std::vector<double> dts(n);
    for (std::size_t s = 0; s < n; ++s) {
      const double j = jitter[s];
      dts[s] = t.sites[s].step_s * (j > 0 ? std::exp(j * noise(gen) - j * j / 2) : 1.0);
      compute[s] += dts[s];
      for (auto it = steals[s].begin(); it != steals[s].end();) {
        dts[s] += it->per_step;
        stolen += it->per_step;
        it = it->last <= step ? steals[s].erase(it) : it + 1;
      }
    }
    // States due only inside the regions: each region averages over its own ring after its
    // sites' compute (at the step's start under sync.overlap = "step", unless a job-wide
    // average is due too), and only its sites wait for each other. dts is added below.
    if (regional) {
      const SyncDecision rd = job.region_schedule.at(step);
      const bool only[3] = {rd.x && !due.x, rd.u && !due.u, rd.v && !due.v};
      const bool under_step = (job.mode == Overlap::kStep) && states == 0;
      double longest = 0;
      for (const Region& g : regions) {
        double cost_g = 0;
        for (std::size_t k = 0; k < 3; ++k)
          if (only[k] && g.sites.size() > 1) {
            cost_g += g.seconds[k];
            r.syncs += 1;
            if (std::find(g.sites.begin(), g.sites.end(), 0) != g.sites.end())
              r.bytes_per_site += g.bytes[k];
          }
        if (cost_g == 0) continue;
        longest = std::max(longest, cost_g);
        double start = 0;
        for (std::size_t s : g.sites)
          start = std::max(start, clock[s] + (under_step ? 0.0 : dts[s]));
        for (std::size_t s : g.sites) {
          if (under_step) {
            waited += start - clock[s] + std::max(0.0, cost_g - dts[s]);
            clock[s] = start + std::max(dts[s], cost_g) - dts[s];
          } else {
            waited += start - (clock[s] + dts[s]);
            clock[s] = start + cost_g - dts[s];
          }
        }
      }
      r.comm_s += longest;
    }
    r.syncs += states;  // every average counts once, whatever the model does with its time
    r.bytes_per_site += bytes;
    r.comm_s += cost;
    if (job.delayed() && !job.overlap && !due.grad) {
      if (states > 0) {
        // Each site first settles the batch still on the wire (no barrier between the sites:
        // the control exchange's wide-area half runs on the communication thread). The new
        // batch leaves once the last site has started it, after the exchange, its states one
        // after the other (x, u, v), each ready for its fold when its own average is done.
        double ready = link_free;
        for (double& c : clock) {
          waited += std::max(0.0, link_free - c);
          c = std::max(c, link_free);
          ready = std::max(ready, c);
        }
        ready += exchange;
        for (std::size_t k = 0; k < 3; ++k)
          if (kinds[k]) {
            ready += sync[k];
            folds.push_back({step + job.delay[k], ready});
          }
        link_free = ready;
      }
      for (std::size_t s = 0; s < n; ++s) clock[s] += dts[s];
      for (auto it = folds.begin(); it != folds.end();) {
        if (it->step != step && step != job.steps) {
          ++it;
          continue;
        }
        for (double& c : clock) {
          waited += std::max(0.0, it->ready - c);
          c = std::max(c, it->ready);
        }
        it = folds.erase(it);
      }
      continue;
    }
    if (states > 0 && (job.mode == Overlap::kStep) && !job.overlap && !due.grad) {
      // The control exchange at the step's start is a barrier; the averages then run under
      // every site's compute, and the update waits for both.
      const double start = *std::max_element(clock.begin(), clock.end());
      for (std::size_t s = 0; s < n; ++s) {
        waited += start - clock[s] + std::max(0.0, cost - dts[s]);
        clock[s] = start + std::max(dts[s], cost);
      }
      continue;
    }
    for (std::size_t s = 0; s < n; ++s) clock[s] += dts[s];
    if (states == 0) continue;
    if (!job.overlap) {
      const double start = *std::max_element(clock.begin(), clock.end());
      for (double c : clock) waited += start - c;
      std::fill(clock.begin(), clock.end(), start + cost);
    } else {
      // Starts when every site has produced the state and the link is free; the sites only
      // wait if the previous all-reduce still occupies the link.
      const double ready = *std::max_element(clock.begin(), clock.end());
      const double start = std::max(ready, link_free);
      for (double& c : clock) {
        if (link_free > c) waited += link_free - c;
        c = std::max(c, link_free);
      }
      link_free = start + cost;
    }
  }
  r.total_s =
      std::max(*std::max_element(clock.begin(), clock.end()), job.overlap ? link_free : 0.0);
  r.step_s = r.total_s / double(job.steps);
  r.compute_s = *std::max_element(compute.begin(), compute.end());
  r.wait_s = n > 0 ? waited / double(n) : 0.0;
  r.steal_s = n > 0 ? stolen / double(n) : 0.0;
  return r;
}

}  // namespace desloc::topology
