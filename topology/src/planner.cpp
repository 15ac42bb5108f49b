// The planner: the ring, then per mode the smallest Kx within target, then why.
#include "desloc/topology/planner.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "desloc/core/error.hpp"
#include "desloc/topology/regions.hpp"
#include "plan_internal.hpp"

namespace desloc::topology {
namespace {

using detail::Streaming;

double bottleneck(const Topology& t, const std::vector<std::string>& order, int lanes = 1) {
  double b = std::numeric_limits<double>::infinity();
  const std::size_t n = order.size();
  for (std::size_t i = 0; i < n; ++i) {
    b = std::min(b, t.link(order[i], order[(i + 1) % n]).bandwidth_bps);
    if (lanes == 2 && n >= 3) b = std::min(b, t.link(order[(i + 1) % n], order[i]).bandwidth_bps);
  }
  return b;
}

// Every link between `names`, by their indices into `names`: the topology's own index by site
// position (Topology::link), the names looked up once.
class LinkMatrix {
 public:
  LinkMatrix(const Topology& t, const std::vector<std::string>& names) : t_(t) {
    position_.reserve(names.size());
    for (const std::string& name : names) position_.push_back(t.site_index(name));
  }
  // The link i -> j (an Error naming both, where the topology lacks it).
  const LinkProfile& at(std::size_t i, std::size_t j) const {
    return t_.link(position_[i], position_[j]);
  }

 private:
  const Topology& t_;
  std::vector<std::size_t> position_;
};

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

std::string mbit(double bytes_per_s) { return fmt::format("{:.0f} Mbit/s", bytes_per_s * 8 / 1e6); }

void validate(const PlanRequest& req) {
  if (!(req.state_bytes > 0)) throw ConfigError("plan: the model has no parameters to average");
  if (!(req.target_overhead > 0) || !std::isfinite(req.target_overhead))
    throw ConfigError(fmt::format(
        "plan: --target-overhead {} must be a positive fraction (e.g. 0.05)", req.target_overhead));
  if (!(req.beta1 > 0 && req.beta1 < 1 && req.beta2 > 0 && req.beta2 < 1))
    throw ConfigError("plan: optim.beta1 and optim.beta2 must lie in (0, 1) to derive Ku and Kv");
}

// The periods one mode chose, and what its explanation needs.
struct Periods {
  std::int64_t kx = 1, delay = 0;
  double overhead = 0;
  std::int64_t closed_kx = 0;  // blocking on noisy sites: the closed form's Kx, before the walk
  std::int64_t wire_kx = 0;    // whole delayed averages: the Kx the wire alone would allow
  std::int64_t whole_kx = 0;   // streaming: the whole-average plan's Kx (0 = none)
  std::optional<Streaming> streaming;
};

// One plan: the inputs derived once, then the ring (choose_ring), the periods of the request's
// mode (closed_form, delayed, streaming), and the reasons (explain_*) and config fragment.
class Planner {
 public:
  // `ring_of`: a plan of the same topology, state bytes, codecs and lanes whose ring and
  // candidates this one takes instead of choosing them again (the sub-plans a plan prices).
  Planner(const Topology& t, const PlanRequest& req, const Plan* ring_of = nullptr)
      : t_(t), req_(req), names_(t.site_names()), ring_of_(ring_of) {
    validate(req);
    for (const auto& s : t.sites) plan_.step_s = std::max(plan_.step_s, s.step_s);
    // Ku and Kv. Rule: Ku = 3 Kx (the paper's default). Kv / Ku = the ratio of the moments'
    // half-lives tau = ln 0.5 / ln beta, rounded and clamped to [2, 8]: v remembers longer than
    // u by that factor, so it can be averaged that much less often. beta1 = 0.9, beta2 = 0.95
    // give tau 6.6 and 13.5 steps, ratio 2: Kv = 6 Kx, the paper's default again.
    tau1_ = half_life(req.beta1);
    tau2_ = half_life(req.beta2);
    b_ = a_ * std::clamp<std::int64_t>(std::llround(tau2_ / tau1_), 2, 8);
    // Codecs: one "state average" below is the mean of x's, u's and v's weighted by how often
    // each comes (1, 1 / a, 1 / b per x window): encoded bytes on the ring plus codec time.
    ratio_ = weighted(req.wire_ratio);
    codec_s_ = names_.size() > 1 ? weighted(req.codec_s) : 0.0;
    bytes_ = req.state_bytes * ratio_;
    max_kx_ = std::max<std::int64_t>(
        1, std::min<std::int64_t>(req.steps, std::numeric_limits<std::int64_t>::max() / b_));
    noisy_ = names_.size() > 1 && std::any_of(t.sites.begin(), t.sites.end(),
                                              [](const auto& s) { return s.step_jitter > 0; });
  }

