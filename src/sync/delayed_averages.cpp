// Delayed averages: started at one step, folded in tau steps later (delayed_averages.hpp).
#include "desloc/sync/delayed_averages.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "desloc/core/error.hpp"
#include "desloc/sync/sync_engine.hpp"

namespace desloc::sync {
namespace {
std::size_t index(optim::StateKind kind) { return static_cast<std::size_t>(kind); }
}  // namespace

bool DelayedAverages::start(std::int64_t t, std::span<const DueAverage> due, Averager& averager,
                            bool stop) {
  settle();
  std::vector<optim::StateKind> kinds;
  for (const DueAverage& d : due) {
    if (d.kind == optim::StateKind::kGrad)
      throw Error("sync engine: step " + std::to_string(t) +
                  " averages the gradient, which a delayed average cannot carry");
    const Pending& p = pending_[index(d.kind)];
    if (p.active)
      throw Error("sync engine: step " + std::to_string(t) + " starts an average of '" +
                  optim::to_string(d.kind) + "' while the one started at step " +
                  std::to_string(p.start) + " waits for its fold at step " +
                  std::to_string(p.fold_at) + "; a state's delay must be smaller than its period");
    kinds.push_back(d.kind);
  }
  if (kinds.empty()) return false;
  averager_ = &averager;
  averager.begin_step(t);
  // The control exchange judges the live values, which are the snapshots' values.
  const bool stop_agreed = averager.exchange_control(due, stop);
  for (const DueAverage& d : due) {
    Pending& p = pending_[index(d.kind)];
    p.snap.resize(d.local.size());
    p.mean.resize(d.local.size());
    p.views.clear();
    for (std::size_t w = 0; w < d.local.size(); ++w) {
      p.snap[w].assign(d.local[w].begin(), d.local[w].end());
      p.mean[w].assign(d.local[w].begin(), d.local[w].end());
      p.views.emplace_back(p.mean[w]);
    }
    p.active = true;
    p.complete = false;
    p.start = t;
    p.fold_at = t + opts_.tau[index(d.kind)];
  }
  on_wire_ = std::move(kinds);
  comm_ = std::thread([this] {
    try {
      for (const optim::StateKind kind : on_wire_)
        averager_->average_across_sites(kind, pending_[index(kind)].views);
    } catch (...) {
      comm_error_ = std::current_exception();
    }
  });
  return stop_agreed;
}

void DelayedAverages::join() {
  if (comm_.joinable()) comm_.join();
  if (comm_error_) {
    const std::exception_ptr e = comm_error_;
    abandon();
    std::rethrow_exception(e);
  }
}

void DelayedAverages::settle() {
  join();
  for (const optim::StateKind kind : on_wire_) {
    Pending& p = pending_[index(kind)];
    averager_->complete_average(kind, p.views);
    p.complete = true;
  }
  on_wire_.clear();
}

void DelayedAverages::fold(optim::StateKind kind, std::int64_t n, std::span<Replica> replicas) {
  Pending& p = pending_[index(kind)];
  if (!p.complete) settle();
  const std::vector<std::span<float>> dst = state_views(replicas, kind);
  if (dst.size() != p.mean.size())
    throw Error("sync engine: " + std::to_string(dst.size()) + " replicas fold the average of '" +
                optim::to_string(kind) + "' started at step " + std::to_string(p.start) + " by " +
                std::to_string(p.mean.size()));
  for (std::size_t w = 0; w < dst.size(); ++w) {
    const std::span<float> s = dst[w];
    const std::vector<float>& mean = p.mean[w];
    const std::vector<float>& snap = p.snap[w];
    if (opts_.naive) {
      std::copy(mean.begin(), mean.end(), s.begin());
      continue;
    }
    const optim::OptimizerConfig& oc = replicas[w].opt->config();
    const double beta = kind == optim::StateKind::kU   ? oc.beta1
                        : kind == optim::StateKind::kV ? oc.beta2
                                                       : 1.0;
    const auto c = static_cast<float>(std::pow(beta, static_cast<double>(n)));
    if (kind == optim::StateKind::kV) {
      for (std::size_t i = 0; i < s.size(); ++i)
        s[i] = std::max(0.0f, s[i] + c * (mean[i] - snap[i]));
    } else {
      for (std::size_t i = 0; i < s.size(); ++i) s[i] += c * (mean[i] - snap[i]);
    }
  }
  p.active = false;
}

void DelayedAverages::fold_pending(std::int64_t t, bool drain, std::span<Replica> replicas) {
  bool u = false, v = false;
  for (const optim::StateKind kind :
       {optim::StateKind::kX, optim::StateKind::kU, optim::StateKind::kV}) {
    const Pending& p = pending_[index(kind)];
    if (!p.active || (!drain && p.fold_at != t)) continue;
    fold(kind, t - p.start + (drain ? 1 : 0), replicas);
    u = u || kind == optim::StateKind::kU;
    v = v || kind == optim::StateKind::kV;
  }
  if (u && !v) bound_momentum(replicas);
}

void DelayedAverages::fold_due(std::int64_t t, std::span<Replica> replicas) {
  fold_pending(t, false, replicas);
}

void DelayedAverages::drain(std::int64_t t, std::span<Replica> replicas) {
  fold_pending(t, true, replicas);
}

void DelayedAverages::abandon() {
  if (comm_.joinable()) comm_.join();
  comm_error_ = nullptr;
  on_wire_.clear();
  for (Pending& p : pending_) p.active = false;
}

}  // namespace desloc::sync
