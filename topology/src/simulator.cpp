// The discrete-event job model: one step function per overlap mode (simulator.hpp).
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

// What one average costs, priced once from the topology.
struct Prices {
  // With fragments every average carries 1/P of its state (P by state: x, u, v).
  std::array<int, 3> parts{1, 1, 1};
  std::array<double, 3> sync{};             // seconds of one job-wide average of x, u, v
  std::array<double, 3> per_state_bytes{};  // the bytes a site sends for it
  double grad_sync = 0, grad_bytes = 0;     // the gradient (DDP) travels whole
  // The control exchange of delayed averages: an all-gather of a few bytes, half a ring
  // all-reduce's hops.
  double exchange = 0;
};

// Regions: each region's sites (indices into t.sites) and its seconds and bytes per site for
// one average of state k over its own ring, whole and in fp32 (the codecs compress the
// job-wide averages only).
struct Region {
  std::vector<std::size_t> sites;
  std::array<double, 3> seconds{}, bytes{};
};

// Where a step's region averages fall: after the sites' compute (blocking), under it (the
// step overlap, when no job-wide average is due), or before it (delayed averages: the regions
// average at the step's start, before the job-wide averages take their snapshots).
enum class Placement { kAfterCompute, kUnderCompute, kBeforeCompute };

// The job-wide averages due at one step.
struct Due {
  SyncDecision decision;
  int states = 0;
  std::array<bool, 3> kinds{};
  double cost = 0, bytes = 0;
};

class Simulation {
 public:
  Simulation(const Topology& t, const SimJob& job);
  void step(std::int64_t step);
  // The last step of the run of quiet steps from `step` on (step - 1 when `step` is not quiet).
  // A quiet step only adds each site's compute to its clock: no average is due at either level,
  // no fold, no steal from an earlier average, and the sites' steps do not swing, so the run
  // can be taken at once (advance), as most of a long period is.
  std::int64_t quiet_until(std::int64_t step) const;
  void advance(std::int64_t steps);
  SimResult result();

 private:
  void check() const;
  void price();
  double step_of(std::size_t s) const { return t_.sites[s].step_s; }
  Due due_at(std::int64_t step) const;
  // Each site's compute for the step (jitter drawn in site order), with what overlapped
  // averages steal from it; adds the step's steals of `due` first.
  const std::vector<double>& compute_step(std::int64_t step, const Due& due);
  // The averages due only inside the regions at `step`: each region over its own ring, only
  // its sites waiting for each other. dts is added by the caller.
  void region_averages(std::int64_t step, const Due& due, const std::vector<double>& dts,
                       Placement where);
  void blocking(const Due& due, const std::vector<double>& dts);
  void step_overlap(const Due& due, const std::vector<double>& dts);
  void delayed(std::int64_t step, const Due& due, const std::vector<double>& dts);
  void unbounded(const Due& due, const std::vector<double>& dts);

  const Topology& t_;
  const SimJob& job_;
  std::vector<std::string> ring_;
  std::size_t n_;
  bool regional_ = false;
  bool overlapped_ = false;  // averages that run under compute also take CPU from it
  Prices p_;
  std::vector<Region> regions_;
  std::vector<double> clock_, compute_, jitter_;
  std::vector<double> dts_;  // compute_step's answer, kept from step to step
  std::mt19937_64 gen_;
  std::normal_distribution<double> noise_{0.0, 1.0};
  SimResult r_;
  double link_free_ = 0.0;      // when the previous all-reduce (or delayed batch) finishes
  std::vector<double> waited_;  // by site
  double stolen_ = 0.0;
  std::vector<Fold> folds_;
  std::vector<std::vector<Steal>> steals_;
  std::int64_t steals_until_ = 0;  // the last step any steal in steals_ takes from
  bool steady_ = true;             // no site's step swings (jitter 0 everywhere)
};

Simulation::Simulation(const Topology& t, const SimJob& job)
    : t_(t),
      job_(job),
      ring_(job.ring.empty() ? t.site_names() : job.ring),
      n_(t.sites.size()),
      regional_(!job.regions.empty() && averages_params(job.schedule.method)),
      overlapped_(job.delayed() || job.mode == Overlap::kStep || job.overlap),
      clock_(n_, 0.0),
      compute_(n_, 0.0),
      jitter_(n_),
      dts_(n_),
      gen_(job.seed),
      waited_(n_, 0.0),
      steals_(n_) {
  check();
  price();
  for (std::size_t s = 0; s < n_; ++s) {
    jitter_[s] = job.jitter.value_or(t.sites[s].step_jitter);
    steady_ = steady_ && !(jitter_[s] > 0);
  }
}

