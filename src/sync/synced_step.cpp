// The DES-LOC step order, shared by every driver of replicas.
#include "desloc/sync/synced_step.hpp"

#include <algorithm>
#include <vector>

namespace desloc::sync {
std::vector<std::span<float>> state_views(std::span<Replica> replicas, optim::StateKind kind) {
  std::vector<std::span<float>> out;
  out.reserve(replicas.size());
  for (auto& r : replicas) {
    switch (kind) {
      case optim::StateKind::kGrad:
        out.push_back(r.g);
        break;
      case optim::StateKind::kX:
        out.push_back(r.x);
        break;
      case optim::StateKind::kU:
        out.push_back(r.opt->buffer(optim::StateKind::kU));
        break;
      case optim::StateKind::kV:
        out.push_back(r.opt->buffer(optim::StateKind::kV));
        break;
    }
  }
  return out;
}

StepReport run_synced_step(std::int64_t t, const SyncPolicy& policy, Averager& averager,
                           std::span<Replica> replicas,
                           const std::function<void(std::size_t)>& grad, float lr,
                           const StepOptions& opts) {
  using optim::StateKind;
  StepReport report;
  report.due = policy.at(t);
  const SyncDecision& due = report.due;

  averager.begin_step(t);
  for (std::size_t w = 0; w < replicas.size(); ++w) grad(w);

  if (due.grad) averager.average(StateKind::kGrad, state_views(replicas, StateKind::kGrad));
  if (due.x) {
    averager.average(StateKind::kX, state_views(replicas, StateKind::kX));
    if (opts.outer != nullptr && !replicas.empty()) {
      opts.outer->step(replicas[0].x);
      for (std::size_t w = 1; w < replicas.size(); ++w)
        std::copy(replicas[0].x.begin(), replicas[0].x.end(), replicas[w].x.begin());
    }
  }
  if (due.u) averager.average(StateKind::kU, state_views(replicas, StateKind::kU));
  if (due.v) averager.average(StateKind::kV, state_views(replicas, StateKind::kV));
  if (due.reset_uv) {
    for (auto& r : replicas) {
      auto& s = r.opt->state();
      std::fill(s.u.begin(), s.u.end(), 0.0f);
      std::fill(s.v.begin(), s.v.end(), 0.0f);
      if (opts.reset_step_count) s.t = 0;
    }
  }

  for (auto& r : replicas) {
    report.grad_norm =
        opts.clip != nullptr ? optim::clip_gradient(r.g, *opts.clip) : optim::global_norm(r.g);
    r.opt->step(r.x, r.g, lr);
  }
  return report;
}

}  // namespace desloc::sync