  Plan run() {
    if (ring_of_ != nullptr) {
      plan_.chosen = ring_of_->chosen;
      plan_.candidates = ring_of_->candidates;
    } else {
      choose_ring();
    }
    sync_ = plan_.chosen.seconds + codec_s_;
    const Periods p = req_.mode == PlanMode::kDelayed ? delayed() : closed_form();
    plan_.kx = p.kx;
    plan_.ku = a_ * p.kx;
    plan_.kv = b_ * p.kx;
    plan_.delay = p.delay;
    plan_.overhead = p.overhead;
    // Phases: u and v land a third and two thirds into an x window, never on an x step and
    // never on each other (Ku, Kv are multiples of Kx), so one sync is in flight at a time.
    if (p.kx >= 3) std::tie(plan_.phase_u, plan_.phase_v) = phases(p.kx);
    if (p.streaming) {  // between x's fragments instead
      plan_.phase_u = p.streaming->phase_u;
      plan_.phase_v = p.streaming->phase_v;
      plan_.fragments = p.streaming->fragments;
      plan_.fragments_u = p.streaming->fragments_u;
      plan_.fragments_v = p.streaming->fragments_v;
    }
    explain_inputs();
    explain_ring();
    explain_periods(p);
    explain_alternative_mode();
    explain_convergence();
    plan_.config_fragment = config_fragment();
    plan_.request = req_;
    return plan_;
  }

 private:
  double weighted(const std::array<double, 3>& per_state) const {
    return (per_state[0] + per_state[1] / double(a_) + per_state[2] / double(b_)) /
           (1.0 + 1.0 / double(a_) + 1.0 / double(b_));
  }
  double averages_per_window() const { return 1.0 + 1.0 / double(a_) + 1.0 / double(b_); }
  bool unbounded() const { return req_.mode == PlanMode::kUnbounded; }
  std::pair<std::int64_t, std::int64_t> phases(std::int64_t k) const {
    return req_.region_kx > 0 ? detail::third_phases(k, a_ * req_.region_kx, b_ * req_.region_kx)
                              : detail::third_phases(k);
  }
  // The least of from, from + m, from + 2m, ... below max_kx_ that `fits`, else the first of
  // them at or past max_kx_ (which the caller refuses when past). On steady sites the overhead
  // falls as the period grows, so the search gallops to a period that fits and bisects back:
  // about 2 log2 n simulations instead of n, each of which walks every site (a thousand sites
  // take a hundredth of a second per simulation).
  template <typename Fits>
  std::int64_t least_fitting(std::int64_t from, std::int64_t m, const Fits& fits) const {
    const std::int64_t last = from >= max_kx_ ? from : from + (max_kx_ - from + m - 1) / m * m;
    const auto ok = [&](std::int64_t k) { return k >= last || fits(k); };
    if (ok(from)) return from;
    std::int64_t bad = from, good = last;
    for (std::int64_t step = m; bad + step < last; step *= 2) {
      if (ok(bad + step)) {
        good = bad + step;
        break;
      }
      bad += step;
    }
    while (good - bad > m) {  // bad fails, good fits: bisect over the multiples of m between
      const std::int64_t mid = bad + (good - bad) / m / 2 * m;
      (ok(mid) ? good : bad) = mid;
    }
    return good;
  }
  // The simulated overhead of whole averages at period k, delayed by tau (0: blocking), with u
  // and v at the plan's phases.
  double simulated(std::int64_t k, std::int64_t tau) const {
    const auto [u, v] = k >= 3 ? phases(k) : std::pair<std::int64_t, std::int64_t>{0, 0};
    return detail::simulated_overhead(t_, req_, plan_.chosen,
                                      {SyncMethod::kDesloc, k, a_ * k, b_ * k, 0, u, v}, tau);
  }
  std::string sync_facts() const {
    return fmt::format("one sync of {:.2f} MB over the {} takes {:.3g} s against a {:.1f} ms step",
                       bytes_ / 1e6, plan_.chosen.describe(), sync_, plan_.step_s * 1e3);
  }
  // A target that needs Kx beyond train.steps (or beyond what Kv = b Kx can hold).
  ConfigError unmeetable(const std::string& needed) const {
    const double at_max =
        overhead(sync_, plan_.step_s, max_kx_, a_ * max_kx_, b_ * max_kx_, unbounded());
    return ConfigError(fmt::format(
        "plan: a communication overhead of {:.3g}% (--target-overhead {:g}) needs Kx >= {}, but "
        "train.steps = {}; at Kx = {} the overhead would be {:.3g}% ({}; slowest link {}). Raise "
        "the target, train longer, or use faster links",
        100 * req_.target_overhead, req_.target_overhead, needed, req_.steps, max_kx_, 100 * at_max,
        sync_facts(), fmt::format("{:.3g} Mbit/s", plan_.chosen.bottleneck_bps * 8 / 1e6)));
  }

  void choose_ring();
  Periods closed_form() const;
  Periods delayed() const;
  std::optional<Streaming> streaming(double steal_kx, Periods& whole) const;
  Periods whole_delayed(double steal_kx) const;
  void explain_inputs();
  void explain_ring();
  void explain_periods(const Periods& p);
  void explain_alternative_mode();
  void explain_convergence();
  std::string config_fragment() const;