void Simulation::check() const {
  const SyncSchedule& plan = job_.schedule;
  if (job_.steps < 1) throw ConfigError("simulate: steps must be >= 1");
  if (averages_params(plan.method) &&
      (plan.kx < 1 || (plan.method == SyncMethod::kDesloc && (plan.ku < 1 || plan.kv < 1))))
    throw ConfigError("simulate: the periods kx, ku and kv must be >= 1");
  if (!job_.switches.empty() && plan.fragments > 1)
    throw ConfigError("simulate: period switches are modelled with whole-state averages only");
  if (regional_ && job_.overlap)
    throw ConfigError("simulate: regions are not modelled with the unbounded overlap");
  if (regional_ && plan.fragments > 1 && !job_.delayed())
    throw ConfigError(
        "simulate: with regions, fragments are modelled with delayed averages only (as the "
        "trainer runs them)");
}

void Simulation::price() {
  const SyncSchedule& plan = job_.schedule;
  p_.parts = {std::max(1, plan.fragments), std::max(1, plan.parts_u()),
              std::max(1, plan.parts_v())};
  for (std::size_t k = 0; k < 3; ++k) {
    const double bytes = job_.state_bytes * job_.wire_ratio[k] / double(p_.parts[k]);
    p_.sync[k] = ring_seconds(t_, ring_, bytes, job_.lanes, job_.lane_share) +
                 (n_ > 1 ? job_.codec_s[k] / double(p_.parts[k]) : 0.0);
    p_.per_state_bytes[k] = site_bytes(bytes, n_);
  }
  p_.grad_sync = ring_seconds(t_, ring_, job_.state_bytes, job_.lanes, job_.lane_share);
  p_.grad_bytes = site_bytes(job_.state_bytes, n_);
  p_.exchange = job_.delayed() ? exchange_seconds(t_, ring_) : 0.0;
  for (const auto& names : regional_ ? job_.regions : std::vector<std::vector<std::string>>{}) {
    Region g;
    for (const auto& name : names)  // throws naming a site the topology lacks
      g.sites.push_back(t_.site_index(name));
    for (std::size_t k = 0; k < 3; ++k) {
      g.seconds[k] = ring_seconds(t_, names, job_.state_bytes, job_.lanes, job_.lane_share);
      g.bytes[k] = site_bytes(job_.state_bytes, names.size());
    }
    regions_.push_back(std::move(g));
  }
}

Due Simulation::due_at(std::int64_t step) const {
  Due d;
  d.decision = job_.schedule_at(step).at(step);
  d.states = n_ < 2 ? 0 : d.decision.states();
  d.kinds = {d.decision.x, d.decision.u, d.decision.v};
  if (d.states == 0) return d;
  for (std::size_t k = 0; k < 3; ++k)
    if (d.kinds[k]) {
      d.cost += p_.sync[k];
      d.bytes += p_.per_state_bytes[k];
    }
  if (d.decision.grad) {
    d.cost += p_.grad_sync;
    d.bytes += p_.grad_bytes;
  }
  return d;
}

const std::vector<double>& Simulation::compute_step(std::int64_t step, const Due& due) {
  // Overlapped averages take CPU from the compute: steal per byte times the bytes a site sends,
  // plus the codec's work (blocking averages cost no compute: the sites wait for them anyway).
  if (overlapped_ && due.states > 0 && !due.decision.grad) {
    for (std::size_t k = 0; k < 3; ++k) {
      if (!due.kinds[k]) continue;
      const std::int64_t over = job_.delayed() && !job_.overlap ? job_.delay[k] : 1;
      for (std::size_t s = 0; s < n_; ++s) {
        const double cpu = t_.sites[s].steal_s_per_byte * p_.per_state_bytes[k] +
                           job_.codec_s[k] / double(p_.parts[k]);
        if (cpu > 0) {
          steals_[s].push_back({step + over - 1, cpu / double(over)});
          steals_until_ = std::max(steals_until_, step + over - 1);
        }
      }
    }
  }
  std::vector<double>& dts = dts_;
  for (std::size_t s = 0; s < n_; ++s) {
    const double j = jitter_[s];
    dts[s] = step_of(s) * (j > 0 ? std::exp(j * noise_(gen_) - j * j / 2) : 1.0);
    compute_[s] += dts[s];
    for (auto it = steals_[s].begin(); it != steals_[s].end();) {
      dts[s] += it->per_step;
      stolen_ += it->per_step;
      it = it->last <= step ? steals_[s].erase(it) : it + 1;
    }
  }
  return dts;
}

