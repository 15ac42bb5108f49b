// The overlap modes' halves of the averager protocol (overlap_modes.hpp).
#include "overlap_modes.hpp"

#include <string>
#include <utility>

#include "desloc/core/error.hpp"

namespace desloc::sync {

void SyncEngine::Blocking::begin(std::int64_t t, Averager& averager, std::span<Replica>, bool) {
  e_.open(t, averager);
}

bool SyncEngine::Blocking::finish(std::span<Replica> replicas, bool stop) {
  return e_.finish_blocking(replicas, stop);
}

void SyncEngine::StepOverlapped::begin(std::int64_t t, Averager& averager,
                                       std::span<Replica> replicas, bool stop) {
  e_.open(t, averager);
  const SyncDecision& due = e_.due_;
  if (!(due.x || due.u || due.v)) return;
  if (due.grad)  // the config refuses overlap with DDP; a gradient does not exist yet
    throw Error("sync engine: step " + std::to_string(t) +
                " averages the gradient, which cannot start before the step's backward pass");
  const DueViews d = e_.due_views(replicas, due, true);
  stop_agreed_ = averager.exchange_control(d.due, stop);
  // Copies: x is read by the forward pass at its un-averaged value until the update. The
  // buffers of each state kind are kept from one sync to the next.
  for (std::size_t k = 0; k < d.due.size(); ++k) {
    std::vector<std::vector<float>>& copies = copies_[static_cast<std::size_t>(d.due[k].kind)];
    copies.resize(d.views[k].size());
    Started st{d.due[k].kind, {}, d.codec[k]};
    for (std::size_t w = 0; w < copies.size(); ++w) {
      copies[w].assign(d.views[k][w].begin(), d.views[k][w].end());
      st.views.emplace_back(copies[w]);
    }
    started_.push_back(std::move(st));
  }
  comm_ = std::thread([this, &averager] {
    const double began = steady_seconds();
    try {
      for (Started& st : started_) {
        if (st.codec) averager.set_codec(st.kind, *st.codec);
        averager.average_across_sites(st.kind, st.views);
      }
    } catch (...) {
      comm_error_ = std::current_exception();
    }
    comm_cpu_.add_calling_thread();
    comm_wall_.add_seconds(steady_seconds() - began);
  });
}

bool SyncEngine::StepOverlapped::finish(std::span<Replica> replicas, bool stop) {
  // Nothing started (no x, u or v due, or a step begun without the replicas): as blocking.
  if (!comm_.joinable()) return e_.finish_blocking(replicas, stop);
  return finish_started(replicas);
}

void SyncEngine::StepOverlapped::abandon() {
  if (comm_.joinable()) comm_.join();
  started_.clear();
  comm_error_ = nullptr;
}

bool SyncEngine::StepOverlapped::finish_started(std::span<Replica> replicas) {
  comm_.join();
  if (comm_error_) {
    const std::exception_ptr e = comm_error_;
    abandon();
    std::rethrow_exception(e);
  }
  for (Started& st : started_) {
    e_.averager_->complete_average(st.kind, st.views);
    const Fragment f = fragment_of(e_.due_, st.kind);
    const std::vector<std::span<float>> dst = state_views(replicas, st.kind, f.index, f.parts);
    if (dst.size() != st.views.size())
      throw Error("sync engine: " + std::to_string(dst.size()) +
                  " replicas at the end of a step that began with " +
                  std::to_string(st.views.size()));
    for (std::size_t w = 0; w < dst.size(); ++w)
      std::copy(st.views[w].begin(), st.views[w].end(), dst[w].begin());
    e_.apply(st.kind, replicas);
  }
  started_.clear();
  e_.reset_moments(replicas);
  return stop_agreed_;
}

SyncEngine::Delayed::Delayed(SyncEngine& engine, const StepOptions& opts)
    : Mode(engine),
      delayed_({opts.overlap == Overlap::kDelayedNaive, opts.delay, compresses_moments(opts),
                opts.outer}) {}

// The averager is left alone on steps with nothing due: a batch may be on the wire.
void SyncEngine::Delayed::begin(std::int64_t t, Averager& averager, std::span<Replica> replicas,
                                bool stop) {
  e_.due_ = e_.policy_.at(t);
  e_.global_due_ = e_.policy_.global_at(t);
  e_.t_ = t;
  Averager* job = &averager;
  if (const std::optional<SyncDecision> in_regions = e_.policy_.region_at(t)) {
    auto* regional = dynamic_cast<RegionalAverager*>(&averager);
    if (regional == nullptr)
      throw Error("sync engine: step " + std::to_string(t) +
                  " has averages inside regions, and the averager has no regions");
    e_.average_in_regions(*in_regions, *regional, replicas);
    job = &regional->job_level();
  }
  if (e_.global_due_.any()) {
    const DueViews d = e_.due_views(replicas, e_.global_due_, true);
    delayed_.start(t, d.due, d.fragment, d.parts, *job, stop, &averager);
  }
}

bool SyncEngine::Delayed::finish(std::span<Replica> replicas, bool) {
  delayed_.fold_due(e_.t_, replicas);
  return delayed_.stop_agreed();
}

}  // namespace desloc::sync