  const Topology& t_;
  const PlanRequest& req_;
  const std::vector<std::string> names_;
  std::int64_t a_ = 3, b_ = 6;  // Ku = a Kx, Kv = b Kx
  double tau1_ = 0, tau2_ = 0;  // the moments' half-lives
  double ratio_ = 1;            // wire bytes per fp32 byte, weighted over x, u and v
  double codec_s_ = 0;          // codec seconds per state average, weighted
  double bytes_ = 0;            // one state average's bytes on the wire
  double sync_ = 0;             // one state average over the chosen ring, codec included
  std::int64_t max_kx_ = 1;
  bool noisy_ = false;  // the sites' steps swing (step_jitter)
  const Plan* ring_of_ = nullptr;
  Plan plan_;
};

// Rings: the first site fixed (rotations are the same ring), every order of the rest. Sites
// beyond 9 would make (n-1)! too large; then the order is improved greedily. The order is
// chosen at the even split; then its lanes are weighed by capacity. Beside it, the candidates
// that show what each choice buys: the config's order, the even split, one lane, every star.
void Planner::choose_ring() {
  const auto& names = names_;
  const double P = bytes_;
  const LinkMatrix m(t_, names);
  std::vector<std::string> order = names;
  const int L = names.size() >= 3 ? req_.lanes : 1;
  Schedule best_ring{
      "ring", order, L, 0.5, ring_seconds(t_, order, P, L), bottleneck(t_, order, L)};
  if (names.size() <= 9) {
    std::vector<std::string> rest(names.begin() + 1, names.end());
    std::sort(rest.begin(), rest.end());
    do {
      std::vector<std::string> o{names[0]};
      o.insert(o.end(), rest.begin(), rest.end());
      const double secs = ring_seconds(t_, o, P, L);
      if (secs < best_ring.seconds - 1e-12)
        best_ring = {"ring", o, L, 0.5, secs, bottleneck(t_, o, L)};
    } while (std::next_permutation(rest.begin(), rest.end()));
  } else {
    // Nearest-fastest-neighbour: from each site, go to the unvisited site with the fastest link.
    std::vector<std::size_t> left(names.size() - 1);
    std::iota(left.begin(), left.end(), 1);
    std::vector<std::string> o{names[0]};
    for (std::size_t at = 0; !left.empty();) {
      auto it = std::max_element(left.begin(), left.end(), [&](std::size_t x, std::size_t y) {
        return m.at(at, x).bandwidth_bps < m.at(at, y).bandwidth_bps;
      });
      at = *it;
      o.push_back(names[at]);
      left.erase(it);
    }
    best_ring = {"ring", o, L, 0.5, ring_seconds(t_, o, P, L), bottleneck(t_, o, L)};
  }
  const Schedule even_ring = best_ring;
  if (L == 2) {
    best_ring.lane_share = balanced_lane_share(t_, best_ring.order, P);
    best_ring.seconds = ring_seconds(t_, best_ring.order, P, L, best_ring.lane_share);
  }
  plan_.chosen = best_ring;
  plan_.candidates.push_back(best_ring);
  if (names.size() <= 1) return;
  const double share = L == 2 ? balanced_lane_share(t_, names, P) : 0.5;
  Schedule config_ring{
      "ring", names, L, share, ring_seconds(t_, names, P, L, share), bottleneck(t_, names, L)};
  if (config_ring.order != best_ring.order) plan_.candidates.push_back(config_ring);
  if (best_ring.lane_share != 0.5) plan_.candidates.push_back(even_ring);  // what weighing buys
  if (L == 2)  // what the second lane buys
    plan_.candidates.push_back({"ring", best_ring.order, 1, 0.5,
                                ring_seconds(t_, best_ring.order, P, 1),
                                bottleneck(t_, best_ring.order, 1)});
  // Every star, priced as star_seconds does, over the links looked up once.
  for (std::size_t r = 0; r < names.size(); ++r) {
    double b = std::numeric_limits<double>::infinity(), in = 0, out = 0;
    for (std::size_t s = 0; s < names.size(); ++s) {
      if (s == r) continue;
      const LinkProfile &up = m.at(s, r), &down = m.at(r, s);
      b = std::min({b, up.bandwidth_bps, down.bandwidth_bps});
      in = std::max(in, up.transfer_seconds(P));
      out = std::max(out, down.transfer_seconds(P));
    }
    plan_.candidates.push_back({"star", {names[r]}, 1, 0.5, in + out, b});
  }
}

// Blocking and the unbounded what-if: the closed form, then a check. overhead() falls as Kx
// grows like 1 / Kx: start from the closed form and correct it by a step or two. A target that
// needs Kx beyond max_kx is refused from the closed form, never walked to: a link of 1e-17
// Mbit/s or a target of 1e-30 would need about 1e20 steps of walking.
Periods Planner::closed_form() const {
  Periods p;
  if (!(sync_ > 0)) return p;
  const bool over = unbounded();
  const double step = plan_.step_s;
  const auto cost = [&](std::int64_t k) { return overhead(sync_, step, k, a_ * k, b_ * k, over); };
  const double need = sync_ * averages_per_window() /
                      (step * (over ? 1.0 + req_.target_overhead : req_.target_overhead));
  if (!(need - 1e-9 <= static_cast<double>(max_kx_)))
    throw unmeetable(need < 1e15 ? fmt::format("{:.0f}", std::ceil(need - 1e-9))
                                 : fmt::format("{:.3g}", need));
  std::int64_t kx = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(need - 1e-9)));
  while (kx > 1 && cost(kx - 1) <= req_.target_overhead) --kx;
  while (kx <= max_kx_ && cost(kx) > req_.target_overhead) ++kx;
  // Where the sites' steps swing (step_jitter), every blocking average also waits for the
  // slowest site to arrive, which the closed form cannot see: on from there while the
  // simulated overhead misses the target, 2% of Kx at a time (a Kx in the thousands would
  // otherwise be walked one step at a time, each simulated over 2 Kv + Kx steps).
  if (!over && noisy_) {
    p.closed_kx = kx;
    while (kx <= max_kx_ && simulated(kx, 0) > req_.target_overhead)
      kx = std::max(kx + 1, static_cast<std::int64_t>(std::ceil(double(kx) * 1.02)));
  }
  if (kx > max_kx_) throw unmeetable(std::to_string(kx));
  p.kx = kx;
  p.overhead = p.closed_kx > 0 ? simulated(kx, 0) : cost(kx);
  return p;
}

