// The DES-LOC step order, shared by every driver of replicas.
#include "desloc/sync/synced_step.hpp"

#include <algorithm>
#include <cmath>
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

void bound_momentum(std::span<Replica> replicas) {
  for (auto& r : replicas) {
    const optim::OptimizerConfig& c = r.opt->config();
    const double b1 = c.beta1, b2 = c.beta2;
    if (c.name != "adamw" || b1 * b1 >= b2) continue;
    // A hair of slack, so float rounding never clamps a u that Adam itself produced.
    const auto bound =
        static_cast<float>(1.0001 * (1.0 - b1) / std::sqrt((1.0 - b2) * (1.0 - b1 * b1 / b2)));
    auto& s = r.opt->state();
    for (std::size_t i = 0; i < s.u.size(); ++i) {
      const float lim = bound * std::sqrt(s.v[i]);
      s.u[i] = std::clamp(s.u[i], -lim, lim);
    }
  }
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
  if (due.u && !due.v) bound_momentum(replicas);
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
