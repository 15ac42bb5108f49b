// The planner: schedules priced by the alpha-beta model, then the smallest Kx within target.
#include "desloc/topology/planner.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <tuple>

#include "desloc/core/error.hpp"
#include "desloc/topology/regions.hpp"
#include "desloc/topology/simulator.hpp"

namespace desloc::topology {
namespace {

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

// u's and v's phases a third and two thirds into an x window of kx >= 3 steps.
std::pair<std::int64_t, std::int64_t> third_phases(std::int64_t kx) {
  return {(kx + 1) / 3, (2 * kx + 1) / 3};
}

// The site whose overlapped averages take the most compute per byte sent (the first on a tie);
// `t` has sites (the topology's loader requires one).
const SiteProfile& most_steal(const Topology& t) {
  return *std::max_element(t.sites.begin(), t.sites.end(), [](const auto& x, const auto& y) {
    return x.steal_s_per_byte < y.steal_s_per_byte;
  });
}

// The least Kx at which the compute overlapped averages take (simulate()'s steal: each site's
// steal per byte sent plus the codec's work, on the 1 + 1/a + 1/b averages of an x window)
// can fit the target at all: a site whose step is s and the slowest's S has
// (K s + window) / (K S) - 1 <= target only for K >= window / ((1 + target) S - s). Waiting
// for the wire only adds to it. 0 where nothing is taken.
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

// The overhead simulate() predicts for averages on `sched`, delayed by tau (0: blocking): total
// time over compute time, less one, over 2 Kv + Kx steps.
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
  const SimResult r = simulate(t, job);
  return r.compute_s > 0 ? r.total_s / r.compute_s - 1 : 0;
}

// How far past the least Kx that fits the streaming search looks for a shorter delay.
constexpr std::int64_t kLongerKx = 64;

// The streaming plan with Kx in [lowest, highest] of the least Kx + delay_weight * tau (Kx at
// most kLongerKx past the least that fits), the least Kx on a tie (header comment), or
// nullopt. At each Kx the least tau that fits.
std::optional<Streaming> plan_streaming(const Topology& t, const PlanRequest& req,
                                        const Schedule& ring, double step_s, std::int64_t a,
                                        std::int64_t b, std::int64_t lowest, std::int64_t highest) {
  // Each batch starts with its control exchange, on the wire before the averages (it blocks
  // no step: the communication thread runs it).
  const double exchange = exchange_seconds(t, ring.order);
  auto seconds = [&](int parts, std::size_t k = 0) {  // one fragment's average of state k
    return ring_seconds(t, ring.order, req.state_bytes * req.wire_ratio[k] / parts, ring.lanes,
                        ring.lane_share) +
           req.codec_s[k] / parts;
  };
  // The delay a batch of batch_s on the wire needs: it leaves within tau + 1 steps.
  const auto tau_for = [&](double batch_s) {
    return std::max<std::int64_t>(
        1, static_cast<std::int64_t>(
               std::ceil((exchange + batch_s) * (1 + req.target_overhead) / step_s - 1e-9)) -
               1);
  };
  std::optional<Streaming> chosen;
  std::int64_t least_kx = 0, least_kx_tau = 0;
  for (std::int64_t kx = std::max<std::int64_t>(lowest, 2); kx <= highest; ++kx) {
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
      // Three placements of u's and v's fragments: as many as x's, on x's steps (batches of
      // at most two fragments, the full gap to leave the wire) or between them (single
      // fragments, a third of the gap each); or a * P and b * P of them, one of each state on
      // every x step (every batch 1 + 1/a + 1/b of an x fragment: the link's load spread
      // evenly).
      struct Placement {
        std::int64_t pu, pv;
        int parts_u, parts_v;
      };
      for (const Placement& pl :
           {Placement{gap, 2 * gap, 0, 0}, Placement{gap / 3, 2 * gap / 3, 0, 0},
            Placement{0, 0, static_cast<int>(a) * p, static_cast<int>(b) * p}}) {
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
        for (std::int64_t step = 1; step <= b * kx; ++step) {
          const SyncDecision d = sched.at(step);
          c.batch_s =
              std::max(c.batch_s, (d.x ? c.fragment_s : 0) + (d.u ? su : 0) + (d.v ? sv : 0));
        }
        c.tau = tau_for(c.batch_s);
        if (c.tau >= kx || (best && c.tau >= best->tau) ||
            (req.max_delay > 0 && c.tau > req.max_delay) ||
            delay_score(kx, c.tau, req.delay_weight) >= to_beat)
          continue;
        c.overhead = simulated_overhead(t, req, ring, sched, c.tau);
        if (c.overhead <= req.target_overhead) best = c;
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

}  // namespace

double delay_score(std::int64_t kx, std::int64_t tau, double weight) {
  return double(kx) + weight * double(tau);
}

std::string Schedule::describe() const {
  if (kind == "star") return "star at " + order.at(0);
  if (lanes != 2) return fmt::format("ring {} -> {}", fmt::join(order, " -> "), order.at(0));
  return fmt::format(
      "ring {} -> {} and its reverse (2 lanes{})", fmt::join(order, " -> "), order.at(0),
      lane_share == 0.5 ? "" : fmt::format(", {:.0f}% on the ring", 100 * lane_share));
}

double half_life(double beta) { return std::log(0.5) / std::log(beta); }

namespace {
std::vector<std::string> reversed_ring(const std::vector<std::string>& order) {
  std::vector<std::string> reversed{order[0]};
  reversed.insert(reversed.end(), order.rbegin(), order.rend() - 1);
  return reversed;
}
}  // namespace

double site_bytes(double bytes, std::size_t n) {
  return n > 1 ? bytes * 2.0 * double(n - 1) / double(n) : 0.0;
}

double ring_seconds(const Topology& t, const std::vector<std::string>& order, double bytes,
                    int lanes, double lane_share) {
  const std::size_t n = order.size();
  if (n < 2) return 0;
  if (lanes == 2 && n >= 3) {
    // As transport::lane_block splits: ceil(share x count) on the ring.
    const double first = std::ceil(bytes * lane_share);
    return std::max(ring_seconds(t, order, first, 1),
                    ring_seconds(t, reversed_ring(order), std::max(0.0, bytes - first), 1));
  }
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i)
    worst = std::max(
        worst,
        t.link(order[i], order[(i + 1) % n]).transfer_seconds(bytes / static_cast<double>(n)));
  return 2.0 * static_cast<double>(n - 1) * worst;
}

double balanced_lane_share(const Topology& t, const std::vector<std::string>& order, double bytes) {
  if (order.size() < 3) return 0.5;
  const std::vector<std::string> reversed = reversed_ring(order);
  // The ring's time grows with its share and the reverse's falls: bisect for the crossing.
  const auto gap = [&](double s) {
    return ring_seconds(t, order, bytes * s, 1) - ring_seconds(t, reversed, bytes * (1 - s), 1);
  };
  double lo = 0.0, hi = 1.0;
  for (int i = 0; i < 60; ++i) {
    const double mid = (lo + hi) / 2;
    (gap(mid) < 0 ? lo : hi) = mid;
  }
  // A multiple of 0.01, for the config: of the two around the crossing, the faster.
  const double k = std::clamp(std::floor(lo * 100), 1.0, 98.0);
  const double down = k / 100, up = (k + 1) / 100;
  const auto time = [&](double s) { return ring_seconds(t, order, bytes, 2, s); };
  return time(up) <= time(down) ? up : down;
}

double exchange_seconds(const Topology& t, const std::vector<std::string>& order) {
  return ring_seconds(t, order, 64.0 * double(order.size()), 1) / 2;
}

double star_seconds(const Topology& t, const std::string& root, double bytes) {
  double in = 0, out = 0;
  for (const auto& s : t.sites) {
    if (s.name == root) continue;
    in = std::max(in, t.link(s.name, root).transfer_seconds(bytes));
    out = std::max(out, t.link(root, s.name).transfer_seconds(bytes));
  }
  return in + out;
}

double overhead(double sync_s, double step_s, std::int64_t kx, std::int64_t ku, std::int64_t kv,
                bool overlap) {
  // Communication per Kx window against the window's compute.
  const double window = static_cast<double>(kx) * step_s;
  const double comm = sync_s * (1.0 + double(kx) / double(ku) + double(kx) / double(kv));
  if (!overlap) return comm / window;
  return std::max(0.0, comm - window) / window;
}

namespace {

double bottleneck(const Topology& t, const std::vector<std::string>& order, int lanes = 1) {
  double b = std::numeric_limits<double>::infinity();
  const std::size_t n = order.size();
  for (std::size_t i = 0; i < n; ++i) {
    b = std::min(b, t.link(order[i], order[(i + 1) % n]).bandwidth_bps);
    if (lanes == 2 && n >= 3) b = std::min(b, t.link(order[(i + 1) % n], order[i]).bandwidth_bps);
  }
  return b;
}

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

std::string mbit(double bytes_per_s) { return fmt::format("{:.0f} Mbit/s", bytes_per_s * 8 / 1e6); }

}  // namespace

RegionPlan plan_regions(const Topology& t, const Plan& flat,
                        const std::vector<std::vector<std::string>>& regions, double state_bytes,
                        double target_overhead) {
  RegionPlan r;
  r.regions = regions;
  std::string slowest;
  for (const auto& g : regions) {
    const double secs = ring_seconds(t, g, state_bytes, 1);
    if (secs > r.region_seconds || slowest.empty()) {
      r.region_seconds = secs;
      slowest = describe_regions({g});
    }
  }
  // Ku = 3 Kx and Kv = 6 Kx inside the regions too: T (1 + 1/3 + 1/6) / (Kx step) <= target.
  const double window = 1.5 * r.region_seconds / (target_overhead * flat.step_s);
  r.region_kx = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(window - 1e-9)));
  r.region_overhead =
      overhead(r.region_seconds, flat.step_s, r.region_kx, 3 * r.region_kx, 6 * r.region_kx, false);
  r.worthwhile = r.region_kx < flat.kx;
  r.kx = (flat.kx + r.region_kx - 1) / r.region_kx * r.region_kx;
  r.explanation.push_back(fmt::format(
      "hierarchical: regions {}: the slowest region's ring ({}) averages a state in {:.3f} s, so "
      "inside the regions Kx = {} (Ku {}, Kv {}) costs {:.2f}% at the {:.1f}% target; the "
      "job-wide averages keep Kx = {} (the flat plan's {} rounded up to a multiple of {}), "
      "about {:.2f}% more overhead in all",
      describe_regions(regions), slowest, r.region_seconds, r.region_kx, 3 * r.region_kx,
      6 * r.region_kx, 100 * r.region_overhead, 100 * target_overhead, r.kx, flat.kx, r.region_kx,
      100 * r.region_overhead));
  if (!r.worthwhile)
    r.explanation.push_back(fmt::format(
        "hierarchical: not worth it here: the regions could average no more often than the flat "
        "plan does (Kx {} inside against {})",
        r.region_kx, flat.kx));
  std::vector<std::string> quoted;
  for (const auto& g : regions) {
    std::vector<std::string> q;
    for (const auto& s : g) q.push_back("\"" + s + "\"");
    quoted.push_back(fmt::format("[{}]", fmt::join(q, ", ")));
  }
  r.config_fragment = fmt::format(
      "# hierarchical DES-LOC (docs/sync.md): set these beside the fragment above\n"
      "[sync]\nkx = {}\nku = {}\nkv = {}\nphase_u = 0\nphase_v = 0\nregion_kx = {}\n[job]\n"
      "regions = [{}]\n",
      r.kx, 3 * r.kx, 6 * r.kx, r.region_kx, fmt::join(quoted, ", "));
  return r;
}