// Delayed averages: no Kx below the steal's floor fits the target, whatever the wire does.
// Then the whole-average plan and any streaming plan that beats it (--fragments 0), the
// streaming plan alone (--fragments P > 1), or whole averages alone (--fragments 1).
Periods Planner::delayed() const {
  const double steal_kx = names_.size() > 1
                              ? detail::steal_floor_kx(t_, plan_.step_s, bytes_, codec_s_,
                                                       averages_per_window(), req_.target_overhead)
                              : 0.0;
  if (!(steal_kx <= static_cast<double>(max_kx_))) {
    const SiteProfile& thief = detail::most_steal(t_);
    throw ConfigError(fmt::format(
        "plan: the compute that overlapped averages take (steal up to {:.3g} ms per MB sent, "
        "site {}; {:.3f} s of codec work per average) needs Kx >= {:.3g} for an overhead of "
        "{:.3g}% (--target-overhead {:g}), but train.steps = {}; raise the target, train "
        "longer, or send fewer bytes per average (--codecs auto)",
        thief.steal_s_per_byte * 1e9, thief.name, codec_s_, std::ceil(steal_kx),
        100 * req_.target_overhead, req_.target_overhead, req_.steps));
  }
  if (sync_ > 0 && req_.fragments != 1) {
    Periods p;
    if ((p.streaming = streaming(steal_kx, p))) {
      p.kx = p.streaming->kx;
      p.delay = p.streaming->tau;
      p.overhead = p.streaming->overhead;
      return p;
    }
  }
  if (sync_ > 0) return whole_delayed(steal_kx);
  Periods p;
  p.overhead = simulated(1, 0);
  return p;
}

// The streaming search between the least Kx the link's load allows and, without --fragments,
// the whole-average plan's score; nullopt where whole averages are the better plan. Throws
// where the request leaves no plan at all.
std::optional<Streaming> Planner::streaming(double steal_kx, Periods& out) const {
  std::optional<ConfigError> whole_error;
  PlanRequest whole = req_;
  whole.fragments = 1;
  // Past --max-delay the whole plan throws too (it carries max_delay): no candidate, so every
  // Kx is searched for a streaming one.
  std::int64_t whole_tau = 0;
  try {
    const Plan w = Planner(t_, whole, &plan_).run();
    out.whole_kx = w.kx;
    whole_tau = w.delay;
  } catch (const ConfigError& e) {
    whole_error = e;
  }
  const std::int64_t whole_kx = out.whole_kx;
  const double load = sync_ * averages_per_window() / plan_.step_s;
  const auto lowest = static_cast<std::int64_t>(std::ceil(std::max(load, steal_kx) - 1e-9));
  // Without --fragments, only a streaming plan that scores below the whole one (Kx + the
  // delay's weight times tau, tau >= 1) replaces it.
  const std::int64_t highest =
      req_.fragments > 1 || whole_kx == 0
          ? std::min<std::int64_t>(max_kx_, 4096)
          : std::min<std::int64_t>(
                max_kx_, static_cast<std::int64_t>(
                             std::ceil(delay_score(whole_kx, whole_tau, req_.delay_weight) -
                                       req_.delay_weight - 1e-9)) -
                             1);
  std::optional<Streaming> s =
      detail::plan_streaming(t_, req_, plan_.chosen, plan_.step_s, a_, b_, lowest, highest);
  if (s && whole_kx > 0 && req_.fragments == 0 &&
      delay_score(s->kx, s->tau, req_.delay_weight) >=
          delay_score(whole_kx, whole_tau, req_.delay_weight))
    s.reset();
  if (!s && req_.fragments > 1)
    throw ConfigError(fmt::format(
        "plan: no Kx up to {} hides averages of {} fragments within {:.3g}% ({}); try another "
        "--fragments, a larger --target-overhead, or drop --fragments to let the planner "
        "choose",
        highest, req_.fragments, 100 * req_.target_overhead, sync_facts()));
  if (!s && req_.max_delay > 0 && whole_kx == 0)
    throw ConfigError(fmt::format(
        "plan: no Kx up to {} hides the averages with a delay of at most {} steps (--max-delay) "
        "within {:.3g}% ({}; a batch must leave the wire within max-delay + 1 steps); allow a "
        "longer delay or a larger --target-overhead",
        highest, req_.max_delay, 100 * req_.target_overhead, sync_facts()));
  if (!s && whole_error) throw *whole_error;
  return s;
}

