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

std::string describe(optim::StateKind kind, int fragment, int fragments) {
  std::string s = "'" + std::string(optim::to_string(kind)) + "'";
  if (fragments > 1)
    s += " (fragment " + std::to_string(fragment) + " of " + std::to_string(fragments) + ")";
  return s;
}
}  // namespace

void DelayedAverages::start(std::int64_t t, std::span<const DueAverage> due,
                            std::span<const int> fragment, std::span<const int> parts,
                            Averager& averager, bool stop, Averager* record) {
  settle();
  if (fragment.size() != due.size() || parts.size() != due.size())
    throw Error("sync engine: step " + std::to_string(t) + " starts " + std::to_string(due.size()) +
                " averages with " + std::to_string(fragment.size()) + " fragment indices");
  for (std::size_t k = 0; k < due.size(); ++k) {
    const DueAverage& d = due[k];
    if (d.kind == optim::StateKind::kGrad)
      throw Error("sync engine: step " + std::to_string(t) +
                  " averages the gradient, which a delayed average cannot carry");
    for (const Pending& p : pending_)
      if (p.kind == d.kind && p.fragment == fragment[k])
        throw Error("sync engine: step " + std::to_string(t) + " starts an average of " +
                    describe(d.kind, fragment[k], parts[k]) + " while the one started at step " +
                    std::to_string(p.start) + " waits for its fold at step " +
                    std::to_string(p.fold_at) +
                    "; a state's delay must be smaller than its period");
  }
  if (due.empty()) return;
  averager_ = &averager;
  record_ = record != nullptr ? record : &averager;
  averager.begin_step(t);
  std::vector<DueAverage> control;
  for (std::size_t k = 0; k < due.size(); ++k) {
    const DueAverage& d = due[k];
    Pending p;
    p.kind = d.kind;
    p.fragment = fragment[k];
    p.fragments = parts[k];
    p.start = t;
    if (d.codec != nullptr) p.codec = *d.codec;
    p.fold_at = t + opts_.tau[index(d.kind)];
    for (std::size_t w = 0; w < d.local.size(); ++w) {
      p.snap.push_back(reuse(d.local[w].size()));
      p.mean.push_back(reuse(d.local[w].size()));
      p.snap[w].assign(d.local[w].begin(), d.local[w].end());
      p.mean[w].assign(d.local[w].begin(), d.local[w].end());
    }
    Pending& q = pending_.emplace_back(std::move(p));
    for (std::vector<float>& m : q.mean) q.views.emplace_back(m);
    on_wire_.push_back(&q);
    // The exchange judges the snapshots: the values the average starts from (their views
    // stay put in pending_ until close_control() has run).
    control.push_back({q.kind, q.views, q.codec ? &*q.codec : nullptr});
  }
  averager.open_control(control, stop);
  {
    const std::lock_guard lock(mu_);
    sent_ = 0;
    finished_ = false;
  }
  completed_ = 0;
  answered_ = false;
  comm_ = std::thread([this] {
    const double began = steady_seconds();
    try {
      answer_ = averager_->close_control();
      comm_control_.add_seconds(steady_seconds() - began);
      for (Pending* p : on_wire_) {
        if (p->codec) averager_->set_codec(p->kind, *p->codec);
        averager_->average_across_sites(p->kind, p->views);
        const std::lock_guard lock(mu_);
        ++sent_;
        wire_.notify_all();
      }
    } catch (...) {
      comm_error_ = std::current_exception();
    }
    comm_cpu_.add_calling_thread();
    comm_wall_.add_seconds(steady_seconds() - began);
    const std::lock_guard lock(mu_);
    finished_ = true;
    wire_.notify_all();
  });
}

void DelayedAverages::join() {
  if (comm_.joinable()) comm_.join();
  if (comm_error_) {
    const std::exception_ptr e = comm_error_;
    abandon();
    std::rethrow_exception(e);
  }
}

void DelayedAverages::complete_through(std::size_t count) {
  count = std::min(count, on_wire_.size());
  if (completed_ >= count) return;
  {
    std::unique_lock lock(mu_);
    wire_.wait(lock, [&] { return sent_ >= count || finished_; });
    if (sent_ < count) {  // the thread stopped early: it failed
      lock.unlock();
      join();
    }
  }
  if (!answered_) {  // the exchange's answer came before any average
    stop_agreed_ = stop_agreed_ || answer_.stop;
    measure_ = std::exchange(answer_.measure, std::nullopt);
    record_->record_rejections(answer_.rejections);
    answer_ = {};
    answered_ = true;
  }
  // In start order, so every rank of the site completes (all-gathers) them in the same order.
  for (; completed_ < count; ++completed_) {
    Pending* p = on_wire_[completed_];
    averager_->complete_average(p->kind, p->views);
    p->complete = true;
  }
  if (completed_ == on_wire_.size()) {
    join();
    on_wire_.clear();
    completed_ = 0;
  }
}

void DelayedAverages::settle() { complete_through(on_wire_.size()); }