void Simulation::region_averages(std::int64_t step, const Due& due, const std::vector<double>& dts,
                                 Placement where) {
  const SyncDecision rd = job_.region_schedule.at(step);
  // Blocking and under the step, a job-wide average of a state stands for its region's;
  // before the compute (delayed) the regions average first and the job-wide average starts
  // from their result.
  const bool before = where == Placement::kBeforeCompute;
  const bool only[3] = {rd.x && (before || !due.kinds[0]), rd.u && (before || !due.kinds[1]),
                        rd.v && (before || !due.kinds[2])};
  double longest = 0;
  for (const Region& g : regions_) {
    double cost = 0;
    for (std::size_t k = 0; k < 3; ++k)
      if (only[k] && g.sites.size() > 1) {
        cost += g.seconds[k];
        r_.syncs += 1;
        if (std::find(g.sites.begin(), g.sites.end(), 0) != g.sites.end())
          r_.bytes_per_site += g.bytes[k];
      }
    if (cost == 0) continue;
    longest = std::max(longest, cost);
    const bool after = where == Placement::kAfterCompute;
    double start = 0;
    for (std::size_t s : g.sites) start = std::max(start, clock_[s] + (after ? dts[s] : 0.0));
    for (std::size_t s : g.sites) {
      switch (where) {
        case Placement::kAfterCompute:
          waited_[s] += start - (clock_[s] + dts[s]);
          clock_[s] = start + cost - dts[s];
          break;
        case Placement::kUnderCompute:
          waited_[s] += start - clock_[s] + std::max(0.0, cost - dts[s]);
          clock_[s] = start + std::max(dts[s], cost) - dts[s];
          break;
        case Placement::kBeforeCompute:
          waited_[s] += start - clock_[s];
          clock_[s] = start + cost;
          break;
      }
    }
  }
  r_.comm_s += longest;
}

void Simulation::step(std::int64_t step) {
  const Due due = due_at(step);
  const std::vector<double>& dts = compute_step(step, due);
  const bool delays = job_.delayed() && !job_.overlap && !due.decision.grad;
  const bool under = job_.mode == Overlap::kStep && !job_.overlap && !due.decision.grad;
  if (regional_)
    region_averages(step, due, dts,
                    delays                     ? Placement::kBeforeCompute
                    : under && due.states == 0 ? Placement::kUnderCompute
                                               : Placement::kAfterCompute);
  r_.syncs += due.states;  // every average counts once, whatever the model does with its time
  r_.bytes_per_site += due.bytes;
  r_.comm_s += due.cost;
  if (delays) return delayed(step, due, dts);
  if (under && due.states > 0) return step_overlap(due, dts);
  if (job_.overlap) return unbounded(due, dts);
  blocking(due, dts);
}

// Each site computes, then a due average is a barrier followed by its all-reduces.
void Simulation::blocking(const Due& due, const std::vector<double>& dts) {
  for (std::size_t s = 0; s < n_; ++s) clock_[s] += dts[s];
  if (due.states == 0) return;
  const double start = *std::max_element(clock_.begin(), clock_.end());
  for (std::size_t s = 0; s < n_; ++s) waited_[s] += start - clock_[s];
  std::fill(clock_.begin(), clock_.end(), start + due.cost);
}

// The control exchange at the step's start is a barrier; the averages then run under every
// site's compute, and the update waits for both.
void Simulation::step_overlap(const Due& due, const std::vector<double>& dts) {
  const double start = *std::max_element(clock_.begin(), clock_.end());
  for (std::size_t s = 0; s < n_; ++s) {
    waited_[s] += start - clock_[s] + std::max(0.0, due.cost - dts[s]);
    clock_[s] = start + std::max(dts[s], due.cost);
  }
}

