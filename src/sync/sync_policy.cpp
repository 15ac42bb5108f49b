// SyncPolicy: the DES-LOC schedule and its special cases.
#include "desloc/sync/sync_policy.hpp"

namespace desloc::sync {
namespace {
bool due(std::int64_t t, std::int64_t period, std::int64_t phase) {
  if (t < 1 || period <= 0) return false;
  const std::int64_t r = (t - phase) % period;
  return r == 0;
}
}  // namespace

SyncPolicy::SyncPolicy(SyncConfig cfg) : cfg_(std::move(cfg)) {}

SyncDecision SyncPolicy::at(std::int64_t t) const {
  SyncDecision d;
  const std::string& m = cfg_.method;
  if (m == "ddp") {
    d.grad = t >= 1;
  } else if (m == "favg") {
    d.x = due(t, cfg_.kx, cfg_.phase_x);
  } else if (m == "favg_reset") {
    d.x = due(t, cfg_.kx, cfg_.phase_x);
    d.reset_uv = d.x;
  } else if (m == "local_adam") {
    d.x = d.u = d.v = due(t, cfg_.kx, cfg_.phase_x);
  } else if (m == "desloc") {
    d.x = due(t, cfg_.kx, cfg_.phase_x);
    d.u = due(t, cfg_.effective_ku(), cfg_.phase_u);
    d.v = due(t, cfg_.effective_kv(), cfg_.phase_v);
  }
  return d;
}

double SyncPolicy::state_syncs_per_step() const {
  const std::string& m = cfg_.method;
  const double kx = static_cast<double>(cfg_.kx);
  if (m == "ddp") return 1.0;
  if (m == "favg" || m == "favg_reset") return 1.0 / kx;
  if (m == "local_adam") return 3.0 / kx;
  if (m == "desloc")
    return 1.0 / kx + 1.0 / static_cast<double>(cfg_.effective_ku()) +
           1.0 / static_cast<double>(cfg_.effective_kv());
  return 0.0;
}

}  // namespace desloc::sync