void DelayedAverages::fold(Pending& p, std::int64_t n, std::span<Replica> replicas) {
  if (!p.complete) {  // on the wire: wait for it (and those started before it) only
    const auto at = std::find(on_wire_.begin(), on_wire_.end(), &p);
    complete_through(static_cast<std::size_t>(at - on_wire_.begin()) + 1);
  }
  const std::vector<std::span<float>> dst = state_views(replicas, p.kind, p.fragment, p.fragments);
  if (dst.size() != p.mean.size())
    throw Error("sync engine: " + std::to_string(dst.size()) + " replicas fold the average of " +
                describe(p.kind, p.fragment, p.fragments) + " started at step " +
                std::to_string(p.start) + " by " + std::to_string(p.mean.size()));
  if (p.kind == optim::StateKind::kX && opts_.outer != nullptr && !dst.empty()) {
    // The outer step on this fragment's mean, once (every replica holds the same mean), at the
    // fold: the sites step in the order their averages complete, which every rank shares.
    opts_.outer->step(p.mean[0], static_cast<std::size_t>(dst[0].data() - replicas[0].x.data()));
    for (std::size_t w = 1; w < p.mean.size(); ++w) p.mean[w] = p.mean[0];
    // A compressed x's next difference is from the outer step's parameters (SyncEngine::apply).
    if (p.codec && !p.codec->reference.empty())
      std::copy(p.mean[0].begin(), p.mean[0].end(), p.codec->reference.begin());
  }
  for (std::size_t w = 0; w < dst.size(); ++w) {
    const std::span<float> s = dst[w];
    const std::vector<float>& mean = p.mean[w];
    const std::vector<float>& snap = p.snap[w];
    if (s.size() != mean.size())
      throw Error("sync engine: the average of " + describe(p.kind, p.fragment, p.fragments) +
                  " started at step " + std::to_string(p.start) + " holds " +
                  std::to_string(mean.size()) + " elements, the replica " +
                  std::to_string(s.size()));
    if (opts_.naive) {
      std::copy(mean.begin(), mean.end(), s.begin());
      continue;
    }
    const optim::OptimizerConfig& oc = replicas[w].opt->config();
    const double beta = p.kind == optim::StateKind::kU   ? oc.beta1
                        : p.kind == optim::StateKind::kV ? oc.beta2
                                                         : 1.0;
    const auto c = static_cast<float>(std::pow(beta, static_cast<double>(n)));
    if (p.kind == optim::StateKind::kV) {
      for (std::size_t i = 0; i < s.size(); ++i)
        s[i] = std::max(0.0f, s[i] + c * (mean[i] - snap[i]));
    } else {
      for (std::size_t i = 0; i < s.size(); ++i) s[i] += c * (mean[i] - snap[i]);
    }
  }
  p.folded = true;
}

void DelayedAverages::fold_pending(std::int64_t t, bool drain, std::span<Replica> replicas) {
  // Alg. 1's order (x, u, v); within a state, disjoint fragments in start order.
  std::vector<std::pair<int, int>> u_fragments, v_fragments;  // (fragment, parts)
  for (const optim::StateKind kind :
       {optim::StateKind::kX, optim::StateKind::kU, optim::StateKind::kV}) {
    for (Pending& p : pending_) {
      if (p.kind != kind || (!drain && p.fold_at != t)) continue;
      fold(p, t - p.start + (drain ? 1 : 0), replicas);
      if (kind == optim::StateKind::kU) u_fragments.emplace_back(p.fragment, p.fragments);
      if (kind == optim::StateKind::kV) v_fragments.emplace_back(p.fragment, p.fragments);
    }
  }
  // u folded without the v of the same elements: bound it. With compressed moments
  // (always_bound_u) also after any fold of v: a quantised mean can pull v below the v that
  // bounded u, as after a blocking compressed average of v (SyncEngine::average). Without
  // this, int2 with delayed averages diverged on the e2e bed (docs/sync.md).
  const bool bound =
      (opts_.always_bound_u && !v_fragments.empty()) ||
      std::any_of(u_fragments.begin(), u_fragments.end(), [&](const auto& f) {
        return opts_.always_bound_u ||
               std::find(v_fragments.begin(), v_fragments.end(), f) == v_fragments.end();
      });
  if (bound) bound_momentum(replicas);
  for (Pending& p : pending_)
    if (p.folded)
      for (auto* buffers : {&p.snap, &p.mean})
        for (std::vector<float>& b : *buffers) spare_.push_back(std::move(b));
  pending_.remove_if([](const Pending& p) { return p.folded; });
}

std::vector<float> DelayedAverages::reuse(std::size_t n) {
  // The best fit: the smallest spare buffer that holds n, else the largest (it grows once).
  if (spare_.empty()) return {};
  const auto smaller = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.capacity() < b.capacity();
  };
  auto best = spare_.end();
  for (auto it = spare_.begin(); it != spare_.end(); ++it)
    if (it->capacity() >= n && (best == spare_.end() || smaller(*it, *best))) best = it;
  if (best == spare_.end()) best = std::max_element(spare_.begin(), spare_.end(), smaller);
  std::vector<float> b = std::move(*best);
  spare_.erase(best);
  return b;
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
  completed_ = 0;
  answer_ = {};
  pending_.clear();
}

}  // namespace desloc::sync