// Whole delayed averages: tau from the time one takes on the wire after its control exchange,
// Kx so that the three a third of a window apart each leave before the next starts; then, as
// no delay hides the communication's CPU (the sites' steal, the codec's work), the period grows
// from the least Kx that could pay it until the simulated overhead is within target.
Periods Planner::whole_delayed(double steal_kx) const {
  Periods p;
  const double exchange = exchange_seconds(t_, plan_.chosen.order);
  const double steps_per_sync = (exchange + sync_) * (1.0 + req_.target_overhead) / plan_.step_s;
  if (!(steps_per_sync * 3 + 3 <= static_cast<double>(max_kx_)))
    throw unmeetable(fmt::format("{:.0f}", std::ceil(3 * steps_per_sync)));
  p.delay = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(steps_per_sync)) - 1);
  std::int64_t kx = std::max<std::int64_t>(
      {p.delay + 1, 3 * static_cast<std::int64_t>(std::ceil(steps_per_sync)), 3});
  if (req_.max_delay > 0 && p.delay > req_.max_delay && req_.fragments == 1)
    throw ConfigError(fmt::format(
        "plan: whole delayed averages need a delay of {} steps (one sync of {:.3g} s against a "
        "{:.1f} ms step), above --max-delay {}; drop --fragments 1 to let fragments shorten it",
        p.delay, sync_, plan_.step_s * 1e3, req_.max_delay));
  p.wire_kx = kx;
  kx = std::max(kx, static_cast<std::int64_t>(std::ceil(steal_kx - 1e-9)));
  const std::int64_t m = detail::kx_multiple(req_);
  kx = (kx + m - 1) / m * m;
  const auto fits = [&](std::int64_t k) {
    return simulated(k, p.delay) <= detail::overhead_budget(req_);
  };
  // Noisy steps make the overhead swing from one period to the next (each simulation draws
  // them): there the walk goes up one multiple at a time, so that the least period that fits is
  // the one chosen.
  if (noisy_)
    while (kx < max_kx_ && !fits(kx)) kx += m;
  else
    kx = least_fitting(kx, m, fits);
  if (kx > max_kx_) throw unmeetable(std::to_string(kx));
  p.kx = kx;
  p.overhead = simulated(kx, p.delay);
  return p;
}

void Planner::explain_inputs() {
  auto& e = plan_.explanation;
  e.push_back(fmt::format(
      "inputs: {} sites, state of {:.2f} MB (x, u and v each), slowest "
      "compute step {:.1f} ms, target overhead {:.1f}%{}",
      names_.size(), bytes_ / 1e6, plan_.step_s * 1e3, 100 * req_.target_overhead,
      req_.mode == PlanMode::kDelayed ? " (delayed averages, sync.overlap = \"delayed\")"
      : unbounded()                   ? " (syncs overlapped with compute)"
                                      : " (blocking syncs)"));
  if (ratio_ != 1.0 || codec_s_ > 0)
    e.push_back(fmt::format(
        "codecs: {}; on the wire {:.3f}x of fp32 (x {:.3f}x, u {:.3f}x, v {:.3f}x, weighted 1, "
        "1/{}, 1/{}), plus {:.3f} s of codec work per average",
        req_.codec_keys.empty() ? std::string("as given") : one_line(req_.codec_keys), ratio_,
        req_.wire_ratio[0], req_.wire_ratio[1], req_.wire_ratio[2], a_, b_, codec_s_));
  if (const SiteProfile& thief = detail::most_steal(t_);
      thief.steal_s_per_byte > 0 && req_.mode != PlanMode::kBlocking)
    e.push_back(fmt::format(
        "steal: overlapped averages take compute from the sites, up to {:.2f} ms per MB sent "
        "(site {}; desloc profile measures it): {:.1f} ms per x average of this ring",
        thief.steal_s_per_byte * 1e9, thief.name,
        thief.steal_s_per_byte * site_bytes(bytes_, names_.size()) * 1e3));
  if (const auto noisiest = std::max_element(
          t_.sites.begin(), t_.sites.end(),
          [](const auto& x, const auto& y) { return x.step_jitter < y.step_jitter; });
      !unbounded() && noisy_)
    e.push_back(fmt::format(
        "noise: the sites' steps swing, up to sd {:.2f} of ln step time (site {}; desloc "
        "profile measures it); the overhead is simulated with every step drawn from it, so "
        "that every average waits for the slowest site to reach its step",
        noisiest->step_jitter, noisiest->name));
}