Plan make_plan(const Topology& t, const PlanRequest& req) {
  if (!(req.state_bytes > 0)) throw ConfigError("plan: the model has no parameters to average");
  if (!(req.target_overhead > 0) || !std::isfinite(req.target_overhead))
    throw ConfigError(fmt::format(
        "plan: --target-overhead {} must be a positive fraction (e.g. 0.05)", req.target_overhead));
  if (!(req.beta1 > 0 && req.beta1 < 1 && req.beta2 > 0 && req.beta2 < 1))
    throw ConfigError("plan: optim.beta1 and optim.beta2 must lie in (0, 1) to derive Ku and Kv");
  Plan plan;
  const auto names = t.site_names();
  for (const auto& s : t.sites) plan.step_s = std::max(plan.step_s, s.step_s);

  // Ku and Kv. Rule: Ku = 3 Kx (the paper's default). Kv / Ku = the ratio of the moments'
  // half-lives tau = ln 0.5 / ln beta, rounded and clamped to [2, 8]: v remembers longer than
  // u by that factor, so it can be averaged that much less often. beta1 = 0.9, beta2 = 0.95
  // give tau 6.6 and 13.5 steps, ratio 2: Kv = 6 Kx, the paper's default again.
  const double tau1 = half_life(req.beta1), tau2 = half_life(req.beta2);
  const std::int64_t a = 3;
  const auto b = a * std::clamp<std::int64_t>(std::llround(tau2 / tau1), 2, 8);

  // Codecs: one "state average" below is the mean of x's, u's and v's weighted by how often
  // each comes (1, 1 / a, 1 / b per x window): encoded bytes on the ring plus codec time.
  const auto weighted = [&](const std::array<double, 3>& per_state) {
    return (per_state[0] + per_state[1] / double(a) + per_state[2] / double(b)) /
           (1.0 + 1.0 / double(a) + 1.0 / double(b));
  };
  const double ratio = weighted(req.wire_ratio);
  const double codec_s = names.size() > 1 ? weighted(req.codec_s) : 0.0;
  const double P = req.state_bytes * ratio;

  // Rings: the first site fixed (rotations are the same ring), every order of the rest.
  // Sites beyond 9 would make (n-1)! too large; then the order is improved greedily.
  std::vector<std::string> order = names;
  const int L = names.size() >= 3 ? req.lanes : 1;
  Schedule best_ring{"ring", order, L, 0.5, ring_seconds(t, order, P, L), bottleneck(t, order, L)};
  if (names.size() <= 9) {
    std::vector<std::string> rest(names.begin() + 1, names.end());
    std::sort(rest.begin(), rest.end());
    do {
      std::vector<std::string> o{names[0]};
      o.insert(o.end(), rest.begin(), rest.end());
      const double secs = ring_seconds(t, o, P, L);
      if (secs < best_ring.seconds - 1e-12)
        best_ring = {"ring", o, L, 0.5, secs, bottleneck(t, o, L)};
    } while (std::next_permutation(rest.begin(), rest.end()));
  } else {
    // Nearest-fastest-neighbour: from each site, go to the unvisited site with the fastest link.
    std::vector<std::string> o{names[0]};
    std::vector<std::string> left(names.begin() + 1, names.end());
    while (!left.empty()) {
      auto it = std::max_element(left.begin(), left.end(), [&](const auto& a, const auto& b) {
        return t.link(o.back(), a).bandwidth_bps < t.link(o.back(), b).bandwidth_bps;
      });
      o.push_back(*it);
      left.erase(it);
    }
    best_ring = {"ring", o, L, 0.5, ring_seconds(t, o, P, L), bottleneck(t, o, L)};
  }
  // The order is chosen at the even split; then its lanes are weighed by capacity.
  const Schedule even_ring = best_ring;
  if (L == 2) {
    best_ring.lane_share = balanced_lane_share(t, best_ring.order, P);
    best_ring.seconds = ring_seconds(t, best_ring.order, P, L, best_ring.lane_share);
  }
  plan.chosen = best_ring;
  plan.candidates.push_back(best_ring);
  if (names.size() > 1) {
    const double share = L == 2 ? balanced_lane_share(t, names, P) : 0.5;
    Schedule config_ring{
        "ring", names, L, share, ring_seconds(t, names, P, L, share), bottleneck(t, names, L)};
    if (config_ring.order != best_ring.order) plan.candidates.push_back(config_ring);
    if (best_ring.lane_share != 0.5) plan.candidates.push_back(even_ring);  // what weighing buys
    if (L == 2)  // what the second lane buys
      plan.candidates.push_back({"ring", best_ring.order, 1, 0.5,
                                 ring_seconds(t, best_ring.order, P, 1),
                                 bottleneck(t, best_ring.order, 1)});
    for (const auto& root : names) {
      double b = std::numeric_limits<double>::infinity();
      for (const auto& s : names)
        if (s != root)
          b = std::min({b, t.link(s, root).bandwidth_bps, t.link(root, s).bandwidth_bps});
      plan.candidates.push_back({"star", {root}, 1, 0.5, star_seconds(t, root, P), b});
    }
  }
  const double sync = plan.chosen.seconds + codec_s;

  // The smallest Kx within target. overhead() falls as Kx grows like 1 / Kx: start from the
  // closed form and correct it by a step or two. A target that needs Kx beyond train.steps
  // (or beyond what Kv = b Kx can hold) is refused from the closed form, never walked to: a
  // link of 1e-17 Mbit/s or a target of 1e-30 would need about 1e20 steps of walking.
  const std::int64_t max_kx = std::max<std::int64_t>(
      1, std::min<std::int64_t>(req.steps, std::numeric_limits<std::int64_t>::max() / b));
  auto unmeetable = [&](const std::string& needed) {
    const double at_max = overhead(sync, plan.step_s, max_kx, a * max_kx, b * max_kx, req.overlap);
    return ConfigError(fmt::format(
        "plan: a communication overhead of {:.3g}% (--target-overhead {:g}) needs Kx >= {}, but "
        "train.steps = {}; at Kx = {} the overhead would be {:.3g}% (one sync of {:.2f} MB over "
        "the {} takes {:.3g} s against a {:.1f} ms step; slowest link {}). Raise the target, "
        "train longer, or use faster links",
        100 * req.target_overhead, req.target_overhead, needed, req.steps, max_kx, 100 * at_max,
        P / 1e6, plan.chosen.describe(), sync, plan.step_s * 1e3,
        fmt::format("{:.3g} Mbit/s", plan.chosen.bottleneck_bps * 8 / 1e6)));
  };
  std::int64_t kx = 1;
  // Sites whose steps swing, and the simulated overhead of whole averages at period k, delayed
  // by tau (0: blocking), with u and v at the plan's phases.
  const bool noisy =
      names.size() > 1 &&
      std::any_of(t.sites.begin(), t.sites.end(), [](const auto& s) { return s.step_jitter > 0; });
  const auto simulated = [&](std::int64_t k, std::int64_t tau) {
    const auto [u, v] = k >= 3 ? third_phases(k) : std::pair<std::int64_t, std::int64_t>{0, 0};
    return simulated_overhead(t, req, plan.chosen, {SyncMethod::kDesloc, k, a * k, b * k, 0, u, v},
                              tau);
  };
  // Blocking on noisy sites: the closed form's Kx, before the walk for the noise.
  std::int64_t closed_kx = 0;
  // Delayed averages: each leaves with its control exchange ahead of it on the wire.
  const double exchange = exchange_seconds(t, plan.chosen.order);
  std::optional<Streaming> streaming;
  std::int64_t whole_kx = 0;   // delayed: the whole-average plan's Kx (0 = none)
  std::int64_t whole_tau = 0;  // and its delay
  std::int64_t wire_kx = 0;    // whole delayed averages: the Kx the wire alone would allow
  // Delayed averages: no Kx below this fits the target, whatever the wire does.
  const double steal_kx =
      req.delayed && names.size() > 1
          ? steal_floor_kx(t, plan.step_s, P, codec_s, 1.0 + 1.0 / double(a) + 1.0 / double(b),
                           req.target_overhead)
          : 0.0;
  if (!(steal_kx <= static_cast<double>(max_kx))) {
    const SiteProfile& thief = most_steal(t);
    throw ConfigError(fmt::format(
        "plan: the compute that overlapped averages take (steal up to {:.3g} ms per MB sent, "
        "site {}; {:.3f} s of codec work per average) needs Kx >= {:.3g} for an overhead of "
        "{:.3g}% (--target-overhead {:g}), but train.steps = {}; raise the target, train "
        "longer, or send fewer bytes per average (--codecs auto)",
        thief.steal_s_per_byte * 1e9, thief.name, codec_s, std::ceil(steal_kx),
        100 * req.target_overhead, req.target_overhead, req.steps));
  }
  if (req.delayed && sync > 0 && req.fragments != 1) {
    // The whole-average plan first (when it exists), then any streaming plan that beats it.
    std::optional<ConfigError> whole_error;
    PlanRequest whole = req;
    whole.fragments = 1;
    // Past --max-delay the whole plan throws too (it carries max_delay): no candidate, so every
    // Kx is searched for a streaming one.
    try {
      const Plan w = make_plan(t, whole);
      whole_kx = w.kx;
      whole_tau = w.delay;
    } catch (const ConfigError& e) {
      whole_error = e;
    }
    const double load = sync * (1.0 + 1.0 / double(a) + 1.0 / double(b)) / plan.step_s;
    const auto lowest = static_cast<std::int64_t>(std::ceil(std::max(load, steal_kx) - 1e-9));
    // Without --fragments, only a streaming plan that scores below the whole one (Kx + the
    // delay's weight times tau, tau >= 1) replaces it.
    const std::int64_t highest =
        req.fragments > 1 || whole_kx == 0
            ? std::min<std::int64_t>(max_kx, 4096)
            : std::min<std::int64_t>(
                  max_kx, static_cast<std::int64_t>(
                              std::ceil(delay_score(whole_kx, whole_tau, req.delay_weight) -
                                        req.delay_weight - 1e-9)) -
                              1);
    streaming = plan_streaming(t, req, plan.chosen, plan.step_s, a, b, lowest, highest);
    if (streaming && whole_kx > 0 && req.fragments == 0 &&
        delay_score(streaming->kx, streaming->tau, req.delay_weight) >=
            delay_score(whole_kx, whole_tau, req.delay_weight))
      streaming.reset();
    const std::string sync_facts =
        fmt::format("one sync of {:.2f} MB over the {} takes {:.3g} s against a {:.1f} ms step",
                    P / 1e6, plan.chosen.describe(), sync, plan.step_s * 1e3);
    if (!streaming && req.fragments > 1)
      throw ConfigError(fmt::format(
          "plan: no Kx up to {} hides averages of {} fragments within {:.3g}% ({}); try another "
          "--fragments, a larger --target-overhead, or drop --fragments to let the planner "
          "choose",
          highest, req.fragments, 100 * req.target_overhead, sync_facts));
    if (!streaming && req.max_delay > 0 && whole_kx == 0)
      throw ConfigError(fmt::format(
          "plan: no Kx up to {} hides the averages with a delay of at most {} steps (--max-delay) "
          "within {:.3g}% ({}; a batch must leave the wire within max-delay + 1 steps); allow a "
          "longer delay or a larger --target-overhead",
          highest, req.max_delay, 100 * req.target_overhead, sync_facts));
    if (!streaming && whole_error) throw *whole_error;
  }
  if (streaming) {
    kx = streaming->kx;
    plan.delay = streaming->tau;
    plan.fragments = streaming->fragments;
    plan.fragments_u = streaming->fragments_u;
    plan.fragments_v = streaming->fragments_v;
  } else if (req.delayed && sync > 0) {
    const double steps_per_sync = (exchange + sync) * (1.0 + req.target_overhead) / plan.step_s;
    if (!(steps_per_sync * 3 + 3 <= static_cast<double>(max_kx)))
      throw unmeetable(fmt::format("{:.0f}", std::ceil(3 * steps_per_sync)));
    plan.delay =
        std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(steps_per_sync)) - 1);
    kx = std::max<std::int64_t>(
        {plan.delay + 1, 3 * static_cast<std::int64_t>(std::ceil(steps_per_sync)), 3});
    if (req.max_delay > 0 && plan.delay > req.max_delay && req.fragments == 1)
      throw ConfigError(fmt::format(
          "plan: whole delayed averages need a delay of {} steps (one sync of {:.3g} s against a "
          "{:.1f} ms step), above --max-delay {}; drop --fragments 1 to let fragments shorten it",
          plan.delay, sync, plan.step_s * 1e3, req.max_delay));
    // No delay hides the communication's CPU (the sites' steal, the codec's work): it costs
    // every average, so the period grows, from the least Kx that could pay it, until the
    // simulated overhead is within target.
    wire_kx = kx;
    kx = std::max(kx, static_cast<std::int64_t>(std::ceil(steal_kx - 1e-9)));
    while (kx < max_kx && simulated(kx, plan.delay) > req.target_overhead) ++kx;
  } else if (sync > 0) {
    // Closed form without overlap, then a check (and a short walk for the overlap model).
    const double need =
        sync * (1.0 + 1.0 / double(a) + 1.0 / double(b)) /
        (plan.step_s * (req.overlap ? 1.0 + req.target_overhead : req.target_overhead));
    if (!(need - 1e-9 <= static_cast<double>(max_kx)))
      throw unmeetable(need < 1e15 ? fmt::format("{:.0f}", std::ceil(need - 1e-9))
                                   : fmt::format("{:.3g}", need));
    kx = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(need - 1e-9)));
    while (kx > 1 && overhead(sync, plan.step_s, kx - 1, a * (kx - 1), b * (kx - 1), req.overlap) <=
                         req.target_overhead)
      --kx;
    while (kx <= max_kx &&
           overhead(sync, plan.step_s, kx, a * kx, b * kx, req.overlap) > req.target_overhead)
      ++kx;
    // Where the sites' steps swing (step_jitter), every blocking average also waits for the
    // slowest site to arrive, which the closed form cannot see: on from there while the
    // simulated overhead misses the target, 2% of Kx at a time (a Kx in the thousands would
    // otherwise be walked one step at a time, each simulated over 2 Kv + Kx steps).
    if (!req.overlap && noisy) {
      closed_kx = kx;
      while (kx <= max_kx && simulated(kx, 0) > req.target_overhead)
        kx = std::max(kx + 1, static_cast<std::int64_t>(std::ceil(double(kx) * 1.02)));
    }
  }
  if (kx > max_kx) throw unmeetable(std::to_string(kx));
  plan.kx = kx;
  plan.ku = a * kx;
  plan.kv = b * kx;
  // Phases: u and v land a third and two thirds into an x window, never on an x step and
  // never on each other (Ku, Kv are multiples of Kx), so one sync is in flight at a time.
  if (kx >= 3) std::tie(plan.phase_u, plan.phase_v) = third_phases(kx);
  if (streaming) {  // between x's fragments instead
    plan.phase_u = streaming->phase_u;
    plan.phase_v = streaming->phase_v;
  }
  plan.overhead = streaming     ? streaming->overhead
                  : req.delayed ? simulated(plan.kx, plan.delay)
                  : closed_kx > 0
                      ? simulated(plan.kx, 0)
                      : overhead(sync, plan.step_s, plan.kx, plan.ku, plan.kv, req.overlap);

  auto& e = plan.explanation;
  e.push_back(
      fmt::format("inputs: {} sites, state of {:.2f} MB (x, u and v each), slowest "
                  "compute step {:.1f} ms, target overhead {:.1f}%{}",
                  names.size(), P / 1e6, plan.step_s * 1e3, 100 * req.target_overhead,
                  req.delayed   ? " (delayed averages, sync.overlap = \"delayed\")"
                  : req.overlap ? " (syncs overlapped with compute)"
                                : " (blocking syncs)"));
  if (ratio != 1.0 || codec_s > 0)
    e.push_back(fmt::format(
        "codecs: {}; on the wire {:.3f}x of fp32 (x {:.3f}x, u {:.3f}x, v {:.3f}x, weighted 1, "
        "1/{}, 1/{}), plus {:.3f} s of codec work per average",
        req.codec_keys.empty() ? std::string("as given") : one_line(req.codec_keys), ratio,
        req.wire_ratio[0], req.wire_ratio[1], req.wire_ratio[2], a, b, codec_s));
  if (const SiteProfile& thief = most_steal(t);
      thief.steal_s_per_byte > 0 && (req.delayed || req.overlap))
    e.push_back(fmt::format(
        "steal: overlapped averages take compute from the sites, up to {:.2f} ms per MB sent "
        "(site {}; desloc profile measures it): {:.1f} ms per x average of this ring",
        thief.steal_s_per_byte * 1e9, thief.name,
        thief.steal_s_per_byte * site_bytes(P, names.size()) * 1e3));
  if (const auto noisiest = std::max_element(
          t.sites.begin(), t.sites.end(),
          [](const auto& x, const auto& y) { return x.step_jitter < y.step_jitter; });
      !req.overlap && noisy)
    e.push_back(fmt::format(
        "noise: the sites' steps swing, up to sd {:.2f} of ln step time (site {}; desloc "
        "profile measures it); the overhead is simulated with every step drawn from it, so "
        "that every average waits for the slowest site to reach its step",
        noisiest->step_jitter, noisiest->name));
  for (const auto& c : plan.candidates)
    e.push_back(fmt::format("candidate {}: {:.3f} s per all-reduce, slowest link {}", c.describe(),
                            c.seconds, mbit(c.bottleneck_bps)));
  e.push_back(fmt::format("schedule: {} ({:.3f} s): it maximises the slowest ring link ({})",
                          plan.chosen.describe(), sync, mbit(plan.chosen.bottleneck_bps)));
  const auto fastest =
      std::min_element(plan.candidates.begin(), plan.candidates.end(),
                       [](const auto& x, const auto& y) { return x.seconds < y.seconds; });
  if (fastest->kind == "star")
    e.push_back(fmt::format(
        "note: a {} would take {:.3f} s ({:.0f}% less); desloc's transport runs rings only, so "
        "the plan uses the best ring",
        fastest->describe(), fastest->seconds, 100 * (1 - fastest->seconds / sync)));
  e.push_back(
      fmt::format("Ku = 3 Kx; Kv = {} Kx: half-lives tau1 = {:.1f}, tau2 = {:.1f} steps, "
                  "Kv / Ku = round(tau2 / tau1) clamped to [2, 8] = {}",
                  b, tau1, tau2, b / a));
  if (streaming) {
    e.push_back(fmt::format(
        "streaming: {} fragments of x ({:.2f} MB, {:.3f} s per all-reduce){}; x's fragments "
        "every {} steps, u's at phase {} and v's at {}; the largest batch due at one "
        "step "
        "({:.3f} s, +{:.0f}% margin) leaves the wire within tau + 1 = {} steps of {:.1f} ms; "
        "Kx = {}, simulated overhead {:.2f}% (within {:.1f}%){}",
        streaming->fragments, P / streaming->fragments / 1e6, streaming->fragment_s,
        streaming->fragments_u > 0
            ? fmt::format(", {} of u and {} of v (one of each on every x fragment's step)",
                          streaming->fragments_u, streaming->fragments_v)
            : ", as many of u and v",
        kx / streaming->fragments, streaming->phase_u, streaming->phase_v, streaming->batch_s,
        100 * req.target_overhead, plan.delay + 1, plan.step_s * 1e3, kx, 100 * plan.overhead,
        100 * req.target_overhead,
        whole_kx > 0 ? fmt::format("; whole averages would need Kx = {}", whole_kx)
                     : "; whole averages cannot meet the target"));
    e.push_back(fmt::format(
        "delay against period: Kx + {:g} tau = {:g} (--delay-weight: a step of delay costs the "
        "model about {:g} steps of period){}",
        req.delay_weight, delay_score(kx, plan.delay, req.delay_weight), req.delay_weight,
        streaming->least_kx > 0
            ? fmt::format(
                  "; the least Kx, {} with tau = {}, scores {:g}", streaming->least_kx,
                  streaming->least_kx_tau,
                  delay_score(streaming->least_kx, streaming->least_kx_tau, req.delay_weight))
            : "; no other Kx scores lower"));
  } else if (plan.delay > 0) {
    e.push_back(fmt::format(
        "delay tau = {}: an average of {:.3f} s after its control exchange ({:.1f} ms, on the "
        "communication thread) leaves the wire within tau + 1 = {} steps of {:.1f} ms (+{:.0f}% "
        "margin); Kx = {}: the averages a third of a window apart ({} steps) each finish before "
        "the next starts, tau < Kx{}; simulated overhead {:.2f}% (within {:.1f}%)",
        plan.delay, sync, exchange * 1e3, plan.delay + 1, plan.step_s * 1e3,
        100 * req.target_overhead, kx, kx / 3,
        kx > wire_kx
            ? fmt::format(
                  " (the wire alone would allow Kx = {}; the simulated overhead, the sites' steal "
                  "included, needs {})",
                  wire_kx, kx)
            : std::string(),
        100 * plan.overhead, 100 * req.target_overhead));
  } else if (closed_kx > 0) {
    e.push_back(fmt::format(
        "Kx = {}: the overhead T_sync (1/Kx + 1/Ku + 1/Kv) / step is within {:.1f}% from Kx = {} "
        "on; with every step drawn from the sites' noise (every average waits for the slowest "
        "site) Kx grew from there 2% at a time to {}, simulated at {:.2f}%",
        kx, 100 * req.target_overhead, closed_kx, kx, 100 * plan.overhead));
  } else {
    e.push_back(fmt::format(
        "Kx = {}: the smallest period whose overhead T_sync (1/Kx + 1/Ku + 1/Kv) / step = {:.2f}% "
        "is within {:.1f}% (Kx = {} would give {:.2f}%)",
        kx, 100 * plan.overhead, 100 * req.target_overhead, std::max<std::int64_t>(1, kx - 1),
        100 * overhead(sync, plan.step_s, std::max<std::int64_t>(1, kx - 1),
                       a * std::max<std::int64_t>(1, kx - 1), b * std::max<std::int64_t>(1, kx - 1),
                       req.overlap)));
  }
  if (streaming)
    e.push_back(fmt::format("phases: x at 0, u at {}, v at {}", plan.phase_u, plan.phase_v));
  else
    e.push_back(fmt::format("phases: x at 0, u at {}, v at {}: no two averages on one step",
                            plan.phase_u, plan.phase_v));
  // A blocking plan says what delayed (streaming) averages would allow instead.
  if (!req.delayed && !req.overlap && sync > 0) {
    PlanRequest d = req;
    d.delayed = true;
    try {
      const Plan alt = make_plan(t, d);
      if (alt.kx < plan.kx)
        e.push_back(fmt::format(
            "mode: blocking averages need Kx = {}; delayed averages (`desloc plan --delayed`) "
            "would hide them at Kx = {} with tau = {}{}",
            plan.kx, alt.kx, alt.delay,
            alt.fragments > 1 ? fmt::format(" in {} fragments (streaming)", alt.fragments) : ""));
    } catch (const ConfigError&) {
      e.push_back("mode: delayed averages (`desloc plan --delayed`) cannot meet the target either");
    }
  }

  // Convergence: the periods against what the paper validated, and how often the sites meet.
  const auto times = [&](std::int64_t k) {
    return req.steps > 0 ? fmt::format("{}", req.steps / k) : std::string("?");
  };
  e.push_back(fmt::format(
      "convergence: Kx = {}, Ku = {}, Kv = {} ({} the validated Kx <= {} with Ku = 3 Kx, Kv = 6 "
      "Kx); over train.steps = {} the sites average x {} times, u {} and v {}",
      plan.kx, plan.ku, plan.kv, plan.kx <= kValidatedKx ? "within" : "beyond", kValidatedKx,
      req.steps, times(plan.kx), times(plan.ku), times(plan.kv)));
  if (plan.kx > kValidatedKx)
    plan.warnings.push_back(fmt::format(
        "Kx = {} is beyond the periods DES-LOC's convergence was shown at (Kx <= {}): the sites "
        "average their parameters {} times in {} steps and train nearly alone. Shorter periods "
        "need fewer bytes per average (--codecs auto), averages that overlap compute "
        "(--delayed), or both (--auto); or a larger --target-overhead",
        plan.kx, kValidatedKx, times(plan.kx), req.steps));

  std::vector<std::string> quoted;
  for (const auto& s : plan.chosen.order) quoted.push_back("\"" + s + "\"");
  plan.config_fragment = fmt::format(
      "# from `desloc plan`: {}, predicted overhead {:.2f}%\n[sync]\nmethod = \"desloc\"\n"
      "kx = {}\nku = {}\nkv = {}\nphase_x = 0\nphase_u = {}\nphase_v = {}\n{}{}\n[job]\n"
      "sites = [{}]  # the ring order\n\n[transport]\nlanes = {}\n{}",
      plan.chosen.describe(), 100 * plan.overhead, plan.kx, plan.ku, plan.kv, plan.phase_u,
      plan.phase_v,
      plan.delay > 0
          ? fmt::format("overlap = \"delayed\"\ndelay = {}\n{}{}", plan.delay,
                        plan.fragments > 1 ? fmt::format("fragments = {}\n", plan.fragments) : "",
                        plan.fragments_u > 0 ? fmt::format("fragments_u = {}\nfragments_v = {}\n",
                                                           plan.fragments_u, plan.fragments_v)
                                             : "")
          : "",
      req.codec_keys.empty() ? "" : req.codec_keys + "\n", fmt::join(quoted, ", "),
      plan.chosen.lanes,
      plan.chosen.lane_share != 0.5
          ? fmt::format(
                "lane_share = {:.2f}  # of each shard on the ring; the rest on its reverse\n",
                plan.chosen.lane_share)
          : "");
  return plan;
}

}  // namespace desloc::topology
