// The streaming search (delayed averages in fragments) and the simulated overhead every delayed
// or noisy plan is checked against.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "desloc/topology/simulator.hpp"
#include "plan_internal.hpp"

namespace desloc::topology::detail {

std::pair<std::int64_t, std::int64_t> third_phases(std::int64_t kx, std::int64_t region_ku,
                                                   std::int64_t region_kv) {
  std::pair<std::int64_t, std::int64_t> p{(kx + 1) / 3, (2 * kx + 1) / 3};
  if (region_ku > 0) p.first = std::min(p.first, region_ku - 1);
  if (region_kv > 0) p.second = std::min(p.second, region_kv - 1);
  return p;
}

double overhead_budget(const PlanRequest& req) {
  return req.target_overhead + (req.region_kx > 0 ? req.region_overhead : 0.0);
}

std::int64_t kx_multiple(const PlanRequest& req) {
  return std::max<std::int64_t>(1, req.region_kx);
}

const SiteProfile& most_steal(const Topology& t) {
  return *std::max_element(t.sites.begin(), t.sites.end(), [](const auto& x, const auto& y) {
    return x.steal_s_per_byte < y.steal_s_per_byte;
  });
}

double steal_floor_kx(const Topology& t, double step_s, double bytes, double codec_s,
                      double averages_per_window, double target) {
  double floor = 0;
  for (const auto& s : t.sites) {
    const double window =
        (s.steal_s_per_byte * site_bytes(bytes, t.sites.size()) + codec_s) * averages_per_window;
    if (window > 0) floor = std::max(floor, window / ((1.0 + target) * step_s - s.step_s));
  }
  return floor;
}

double simulated_overhead(const Topology& t, const PlanRequest& req, const Schedule& ring,
                          const SyncSchedule& sched, std::int64_t tau) {
  SimJob job;
  job.schedule = sched;
  job.steps = 2 * sched.kv + sched.kx;
  job.state_bytes = req.state_bytes;
  job.wire_ratio = req.wire_ratio;
  job.codec_s = req.codec_s;
  job.ring = ring.order;
  job.lanes = ring.lanes;
  job.lane_share = ring.lane_share;
  job.mode = tau > 0 ? Overlap::kDelayed : Overlap::kNone;
  job.delay = {tau, tau, tau};
  if (req.region_kx > 0) {
    job.regions = req.regions;
    // Ku and Kv in the regions keep the job-wide ratios to Kx (the plan's region_ku, region_kv).
    const std::int64_t k = req.region_kx, a = sched.ku / sched.kx, b = sched.kv / sched.kx;
    job.region_schedule = {SyncMethod::kDesloc, k, a * k, b * k, 0, sched.phase_u, sched.phase_v};
  }
  const SimResult r = simulate(t, job);
  return r.compute_s > 0 ? r.total_s / r.compute_s - 1 : 0;
}

namespace {

// How far past the least Kx that fits the streaming search looks for a shorter delay.
constexpr std::int64_t kLongerKx = 64;

// A candidate whose batches need this many times its window's compute on the wire is not
// simulated (plan_streaming).
constexpr double kHopelessWire = 1.5;

// The placements of u's and v's fragments the search tries at one Kx with P fragments of x
// (gap = Kx / P steps apart): as many as x's, on x's steps (batches of at most two fragments,
// the full gap to leave the wire) or between them (single fragments, a third of the gap each);
// or a P and b P of them, one of each state on every x step (every batch 1 + 1/a + 1/b of an x
// fragment: the link's load spread evenly).
struct Placement {
  std::int64_t pu, pv;
  int parts_u, parts_v;
};

}  // namespace

std::optional<Streaming> plan_streaming(const Topology& t, const PlanRequest& req,
                                        const Schedule& ring, double step_s, std::int64_t a,
                                        std::int64_t b, std::int64_t lowest, std::int64_t highest) {
  // Each batch starts with its control exchange, on the wire before the averages (it blocks
  // no step: the communication thread runs it).
  const double exchange = exchange_seconds(t, ring.order);
  // One fragment's average of state k, priced once per (state, parts): a ring's price walks
  // its links, a thousand on a thousand sites, and the search asks for the same few prices at
  // every Kx.
  std::map<std::pair<std::size_t, int>, double> prices;
  auto seconds = [&](int parts, std::size_t k = 0) {
    const auto [it, fresh] = prices.try_emplace({k, parts}, 0.0);
    if (fresh)
      it->second = ring_seconds(t, ring.order, req.state_bytes * req.wire_ratio[k] / parts,
                                ring.lanes, ring.lane_share) +
                   req.codec_s[k] / parts;
    return it->second;
  };
  // The delay a batch of batch_s on the wire needs: it leaves within tau + 1 steps.
  const auto tau_for = [&](double batch_s) {
    return std::max<std::int64_t>(
        1, static_cast<std::int64_t>(
               std::ceil((exchange + batch_s) * (1 + req.target_overhead) / step_s - 1e-9)) -
               1);
  };
  const std::int64_t multiple = kx_multiple(req);
  std::optional<Streaming> chosen;
  std::int64_t least_kx = 0, least_kx_tau = 0;
  const std::int64_t first = std::max<std::int64_t>(lowest, 2);
  for (std::int64_t kx = (first + multiple - 1) / multiple * multiple; kx <= highest;
       kx += multiple) {
    // What a candidate must score below to matter: past the least Kx only shorter delays can,
    // so most candidates are dropped before their batches are priced or simulated.
    const double to_beat = chosen ? delay_score(chosen->kx, chosen->tau, req.delay_weight)
                                  : std::numeric_limits<double>::infinity();
    // Every plan from here on has tau >= 1: none can score below the one chosen. The search
    // for shorter delays also ends kLongerKx steps past the least Kx: each Kx prices its
    // batches over a whole Kv, and a job whose least Kx is in the thousands would search
    // thousands more (a 0.4 ms step against 20-30 ms latencies: 51 s of planning, 5 minutes
    // without the candidates dropped below; 3 s with this bound).
    if (chosen && (delay_score(kx, 1, req.delay_weight) >= to_beat || kx > least_kx + kLongerKx))
      break;
    std::optional<Streaming> best;
    const int most =
        req.fragments > 0 ? req.fragments : static_cast<int>(std::min<std::int64_t>(kx, 64));
    for (int p = req.fragments > 0 ? req.fragments : 2; p <= most; ++p) {
      if (kx % p != 0 && req.fragments == 0) continue;
      if (p > kx) break;
      const std::int64_t gap = kx / p;  // steps between x's fragments
      // Every batch carries at least one fragment of x.
      if (delay_score(kx, tau_for(seconds(p)), req.delay_weight) >= to_beat) continue;
      for (const Placement& pl :
           {Placement{gap, 2 * gap, 0, 0}, Placement{gap / 3, 2 * gap / 3, 0, 0},
            Placement{0, 0, static_cast<int>(a) * p, static_cast<int>(b) * p}}) {
        // With regions the phases are the regions' too, within their periods.
        if (req.region_kx > 0 && (pl.pu >= a * req.region_kx || pl.pv >= b * req.region_kx))
          continue;
        Streaming c;
        c.kx = kx;
        c.fragments = p;
        c.fragments_u = pl.parts_u;
        c.fragments_v = pl.parts_v;
        c.phase_u = pl.pu;
        c.phase_v = pl.pv;
        const SyncSchedule sched{SyncMethod::kDesloc, kx,        a * kx, b * kx, 0, pl.pu, pl.pv, p,
                                 pl.parts_u,          pl.parts_v};
        c.fragment_s = seconds(p);
        const double su = seconds(sched.parts_u(), 1), sv = seconds(sched.parts_v(), 2);
        double wire_s = 0;  // every batch of a Kv window, one after another on the wire
        for (std::int64_t step = 1; step <= b * kx; ++step) {
          const SyncDecision d = sched.at(step);
          const double batch = (d.x ? c.fragment_s : 0) + (d.u ? su : 0) + (d.v ? sv : 0);
          c.batch_s = std::max(c.batch_s, batch);
          if (batch > 0) wire_s += exchange + batch;
        }
        // The batches leave one at a time, so a window whose batches need far more time on the
        // wire than its steps take falls behind whatever the delay: not worth a simulation.
        // The margin keeps every candidate the simulation could still accept.
        if (wire_s > kHopelessWire * (1 + overhead_budget(req)) * double(b * kx) * step_s) continue;
        c.tau = tau_for(c.batch_s);
        if (c.tau >= kx || (best && c.tau >= best->tau) ||
            (req.max_delay > 0 && c.tau > req.max_delay) ||
            delay_score(kx, c.tau, req.delay_weight) >= to_beat)
          continue;
        c.overhead = simulated_overhead(t, req, ring, sched, c.tau);
        if (c.overhead <= overhead_budget(req)) best = c;
      }
    }
    if (!best) continue;
    if (least_kx == 0) {
      least_kx = best->kx;
      least_kx_tau = best->tau;
    }
    if (delay_score(best->kx, best->tau, req.delay_weight) < to_beat) chosen = best;
  }
  if (chosen && chosen->kx != least_kx) {
    chosen->least_kx = least_kx;
    chosen->least_kx_tau = least_kx_tau;
  }
  return chosen;
}

}  // namespace desloc::topology::detail