void Planner::explain_ring() {
  auto& e = plan_.explanation;
  for (const auto& c : plan_.candidates)
    e.push_back(fmt::format("candidate {}: {:.3f} s per all-reduce, slowest link {}", c.describe(),
                            c.seconds, mbit(c.bottleneck_bps)));
  e.push_back(fmt::format("schedule: {} ({:.3f} s): it maximises the slowest ring link ({})",
                          plan_.chosen.describe(), sync_, mbit(plan_.chosen.bottleneck_bps)));
  const auto fastest =
      std::min_element(plan_.candidates.begin(), plan_.candidates.end(),
                       [](const auto& x, const auto& y) { return x.seconds < y.seconds; });
  if (fastest->kind == "star")
    e.push_back(fmt::format(
        "note: a {} would take {:.3f} s ({:.0f}% less); desloc's transport runs rings only, so "
        "the plan uses the best ring",
        fastest->describe(), fastest->seconds, 100 * (1 - fastest->seconds / sync_)));
  e.push_back(
      fmt::format("Ku = 3 Kx; Kv = {} Kx: half-lives tau1 = {:.1f}, tau2 = {:.1f} steps, "
                  "Kv / Ku = round(tau2 / tau1) clamped to [2, 8] = {}",
                  b_, tau1_, tau2_, b_ / a_));
}

void Planner::explain_periods(const Periods& p) {
  auto& e = plan_.explanation;
  const std::int64_t kx = plan_.kx;
  const double target = 100 * req_.target_overhead;
  if (p.streaming) {
    const Streaming& s = *p.streaming;
    e.push_back(fmt::format(
        "streaming: {} fragments of x ({:.2f} MB, {:.3f} s per all-reduce){}; x's fragments "
        "every {} steps, u's at phase {} and v's at {}; the largest batch due at one step "
        "({:.3f} s, +{:.0f}% margin) leaves the wire within tau + 1 = {} steps of {:.1f} ms; "
        "Kx = {}, simulated overhead {:.2f}% (within {:.1f}%){}",
        s.fragments, bytes_ / s.fragments / 1e6, s.fragment_s,
        s.fragments_u > 0
            ? fmt::format(", {} of u and {} of v (one of each on every x fragment's step)",
                          s.fragments_u, s.fragments_v)
            : ", as many of u and v",
        kx / s.fragments, s.phase_u, s.phase_v, s.batch_s, target, plan_.delay + 1,
        plan_.step_s * 1e3, kx, 100 * plan_.overhead, 100 * detail::overhead_budget(req_),
        p.whole_kx > 0 ? fmt::format("; whole averages would need Kx = {}", p.whole_kx)
                       : "; whole averages cannot meet the target"));
    e.push_back(fmt::format(
        "delay against period: Kx + {:g} tau = {:g} (--delay-weight: a step of delay costs the "
        "model about {:g} steps of period){}",
        req_.delay_weight, delay_score(kx, plan_.delay, req_.delay_weight), req_.delay_weight,
        s.least_kx > 0 ? fmt::format("; the least Kx, {} with tau = {}, scores {:g}", s.least_kx,
                                     s.least_kx_tau,
                                     delay_score(s.least_kx, s.least_kx_tau, req_.delay_weight))
                       : "; no other Kx scores lower"));
  } else if (plan_.delay > 0) {
    e.push_back(fmt::format(
        "delay tau = {}: an average of {:.3f} s after its control exchange ({:.1f} ms, on the "
        "communication thread) leaves the wire within tau + 1 = {} steps of {:.1f} ms (+{:.0f}% "
        "margin); Kx = {}: the averages a third of a window apart ({} steps) each finish before "
        "the next starts, tau < Kx{}; simulated overhead {:.2f}% (within {:.1f}%)",
        plan_.delay, sync_, exchange_seconds(t_, plan_.chosen.order) * 1e3, plan_.delay + 1,
        plan_.step_s * 1e3, target, kx, kx / 3,
        kx > p.wire_kx
            ? fmt::format(
                  " (the wire alone would allow Kx = {}; the simulated overhead, the sites' steal "
                  "included, needs {})",
                  p.wire_kx, kx)
            : std::string(),
        100 * plan_.overhead, 100 * detail::overhead_budget(req_)));
  } else if (p.closed_kx > 0) {
    e.push_back(fmt::format(
        "Kx = {}: the overhead T_sync (1/Kx + 1/Ku + 1/Kv) / step is within {:.1f}% from Kx = {} "
        "on; with every step drawn from the sites' noise (every average waits for the slowest "
        "site) Kx grew from there 2% at a time to {}, simulated at {:.2f}%",
        kx, target, p.closed_kx, kx, 100 * plan_.overhead));
  } else {
    const std::int64_t less = std::max<std::int64_t>(1, kx - 1);
    e.push_back(fmt::format(
        "Kx = {}: the smallest period whose overhead T_sync (1/Kx + 1/Ku + 1/Kv) / step = {:.2f}% "
        "is within {:.1f}% (Kx = {} would give {:.2f}%)",
        kx, 100 * plan_.overhead, target, less,
        100 * overhead(sync_, plan_.step_s, less, a_ * less, b_ * less, unbounded())));
  }
  if (p.streaming)
    e.push_back(fmt::format("phases: x at 0, u at {}, v at {}", plan_.phase_u, plan_.phase_v));
  else
    e.push_back(fmt::format("phases: x at 0, u at {}, v at {}: no two averages on one step",
                            plan_.phase_u, plan_.phase_v));
}