// Each site first settles the batch still on the wire (no barrier between the sites: the
// control exchange's wide-area half runs on the communication thread). The new batch leaves
// once the last site has started it, after the exchange, its states one after the other (x, u,
// v), each ready for its fold when its own average is done; a fold waits at each site for its
// average (the last step drains every batch).
void Simulation::delayed(std::int64_t step, const Due& due, const std::vector<double>& dts) {
  if (due.states > 0) {
    double ready = link_free_;
    for (std::size_t s = 0; s < n_; ++s) {
      double& c = clock_[s];
      waited_[s] += std::max(0.0, link_free_ - c);
      c = std::max(c, link_free_);
      ready = std::max(ready, c);
    }
    ready += p_.exchange;
    for (std::size_t k = 0; k < 3; ++k)
      if (due.kinds[k]) {
        ready += p_.sync[k];
        folds_.push_back({step + job_.delay[k], ready});
      }
    link_free_ = ready;
  }
  for (std::size_t s = 0; s < n_; ++s) clock_[s] += dts[s];
  for (auto it = folds_.begin(); it != folds_.end();) {
    if (it->step != step && step != job_.steps) {
      ++it;
      continue;
    }
    for (std::size_t s = 0; s < n_; ++s) {
      waited_[s] += std::max(0.0, it->ready - clock_[s]);
      clock_[s] = std::max(clock_[s], it->ready);
    }
    it = folds_.erase(it);
  }
}

// The what-if: a sync starts when every site has produced the state and the link is free; the
// sites only wait if the previous all-reduce still occupies the link.
void Simulation::unbounded(const Due& due, const std::vector<double>& dts) {
  for (std::size_t s = 0; s < n_; ++s) clock_[s] += dts[s];
  if (due.states == 0) return;
  const double ready = *std::max_element(clock_.begin(), clock_.end());
  const double start = std::max(ready, link_free_);
  for (std::size_t s = 0; s < n_; ++s) {
    if (link_free_ > clock_[s]) waited_[s] += link_free_ - clock_[s];
    clock_[s] = std::max(clock_[s], link_free_);
  }
  link_free_ = start + due.cost;
}

std::int64_t Simulation::quiet_until(std::int64_t step) const {
  if (!steady_ || step <= steals_until_) return step - 1;
  std::int64_t last = step - 1;
  // The last step drains every batch in flight (delayed), so it is never quiet.
  for (std::int64_t t = step; t < job_.steps; ++t) {
    if (n_ > 1 && job_.schedule_at(t).at(t).any()) break;
    if (regional_) {
      const SyncDecision r = job_.region_schedule.at(t);
      if (r.x || r.u || r.v) break;
    }
    if (std::any_of(folds_.begin(), folds_.end(), [t](const Fold& f) { return f.step == t; }))
      break;
    last = t;
  }
  return last;
}

void Simulation::advance(std::int64_t steps) {
  for (std::size_t s = 0; s < n_; ++s) {
    const double dt = step_of(s) * double(steps);
    clock_[s] += dt;
    compute_[s] += dt;
  }
}

SimResult Simulation::result() {
  r_.total_s =
      std::max(*std::max_element(clock_.begin(), clock_.end()), job_.overlap ? link_free_ : 0.0);
  r_.step_s = r_.total_s / double(job_.steps);
  r_.compute_s = *std::max_element(compute_.begin(), compute_.end());
  r_.wait_by_site = waited_;
  double waited = 0.0;
  for (double w : waited_) waited += w;
  r_.wait_s = n_ > 0 ? waited / double(n_) : 0.0;
  r_.steal_s = n_ > 0 ? stolen_ / double(n_) : 0.0;
  return r_;
}

}  // namespace

SimResult simulate(const Topology& t, const SimJob& job) {
  Simulation sim(t, job);
  for (std::int64_t step = 1; step <= job.steps; ++step) {
    if (const std::int64_t last = sim.quiet_until(step); last >= step) {
      sim.advance(last - step + 1);
      step = last;
      continue;
    }
    sim.step(step);
  }
  return sim.result();
}

}  // namespace desloc::topology
