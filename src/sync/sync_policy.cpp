// SyncPolicy: the DES-LOC schedule of a job's [sync] settings.
#include "desloc/sync/sync_policy.hpp"

namespace desloc::sync {

SyncSchedule SyncConfig::schedule() const {
  SyncSchedule s;
  s.method = method;
  s.kx = kx;
  s.ku = effective_ku();
  s.kv = effective_kv();
  s.phase_x = phase_x;
  // favg, favg_reset and local_adam average at x's phase; only desloc has its own u and v.
  s.phase_u = method == SyncMethod::kDesloc ? phase_u : phase_x;
  s.phase_v = method == SyncMethod::kDesloc ? phase_v : phase_x;
  s.fragments = fragments;
  s.fragments_u = fragments_u;
  s.fragments_v = fragments_v;
  return s;
}

SyncPolicy::SyncPolicy(SyncConfig cfg) : cfg_(std::move(cfg)), schedule_(cfg_.schedule()) {}

}  // namespace desloc::sync