// A blocking plan says what delayed (streaming) averages would allow instead.
void Planner::explain_alternative_mode() {
  if (req_.mode != PlanMode::kBlocking || !(sync_ > 0)) return;
  PlanRequest d = req_;
  d.mode = PlanMode::kDelayed;
  try {
    const Plan alt = Planner(t_, d, &plan_).run();
    if (alt.kx < plan_.kx)
      plan_.explanation.push_back(fmt::format(
          "mode: blocking averages need Kx = {}; delayed averages (`desloc plan --delayed`) "
          "would hide them at Kx = {} with tau = {}{}",
          plan_.kx, alt.kx, alt.delay,
          alt.fragments > 1 ? fmt::format(" in {} fragments (streaming)", alt.fragments) : ""));
  } catch (const ConfigError&) {
    plan_.explanation.push_back(
        "mode: delayed averages (`desloc plan --delayed`) cannot meet the target either");
  }
}

// The periods against what the paper validated, and how often the sites meet.
void Planner::explain_convergence() {
  const auto times = [&](std::int64_t k) {
    return req_.steps > 0 ? fmt::format("{}", req_.steps / k) : std::string("?");
  };
  plan_.explanation.push_back(fmt::format(
      "convergence: Kx = {}, Ku = {}, Kv = {} ({} the validated Kx <= {} with Ku = 3 Kx, Kv = 6 "
      "Kx); over train.steps = {} the sites average x {} times, u {} and v {}",
      plan_.kx, plan_.ku, plan_.kv, plan_.kx <= kValidatedKx ? "within" : "beyond", kValidatedKx,
      req_.steps, times(plan_.kx), times(plan_.ku), times(plan_.kv)));
  if (plan_.kx > kValidatedKx)
    plan_.warnings.push_back(fmt::format(
        "Kx = {} is beyond the periods DES-LOC's convergence was shown at (Kx <= {}): the sites "
        "average their parameters {} times in {} steps and train nearly alone. Shorter periods "
        "need fewer bytes per average (--codecs auto), averages that overlap compute "
        "(--delayed), or both (--auto); or a larger --target-overhead",
        plan_.kx, kValidatedKx, times(plan_.kx), req_.steps));
}

std::string quoted_names(const std::vector<std::string>& names) {
  std::vector<std::string> q;
  for (const auto& s : names) q.push_back("\"" + s + "\"");
  return fmt::format("{}", fmt::join(q, ", "));
}

// [sync], [job] and [transport] keys that launch and worker accept; with regions, the
// hierarchical keys too.
std::string Planner::config_fragment() const {
  const Plan& plan = plan_;
  std::string delayed_keys;
  if (plan.delay > 0) {
    delayed_keys = fmt::format("overlap = \"delayed\"\ndelay = {}\n", plan.delay);
    if (plan.fragments > 1) delayed_keys += fmt::format("fragments = {}\n", plan.fragments);
    if (plan.fragments_u > 0)
      delayed_keys +=
          fmt::format("fragments_u = {}\nfragments_v = {}\n", plan.fragments_u, plan.fragments_v);
  }
  std::string region_keys, regions;
  if (req_.region_kx > 0) {
    region_keys = fmt::format("region_kx = {}\nregion_ku = {}\nregion_kv = {}\n", req_.region_kx,
                              a_ * req_.region_kx, b_ * req_.region_kx);
    std::vector<std::string> q;
    for (const auto& g : req_.regions) q.push_back(fmt::format("[{}]", quoted_names(g)));
    regions = fmt::format("regions = [{}]\n", fmt::join(q, ", "));
  }
  return fmt::format(
      "# from `desloc plan`: {}, predicted overhead {:.2f}%\n[sync]\nmethod = \"desloc\"\n"
      "kx = {}\nku = {}\nkv = {}\nphase_x = 0\nphase_u = {}\nphase_v = {}\n{}{}{}\n[job]\n"
      "sites = [{}]  # the ring order\n{}\n[transport]\nlanes = {}\n{}",
      plan.chosen.describe(), 100 * plan.overhead, plan.kx, plan.ku, plan.kv, plan.phase_u,
      plan.phase_v, delayed_keys, region_keys,
      req_.codec_keys.empty() ? "" : req_.codec_keys + "\n", quoted_names(plan.chosen.order),
      regions, plan.chosen.lanes,
      plan.chosen.lane_share != 0.5
          ? fmt::format(
                "lane_share = {:.2f}  # of each shard on the ring; the rest on its reverse\n",
                plan.chosen.lane_share)
          : "");
}

}  // namespace

