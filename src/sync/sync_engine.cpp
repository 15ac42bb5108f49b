// The DES-LOC step order, shared by the trainer and every other driver of replicas.
#include "desloc/sync/sync_engine.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/sync/synced_step.hpp"
#include "desloc/transport/ring_order.hpp"
#include "overlap_modes.hpp"

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

std::vector<std::span<float>> state_views(std::span<Replica> replicas, optim::StateKind kind,
                                          int fragment, int fragments) {
  std::vector<std::span<float>> out = state_views(replicas, kind);
  if (fragments <= 1) return out;
  for (std::span<float>& s : out) {
    const transport::Range r = transport::block(s.size(), fragments, fragment);
    s = s.subspan(r.offset, r.count);
  }
  return out;
}

Fragment fragment_of(const SyncDecision& due, optim::StateKind kind) {
  switch (kind) {
    case optim::StateKind::kX:
      return {due.frag_x, due.parts_x};
    case optim::StateKind::kU:
      return {due.frag_u, due.parts_u};
    case optim::StateKind::kV:
      return {due.frag_v, due.parts_v};
    case optim::StateKind::kGrad:
      break;
  }
  return {0, 1};
}

void bound_momentum(std::span<Replica> replicas) {
  for (auto& r : replicas) {
    const optim::OptimizerConfig& c = r.opt->config();
    const double b1 = c.beta1, b2 = c.beta2;
    if (c.algorithm != optim::Algorithm::kAdamW || b1 * b1 >= b2) continue;
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

bool compresses_moments(const StepOptions& opts) {
  return opts.compression != nullptr &&
         (opts.compression->config().compresses(optim::StateKind::kU) ||
          opts.compression->config().compresses(optim::StateKind::kV));
}

StepOptions step_options(const SyncConfig& cfg, const optim::ClipConfig* clip, OuterNesterov* outer,
                         CompressionState* compression) {
  StepOptions o;
  o.clip = clip;
  o.outer = outer;
  o.compression = compression != nullptr && compression->active() ? compression : nullptr;
  o.overlap = cfg.overlap;
  const std::array<std::int64_t, 3> tau = cfg.effective_delays();  // x, u, v
  o.delay[static_cast<std::size_t>(optim::StateKind::kX)] = tau[0];
  o.delay[static_cast<std::size_t>(optim::StateKind::kU)] = tau[1];
  o.delay[static_cast<std::size_t>(optim::StateKind::kV)] = tau[2];
  return o;
}

SyncEngine::SyncEngine(const SyncPolicy& policy, StepOptions opts) : policy_(policy), opts_(opts) {
  switch (opts.overlap) {
    case Overlap::kNone:
      mode_ = std::make_unique<Blocking>(*this);
      break;
    case Overlap::kStep:
      mode_ = std::make_unique<StepOverlapped>(*this);
      break;
    case Overlap::kDelayed:
    case Overlap::kDelayedNaive:
      mode_ = std::make_unique<Delayed>(*this, opts);
      break;
  }
}

SyncEngine::~SyncEngine() { abandon(); }

void SyncEngine::abandon() { mode_->abandon(); }

void SyncEngine::drain(std::int64_t t, std::span<Replica> replicas) { mode_->drain(t, replicas); }

void SyncEngine::settle() { mode_->settle(); }

void SyncEngine::open(std::int64_t t, Averager& averager) {
  abandon();  // a step abandoned by an exception may have left averages behind
  averager_ = &averager;
  due_ = policy_.at(t);
  global_due_ = policy_.global_at(t);
  t_ = t;
  averager.begin_step(t);
  averager.set_levels(global_due_);
}

const SyncDecision& SyncEngine::begin(std::int64_t t, Averager& averager) {
  if (opts_.delays())
    throw Error("sync engine: delayed averages need the replicas at the start of step " +
                std::to_string(t));
  open(t, averager);
  return due_;
}

const SyncDecision& SyncEngine::begin(std::int64_t t, Averager& averager,
                                      std::span<Replica> replicas, bool stop) {
  mode_->begin(t, averager, replicas, stop);
  return due_;
}

// The due states in Alg. 1's order (g, x, u, v), each with its replicas' views.
SyncEngine::DueViews SyncEngine::due_views(std::span<Replica> replicas, const SyncDecision& due,
                                           bool compress) const {
  using optim::StateKind;
  DueViews d;
  for (const auto& [kind, is_due] :
       {std::pair{StateKind::kGrad, due.grad}, std::pair{StateKind::kX, due.x},
        std::pair{StateKind::kU, due.u}, std::pair{StateKind::kV, due.v}}) {
    if (!is_due) continue;
    const Fragment f = fragment_of(due, kind);
    d.views.push_back(state_views(replicas, kind, f.index, f.parts));
    d.due.push_back({kind, {}});
    d.fragment.push_back(f.index);
    d.parts.push_back(f.parts);
    // The gradient's codec is always fp32 (CompressionConfig has none for it), and so is a
    // region's average.
    const bool compressed = compress && opts_.compression != nullptr &&
                            opts_.compression->config().compresses(kind) && job_wide(kind);
    d.codec.push_back(compressed ? std::optional(opts_.compression->views(kind, f.index, f.parts))
                                 : std::nullopt);
  }
  // Spans into the inner vectors, which stay put when DueViews is moved (as do the codec
  // views the DueAverages point to: a moved vector keeps its elements).
  for (std::size_t k = 0; k < d.due.size(); ++k) {
    d.due[k].local = d.views[k];
    d.due[k].codec = d.codec[k] ? &*d.codec[k] : nullptr;
  }
  return d;
}

// What follows an average of `kind` in Alg. 1's order: the outer step after x, the momentum
// bound after u when v's same fragment is not averaged with it.
bool SyncEngine::job_wide(optim::StateKind kind) const {
  if (!policy_.config().regional()) return true;
  switch (kind) {
    case optim::StateKind::kX:
      return global_due_.x;
    case optim::StateKind::kU:
      return global_due_.u;
    case optim::StateKind::kV:
      return global_due_.v;
    case optim::StateKind::kGrad:
      break;
  }
  return true;
}

void SyncEngine::apply(optim::StateKind kind, std::span<Replica> replicas) const {
  if (kind == optim::StateKind::kX && opts_.outer != nullptr && !replicas.empty() &&
      job_wide(kind)) {
    // On the fragment just averaged (the whole of x without fragments).
    const Fragment f = fragment_of(due_, kind);
    const std::vector<std::span<float>> x = state_views(replicas, kind, f.index, f.parts);
    opts_.outer->step(x[0], static_cast<std::size_t>(x[0].data() - replicas[0].x.data()));
    for (std::size_t w = 1; w < x.size(); ++w) std::copy(x[0].begin(), x[0].end(), x[w].begin());
    // A compressed x then sends its difference from the outer step's parameters, which every
    // site shares: the local progress since the outer step, DiLoCo's pseudo-gradient.
    if (opts_.compression != nullptr && opts_.compression->config().compresses(kind)) {
      const std::span<float> ref = opts_.compression->views(kind, f.index, f.parts).reference;
      std::copy(x[0].begin(), x[0].end(), ref.begin());
    }
  }
  if (kind == optim::StateKind::kU &&
      !(due_.v && due_.frag_v == due_.frag_u && due_.parts_v == due_.parts_u))
    bound_momentum(replicas);
  // Compressed moments: the quantised v can be smaller than the v the u was bounded by (or
  // averaged with), so u is bounded again by the v it will be divided by.
  if (kind == optim::StateKind::kV && compresses_moments(opts_)) bound_momentum(replicas);
}

void SyncEngine::average_in_regions(const SyncDecision& due, RegionalAverager& regional,
                                    std::span<Replica> replicas) const {
  if (!(due.x || due.u || due.v)) return;
  const DueViews d = due_views(replicas, due, false);
  regional.average_in_regions(t_, d.due);
  // As after a blocking average (apply): u averaged without v is bounded, and with compressed
  // moments u is bounded after every average of v.
  if ((due.u && !due.v) || (due.v && compresses_moments(opts_))) bound_momentum(replicas);
}

void SyncEngine::reset_moments(std::span<Replica> replicas) const {
  if (!due_.reset_uv) return;
  for (auto& r : replicas) {
    auto& s = r.opt->state();
    std::fill(s.u.begin(), s.u.end(), 0.0f);
    std::fill(s.v.begin(), s.v.end(), 0.0f);
    if (opts_.reset_step_count) s.t = 0;
  }
}

bool SyncEngine::finish(std::span<Replica> replicas, bool stop) {
  return mode_->finish(replicas, stop);
}

bool SyncEngine::finish_blocking(std::span<Replica> replicas, bool stop) {
  if (!due_.any()) return false;
  // Every view the averages use, taken once: the exchange judges exactly these payloads.
  const DueViews d = due_views(replicas, due_, true);
  const bool stop_agreed = averager_->exchange_control(d.due, stop);
  for (const DueAverage& a : d.due) {
    if (a.codec != nullptr) averager_->set_codec(a.kind, *a.codec);
    averager_->average(a.kind, a.local);
    apply(a.kind, replicas);
  }
  reset_moments(replicas);
  return stop_agreed;
}

std::optional<SyncMeasure> SyncEngine::take_measure(Averager& averager) {
  return mode_->take_measure(averager);
}

double SyncEngine::comm_cpu_seconds() const { return mode_->comm_cpu_seconds(); }
double SyncEngine::wire_seconds() const { return mode_->wire_seconds(); }
double SyncEngine::control_seconds() const { return mode_->control_seconds(); }

float SyncEngine::update(std::span<Replica> replicas, float lr) const {
  float grad_norm = 0.0f;
  for (auto& r : replicas) {
    grad_norm =
        opts_.clip != nullptr ? optim::clip_gradient(r.g, *opts_.clip) : optim::global_norm(r.g);
    r.opt->step(r.x, r.g, lr);
  }
  return grad_norm;
}

StepReport run_synced_step(std::int64_t t, const SyncPolicy& policy, Averager& averager,
                           std::span<Replica> replicas,
                           const std::function<void(std::size_t)>& grad, float lr,
                           const StepOptions& opts) {
  SyncEngine engine(policy, opts);
  StepReport report;
  report.due = engine.begin(t, averager);
  for (std::size_t w = 0; w < replicas.size(); ++w) grad(w);
  engine.finish(replicas);
  report.grad_norm = engine.update(replicas, lr);
  return report;
}

}  // namespace desloc::sync
