// The DES-LOC schedule (sync_schedule.hpp).
#include "desloc/core/sync_schedule.hpp"

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

bool due_at(std::int64_t t, std::int64_t period, std::int64_t phase) {
  return t >= 1 && period > 0 && (t - phase) % period == 0;
}

SyncDecision SyncSchedule::at(std::int64_t t) const {
  SyncDecision d;
  switch (method) {
    case SyncMethod::kNone:
      break;
    case SyncMethod::kDdp:
      d.grad = t >= 1;
      break;
    case SyncMethod::kFavg:
      d.x = due_at(t, kx, phase_x);
      break;
    case SyncMethod::kFavgReset:
      d.x = d.reset_uv = due_at(t, kx, phase_x);
      break;
    case SyncMethod::kLocalAdam:
      d.x = d.u = d.v = due_at(t, kx, phase_x);
      break;
    case SyncMethod::kDesloc:
      d.x = due_at(t, kx, phase_x);
      d.u = due_at(t, ku, phase_u);
      d.v = due_at(t, kv, phase_v);
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
