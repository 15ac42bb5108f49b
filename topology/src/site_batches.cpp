// Balanced batches for sites of unequal speed (site_batches.hpp).
#include "desloc/topology/site_batches.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "desloc/core/error.hpp"

namespace desloc::topology {
namespace {

// The largest batch in [1, most] whose footprint fits `memory` (memory_at grows with the
// batch); 1 when not even one sequence fits (no smaller batch exists).
int memory_cap(const std::function<double(int)>& memory_at, double memory, int most) {
  int lo = 1, hi = most;
  if (memory_at(hi) <= memory) return hi;
  while (lo + 1 < hi) {
    const int mid = lo + (hi - lo) / 2;
    (memory_at(mid) <= memory ? lo : hi) = mid;
  }
  return lo;
}

// The sequences each free site takes, in proportion to its speed, after the fixed ones took
// theirs; a site below 1 or above its cap is fixed there and the rest shared again.
std::vector<double> share_by_speed(const std::vector<int>& ranks, const std::vector<double>& v,
                                   const std::vector<int>& cap, double sequences) {
  const std::size_t n = ranks.size();
  std::vector<double> b(n, 0.0);
  std::vector<char> fixed(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    double left = sequences, speed = 0.0;
    for (std::size_t s = 0; s < n; ++s) {
      if (fixed[s])
        left -= ranks[s] * b[s];
      else
        speed += ranks[s] * v[s];
    }
    if (speed <= 0) break;
    for (std::size_t s = 0; s < n; ++s) {
      if (fixed[s]) continue;
      b[s] = left * v[s] / speed;
      const double bound = b[s] < 1.0 ? 1.0 : cap[s] > 0 && b[s] > cap[s] ? cap[s] : 0.0;
      if (bound > 0) {
        b[s] = bound;
        fixed[s] = 1;
        changed = true;
      }
    }
  }
  return b;
}

std::string millis(double s) { return fmt::format("{:.0f} ms", s * 1e3); }

}  // namespace

SiteBatchPlan balance_site_batches(const Topology& t, const SiteBatchRequest& req) {
  const std::size_t n = req.sites.size();
  if (req.ranks.size() != n || req.batch.size() != n)
    throw ConfigError(fmt::format("site batches: {} sites, {} rank counts and {} batches",
                                  n, req.ranks.size(), req.batch.size()));
  SiteBatchPlan p;
  p.ranks = req.ranks;
  std::vector<double> v(n);  // sequences per second of one rank
  for (std::size_t s = 0; s < n; ++s) {
    const SiteProfile& site = t.site(req.sites[s]);
    const int timed = site.batch > 0 ? site.batch : req.batch[s];
    v[s] = double(timed) / site.step_s;
    p.configured_step_s.push_back(req.batch[s] / v[s]);
    p.sequences += long(req.ranks[s]) * req.batch[s];
  }
  p.memory_cap.assign(n, 0);
  for (std::size_t s = 0; s < n; ++s) {
    const SiteProfile& site = t.site(req.sites[s]);
    if (req.memory_at && site.memory_bytes > 0)
      p.memory_cap[s] = memory_cap(req.memory_at, site.memory_bytes,
                                   static_cast<int>(std::min<long>(p.sequences, 1L << 20)));
  }
  const std::vector<double> ideal = share_by_speed(req.ranks, v, p.memory_cap, double(p.sequences));
  p.batch.resize(n);
  long left = p.sequences;
  for (std::size_t s = 0; s < n; ++s) {
    p.batch[s] = std::max(1, static_cast<int>(std::floor(ideal[s] + 1e-9)));
    if (p.memory_cap[s] > 0) p.batch[s] = std::min(p.batch[s], p.memory_cap[s]);
    left -= long(req.ranks[s]) * p.batch[s];
  }
  // What the rounding left, a rank-batch at a time, to the site whose step stays shortest.
  for (;;) {
    std::size_t best = n;
    for (std::size_t s = 0; s < n; ++s) {
      if (req.ranks[s] > left || (p.memory_cap[s] > 0 && p.batch[s] + 1 > p.memory_cap[s]))
        continue;
      if (best == n || (p.batch[s] + 1) / v[s] < (p.batch[best] + 1) / v[best]) best = s;
    }
    if (best == n) break;
    ++p.batch[best];
    left -= req.ranks[best];
  }
  std::size_t slowest = 0, fastest = 0, slowest_configured = 0;
  for (std::size_t s = 0; s < n; ++s) {
    p.step_s.push_back(p.batch[s] / v[s]);
    p.balanced_sequences += long(req.ranks[s]) * p.batch[s];
    if (p.step_s[s] > p.step_s[slowest]) slowest = s;
    if (p.step_s[s] < p.step_s[fastest]) fastest = s;
    if (p.configured_step_s[s] > p.configured_step_s[slowest_configured]) slowest_configured = s;
  }
  p.job_step_s = p.step_s[slowest];
  p.configured_job_step_s = p.configured_step_s[slowest_configured];

  // The step every site would take with no batch floored at 1 nor capped by memory, nor
  // rounded: a job step 10% beyond it is a site the balance cannot help.
  double speed = 0.0;
  for (std::size_t s = 0; s < n; ++s) speed += req.ranks[s] * v[s];
  const double unbounded_step = double(p.sequences) / speed;
  std::vector<std::string> configured, balanced;
  double wait = 0.0;  // the others' mean wait per step, configured
  for (std::size_t s = 0; s < n; ++s) {
    configured.push_back(fmt::format("{} {}", req.sites[s], millis(p.configured_step_s[s])));
    balanced.push_back(fmt::format("{} {} -> {} ({}{})", req.sites[s], req.batch[s], p.batch[s],
                                   millis(p.step_s[s]),
                                   p.memory_cap[s] > 0 && p.batch[s] == p.memory_cap[s]
                                       ? ", its memory's most"
                                       : ""));
    wait += p.configured_job_step_s - p.configured_step_s[s];
  }
  p.explanation.push_back(fmt::format(
      "sites of unequal speed (desloc profile's steps, taken as linear in the batch): at the "
      "configured batches a step takes {}; every average waits for {}, so the sites wait {:.0f}% "
      "of the job's step on average",
      fmt::join(configured, ", "), req.sites[slowest_configured],
      n > 0 ? 100.0 * wait / double(n) / p.configured_job_step_s : 0.0));
  p.explanation.push_back(fmt::format(
      "balanced batches per rank ({} sequences a step, configured {}): {}; the job steps in {} "
      "instead of {}",
      p.balanced_sequences, p.sequences, fmt::join(balanced, ", "), millis(p.job_step_s),
      millis(p.configured_job_step_s)));
  for (std::size_t s = 0; s < n; ++s)  // the caps that bound a batch
    if (p.memory_cap[s] > 0 && p.batch[s] == p.memory_cap[s] &&
        unbounded_step * v[s] > p.memory_cap[s])
      p.explanation.push_back(fmt::format(
          "{}: its measured memory ({:.1f} GiB a rank) holds a batch of at most {}", req.sites[s],
          t.site(req.sites[s]).memory_bytes / double(1u << 30), p.memory_cap[s]));
  if (n > 1 && p.job_step_s > 1.1 * unbounded_step) {
    p.pace_setter = req.sites[slowest];
    const bool floored = p.batch[slowest] == 1;
    p.explanation.push_back(fmt::format(
        "{} still sets the pace: {} its step takes {} against {}'s {}; the others wait up to "
        "{:.0f}% of each step. {}",
        req.sites[slowest],
        floored ? "at its smallest batch (1)" : "with the rest capped by memory,",
        millis(p.step_s[slowest]), req.sites[fastest], millis(p.step_s[fastest]),
        100.0 * (1.0 - p.step_s[fastest] / p.step_s[slowest]),
        floored ? "Give it fewer sequences (fewer ranks), or leave it out of the job"
                : "More memory, or more ranks, at the capped sites would let them take more"));
  }
  return p;
}

}  // namespace desloc::topology
