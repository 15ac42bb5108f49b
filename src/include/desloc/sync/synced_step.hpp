// One whole DES-LOC step for a set of in-process replicas, for drivers whose gradients are a
// plain function (the toy problem, the tests): SyncEngine::begin, every gradient,
// SyncEngine::finish, SyncEngine::update. The trainer drives the engine itself.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "desloc/sync/sync_engine.hpp"

namespace desloc::sync {

struct StepReport {
  SyncDecision due;
  float grad_norm = 0.0f;  // global norm of the last site's gradient before clipping
};

// grad(w) must fill replicas[w].g with site w's gradient at replicas[w].x.
StepReport run_synced_step(std::int64_t t, const SyncPolicy& policy, Averager& averager,
                           std::span<Replica> replicas,
                           const std::function<void(std::size_t)>& grad, float lr,
                           const StepOptions& opts = {});

}  // namespace desloc::sync
