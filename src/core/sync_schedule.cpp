// The DES-LOC schedule (sync_schedule.hpp).
#include "desloc/core/sync_schedule.hpp"

#include <algorithm>

namespace desloc {

std::string_view to_string(SyncMethod m) {
  switch (m) {
    case SyncMethod::kNone:
      return "none";
    case SyncMethod::kDdp:
      return "ddp";
    case SyncMethod::kFavg:
      return "favg";
    case SyncMethod::kFavgReset:
      return "favg_reset";
    case SyncMethod::kLocalAdam:
      return "local_adam";
    case SyncMethod::kDesloc:
      return "desloc";
  }
  return "?";
}

std::optional<SyncMethod> parse_sync_method(std::string_view name) {
  for (const SyncMethod m : kSyncMethods)
    if (to_string(m) == name) return m;
  return std::nullopt;
}

std::string_view to_string(Overlap o) {
  switch (o) {
    case Overlap::kNone:
      return "none";
    case Overlap::kStep:
      return "step";
    case Overlap::kDelayed:
      return "delayed";
    case Overlap::kDelayedNaive:
      return "delayed_naive";
  }
  return "?";
}

std::optional<Overlap> parse_overlap(std::string_view name) {
  for (const Overlap o : kOverlaps)
    if (to_string(o) == name) return o;
  return std::nullopt;
}

bool due_at(std::int64_t t, std::int64_t period, std::int64_t phase) {
  return t >= 1 && period > 0 && (t - phase) % period == 0;
}

int due_fragment(std::int64_t t, std::int64_t period, std::int64_t phase, int fragments) {
  if (t < 1 || period < 1 || fragments < 1) return -1;
  const std::int64_t r = ((t - phase) % period + period) % period;  // 0 <= r < period
  // Fragment f starts at offset floor(f K / P) = f q + floor(f m / P), K = q P + m: no
  // overflow for any K. The offsets grow with f; the smallest f with offset >= r is due when
  // its offset is r.
  const std::int64_t p = fragments, q = period / p, m = period % p;
  const auto offset = [&](std::int64_t f) { return f * q + f * m / p; };
  std::int64_t lo = 0, hi = p;  // offset(hi) = K > r
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (offset(mid) >= r)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo < p && offset(lo) == r ? static_cast<int>(lo) : -1;
}

SyncDecision SyncSchedule::at(std::int64_t t) const {
  SyncDecision d;
  d.parts_x = fragments;
  d.parts_u = parts_u();
  d.parts_v = parts_v();
  const auto due = [&](std::int64_t period, std::int64_t phase, int parts, int& frag) {
    frag = due_fragment(t, period, phase, parts);
    const bool is_due = frag >= 0;
    frag = std::max(frag, 0);
    return is_due;
  };
  switch (method) {
    case SyncMethod::kNone:
      break;
    case SyncMethod::kDdp:
      d.grad = t >= 1;
      break;
    case SyncMethod::kFavg:
      d.x = due(kx, phase_x, d.parts_x, d.frag_x);
      break;
    case SyncMethod::kFavgReset:
      d.x = d.reset_uv = due(kx, phase_x, d.parts_x, d.frag_x);
      break;
    case SyncMethod::kLocalAdam:
      d.x = d.u = d.v = due(kx, phase_x, d.parts_x, d.frag_x);
      d.frag_u = d.frag_v = d.frag_x;
      break;
    case SyncMethod::kDesloc:
      d.x = due(kx, phase_x, d.parts_x, d.frag_x);
      d.u = due(ku, phase_u, d.parts_u, d.frag_u);
      d.v = due(kv, phase_v, d.parts_v, d.frag_v);
      break;
  }
  return d;
}

double SyncSchedule::state_syncs_per_step() const {
  const double x = 1.0 / static_cast<double>(kx);
  switch (method) {
    case SyncMethod::kNone:
      return 0.0;
    case SyncMethod::kDdp:
      return 1.0;
    case SyncMethod::kFavg:
    case SyncMethod::kFavgReset:
      return x;
    case SyncMethod::kLocalAdam:
      return 3.0 * x;
    case SyncMethod::kDesloc:
      return x + 1.0 / static_cast<double>(ku) + 1.0 / static_cast<double>(kv);
  }
  return 0.0;
}

}  // namespace desloc