Plan make_plan(const Topology& t, const PlanRequest& req) { return Planner(t, req).run(); }

RegionPlan plan_regions(const Topology& t, const Plan& flat,
                        const std::vector<std::vector<std::string>>& regions) {
  const PlanRequest& req = flat.request;
  RegionPlan r;
  r.regions = regions;
  std::string slowest;
  for (const auto& g : regions) {
    // Both lanes in a region of three sites or more, at the share the job-wide ring takes (the
    // trainer splits every ring alike, transport.lane_share).
    const double secs = ring_seconds(t, g, req.state_bytes, req.lanes, flat.chosen.lane_share);
    if (secs > r.region_seconds || slowest.empty()) {
      r.region_seconds = secs;
      slowest = describe_regions({g});
    }
  }
  // Ku = 3 Kx and Kv = 6 Kx inside the regions too: T (1 + 1/3 + 1/6) / (Kx step) <= target.
  const double target = req.target_overhead;
  const double window = 1.5 * r.region_seconds / (target * flat.step_s);
  r.region_kx = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(window - 1e-9)));
  r.region_overhead =
      overhead(r.region_seconds, flat.step_s, r.region_kx, 3 * r.region_kx, 6 * r.region_kx, false);
  r.worthwhile = r.region_kx < flat.kx;
  r.kx = (flat.kx + r.region_kx - 1) / r.region_kx * r.region_kx;
  const std::string inside = fmt::format(
      "hierarchical: regions {}: the slowest region's ring ({}) averages a state in {:.3f} s, so "
      "inside the regions Kx = {} (Ku {}, Kv {}) costs {:.2f}% at the {:.1f}% target",
      describe_regions(regions), slowest, r.region_seconds, r.region_kx, 3 * r.region_kx,
      6 * r.region_kx, 100 * r.region_overhead, 100 * target);
  if (req.mode == PlanMode::kDelayed && r.worthwhile) {
    // The job-wide averages planned again with the regions' averages in the simulation, their
    // Kx a multiple of the regions' and their phases within the regions' periods.
    PlanRequest h = req;
    h.regions = regions;
    h.region_kx = r.region_kx;
    h.region_overhead = r.region_overhead;
    try {
      r.plan = Planner(t, h, &flat).run();
      r.kx = r.plan->kx;
      r.explanation.push_back(fmt::format(
          "{}; the job-wide averages, delayed{}, planned again with the regions' averages "
          "simulated at the step's start: Kx = {} (a multiple of {}), tau = {}, simulated "
          "overhead {:.2f}% for both levels (within {:.1f}% + the regions' {:.2f}%)",
          inside,
          r.plan->fragments > 1 ? fmt::format(" in {} fragments", r.plan->fragments)
                                : std::string(),
          r.plan->kx, r.region_kx, r.plan->delay, 100 * r.plan->overhead, 100 * target,
          100 * r.region_overhead));
      r.config_fragment = r.plan->config_fragment;
    } catch (const ConfigError& e) {
      r.explanation.push_back(fmt::format(
          "{}; no delayed job-wide plan fits beside them (the simulation counts the regions' "
          "averages, each waiting for its region's slowest site): {}",
          inside, e.message()));
    }
    return r;
  }
  r.explanation.push_back(fmt::format(
      "{}; the job-wide averages keep Kx = {} (the flat plan's {} rounded up to a multiple of "
      "{}), about {:.2f}% more overhead in all",
      inside, r.kx, flat.kx, r.region_kx, 100 * r.region_overhead));
  if (!r.worthwhile)
    r.explanation.push_back(fmt::format(
        "hierarchical: not worth it here: the regions could average no more often than the flat "
        "plan does (Kx {} inside against {})",
        r.region_kx, flat.kx));
  std::vector<std::string> quoted;
  for (const auto& g : regions) quoted.push_back(fmt::format("[{}]", quoted_names(g)));
  r.config_fragment = fmt::format(
      "# hierarchical DES-LOC (docs/sync.md): set these beside the fragment above\n"
      "[sync]\nkx = {}\nku = {}\nkv = {}\nphase_u = 0\nphase_v = 0\nregion_kx = {}\n[job]\n"
      "regions = [{}]\n",
      r.kx, 3 * r.kx, 6 * r.kx, r.region_kx, fmt::join(quoted, ", "));
  return r;
}

}  // namespace desloc::topology
