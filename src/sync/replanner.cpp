// Re-planning the periods while training (replanner.hpp).
#include "desloc/sync/replanner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace desloc::sync {
namespace {

double median_of(const std::vector<SyncMeasure>& ms, double SyncMeasure::*field) {
  std::vector<double> v;
  for (const SyncMeasure& m : ms) v.push_back(m.*field);
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The x averages of one cycle: until x, u and v are due together again, at most this many.
constexpr std::int64_t kMaxCycle = 1024;

}  // namespace

double replan_overhead(SyncMethod method, const Periods& periods, double state_seconds,
                       double compute_seconds, double hidden_steps) {
  SyncSchedule s;
  s.method = method;
  s.kx = periods.kx;
  s.ku = periods.ku;
  s.kv = periods.kv;
  double cost = 0.0;
  std::int64_t n = 0;
  const double hidden = hidden_steps * compute_seconds;
  const bool desloc = method == SyncMethod::kDesloc;
  if (desloc && (periods.ku % periods.kx != 0 || periods.kv % periods.kx != 0)) {
    // u or v also falls between x's averages: each state's averages priced on their own.
    for (const std::int64_t k : {periods.kx, periods.ku, periods.kv})
      cost += std::max(0.0, state_seconds - hidden) / double(k);
    return cost / compute_seconds;
  }
  for (std::int64_t t = periods.kx; n < kMaxCycle; t += periods.kx) {
    const SyncDecision d = s.at(t);
    ++n;
    cost += std::max(0.0, double(int(d.x) + int(d.u) + int(d.v)) * state_seconds - hidden);
    if (!desloc || (d.u && d.v)) break;  // the cycle is whole
  }
  return cost / (double(n) * double(periods.kx) * compute_seconds);
}

Replanner::Replanner(SyncMethod method, Periods base, ReplanOptions options, Periods region)
    : method_(method), opt_(options), periods_(base) {
  if (method_ == SyncMethod::kDesloc && base.kx > 0) {
    ratio_u_ = std::max<std::int64_t>(1, std::llround(double(base.ku) / double(base.kx)));
    ratio_v_ = std::max<std::int64_t>(1, std::llround(double(base.kv) / double(base.kx)));
  }
  const Periods& r = region;
  if (r.kx > 0) {
    // Ends: region kx x region ku x region kv is such a multiple.
    kx_step_ = r.kx;
    for (;; kx_step_ += r.kx) {
      const Periods p = periods_of(kx_step_);
      if (p.ku % std::max<std::int64_t>(1, r.ku) == 0 &&
          p.kv % std::max<std::int64_t>(1, r.kv) == 0)
        break;
    }
    opt_.min_kx = std::max(opt_.min_kx, r.kx + 1);
  }
}

void Replanner::reset(Periods in_force, bool keep_target) {
  periods_ = in_force;
  reference_ = 0.0;
  if (!keep_target) target_ = 0.0;
  warmup_.clear();
  off_.clear();
  direction_ = 0;
  skipped_first_ = false;
}

Periods Replanner::periods_of(std::int64_t kx) const {
  if (method_ != SyncMethod::kDesloc) return Periods{kx, kx, kx};
  return Periods{kx, kx * ratio_u_, kx * ratio_v_};
}

Periods Replanner::plan(double state_seconds, double compute_seconds, double target) const {
  const auto fits = [&](std::int64_t kx) {
    return replan_overhead(method_, periods_of(kx), state_seconds, compute_seconds,
                           opt_.hidden_steps) <= target;
  };
  // Over multiples j of kx_step_: kx = j x kx_step_.
  const std::int64_t g = kx_step_;
  std::int64_t lo = (std::max<std::int64_t>(1, opt_.min_kx) + g - 1) / g;
  std::int64_t hi = std::max(lo, opt_.max_kx / g);
  if (!fits(hi * g)) return periods_of(hi * g);
  while (lo < hi) {  // the overhead falls as kx grows
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid * g))
      hi = mid;
    else
      lo = mid + 1;
  }
  return periods_of(lo * g);
}

std::optional<ReplanDecision> Replanner::observe(const SyncMeasure& m) {
  if (!m.valid()) return std::nullopt;
  if (!skipped_first_) {  // the first average also opened the connections
    skipped_first_ = true;
    return std::nullopt;
  }
  if (reference_ <= 0.0) {
    warmup_.push_back(m);
    if (warmup_.size() < reference_syncs()) return std::nullopt;
    reference_ = median_of(warmup_, &SyncMeasure::state_seconds);
    const double compute = median_of(warmup_, &SyncMeasure::compute_seconds);
    warmup_.clear();
    if (target_ <= 0.0)  // the first reference of the job (or of a reset) sets the target
      target_ = opt_.target > 0.0 ? opt_.target
                                  : std::max(0.01, replan_overhead(method_, periods_, reference_,
                                                                   compute, opt_.hidden_steps));
    return std::nullopt;
  }
  const double ratio = m.state_seconds / reference_;
  const int dir = ratio > opt_.drift ? 1 : ratio < 1.0 / opt_.drift ? -1 : 0;
  if (dir == 0) {
    off_.clear();
    direction_ = 0;
    return std::nullopt;
  }
  if (dir != direction_) off_.clear();
  direction_ = dir;
  off_.push_back(m);
  if (off_.size() < static_cast<std::size_t>(opt_.syncs)) return std::nullopt;
  ReplanDecision d;
  d.state_seconds = median_of(off_, &SyncMeasure::state_seconds);
  d.compute_seconds = median_of(off_, &SyncMeasure::compute_seconds);
  d.reference_seconds = reference_;
  d.bytes_per_s = median_of(off_, &SyncMeasure::bytes_per_s);
  d.target = target_;
  d.overhead_before =
      replan_overhead(method_, periods_, d.state_seconds, d.compute_seconds, opt_.hidden_steps);
  d.periods = plan(d.state_seconds, d.compute_seconds, target_);
  d.overhead =
      replan_overhead(method_, d.periods, d.state_seconds, d.compute_seconds, opt_.hidden_steps);
  d.predicted_step_s = d.compute_seconds * (1.0 + d.overhead);
  d.reason = fmt::format(
      "a wide-area average of one state took {:.3g} s (median of the last {}), {:.2f}x the "
      "{:.3g} s kx {} was chosen at; with {:.3g} s of compute a step, kx {} costs {:.1f}% of "
      "compute, kx {} {:.1f}% (target {:.1f}%)",
      d.state_seconds, off_.size(), d.state_seconds / reference_, reference_, periods_.kx,
      d.compute_seconds, periods_.kx, 100.0 * d.overhead_before, d.periods.kx, 100.0 * d.overhead,
      100.0 * target_);
  // The new periods get a reference of their own, measured as the first one was: a burst of
  // noise cannot flip the plan back and forth, and each re-plan needs a sustained drift.
  reference_ = 0.0;
  off_.clear();
  direction_ = 0;
  if (d.periods == periods_) return std::nullopt;
  periods_ = d.periods;
  return d;
}

}  // namespace desloc::sync
