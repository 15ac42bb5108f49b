// One step of the DES-LOC rule for a set of replicas (DESIGN.md, "The algorithm"):
//   1. every worker's gradient at its own, not yet averaged, x;
//   2. each state due at t is replaced by its mean over the workers (DDP: the gradient; the
//      optional outer optimizer turns the x average into a Nesterov step; favg_reset zeroes
//      u and v after the x average);
//   3. gradient clipping, then every worker's local optimizer update with its gradient.
// The trainer, the toy problem and the tests all run this one function, so the order is
// defined and tested in one place.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "desloc/optim/optimizer.hpp"
#include "desloc/sync/averager.hpp"
#include "desloc/sync/outer_optimizer.hpp"
#include "desloc/sync/sync_policy.hpp"

namespace desloc::sync {

struct Replica {
  std::span<float> x;               // parameters
  std::span<float> g;               // gradient buffer, filled by the gradient callback
  optim::Optimizer* opt = nullptr;  // holds u and v
};

struct StepOptions {
  const optim::ClipConfig* clip = nullptr;  // nullptr = no clipping
  OuterNesterov* outer = nullptr;           // nullptr = plain parameter averaging
  bool reset_step_count = false;            // favg_reset: also restart bias correction
};

struct StepReport {
  SyncDecision due;
  float grad_norm = 0.0f;  // global norm of the last worker's gradient before clipping
};

// After u is averaged without v (DES-LOC's Ku < Kv): bounds every |u_i| of an AdamW replica by
// C sqrt(v_i), C = (1 - b1) / sqrt((1 - b2)(1 - b1^2 / b2)), the most a single Adam can reach
// (Cauchy-Schwarz on the two moving averages). The averaged u can carry another site's
// momentum for a coordinate this site's v barely knows (an embedding row of a token it has
// not seen: v ~ 0), and Adam's step u / (sqrt(v) + eps) would then explode; the fault suite
// hit exactly that after a site was dropped. A u that Adam itself produced, or one averaged
// together with v (Jensen), is never changed. ADOPT's step does not divide by sqrt(v).
void bound_momentum(std::span<Replica> replicas);

// The buffers of one state kind across the replicas, in replica order.
std::vector<std::span<float>> state_views(std::span<Replica> replicas, optim::StateKind kind);

// grad(w) must fill replicas[w].g with worker w's gradient at replicas[w].x.
StepReport run_synced_step(std::int64_t t, const SyncPolicy& policy, Averager& averager,
                           std::span<Replica> replicas,
                           const std::function<void(std::size_t)>& grad, float lr,
                           const StepOptions& opts = {});

}  // namespace desloc::sync
