// The cross-site half of one DES-LOC step (DESIGN.md, "The algorithm"; arXiv 2505.22549,
// Alg. 1) for the replicas this process holds:
//   begin(t)   the states due at t. x, u and v are final from here until the update, so an
//              average of them may start now; the gradient is still taken at the un-averaged x.
//   finish()   after every replica's gradient: one control exchange (each due state's payload
//              health and each site's stop request), then the due averages in Alg. 1's order:
//              the gradient (DDP); x, then the outer step; u, then the momentum bound; v;
//              favg_reset's zeroing of u and v.
//   update()   clipping and every replica's local optimizer step.
// With StepOptions::overlap (sync.overlap = "step") the averages of x, u and v start in
// begin(): the control exchange runs there, and the wide-area halves of the averages
// (Averager::average_across_sites) run on a communication thread, on copies, while the
// gradient is computed; finish() waits for them, completes them on the caller's thread and
// folds them in, in Alg. 1's order. Same inputs, same arithmetic, same order: the result equals
// the blocking step's bit for bit. The gradient's average (DDP) always blocks.
// With Overlap::kDelayed (sync.overlap = "delayed") the averages started at step t are folded
// in at step t + tau, keeping the progress made meanwhile (DelayedAverages), and the control
// exchange's wide-area half runs on the thread with them; the owner drains them before a
// checkpoint and settles them before using the averager's groups itself. With regions (a
// RegionalAverager) only the job-wide averages stream: the regions average their sites at the
// start of each step they are due (blocking: their links are fast), before the job-wide
// averages of that step take their snapshots, so every site of a region starts from the same
// snapshot and folds in the same correction.
// Each mode is one class behind begin / finish / abandon / drain / settle, owning its half of
// the averager protocol (src/sync/overlap_modes.hpp); the engine keeps what they share.
#pragma once

#include <array>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "desloc/core/cpu_time.hpp"
#include "desloc/optim/optimizer.hpp"
#include "desloc/sync/averager.hpp"
#include "desloc/sync/compression.hpp"
#include "desloc/sync/delayed_averages.hpp"
#include "desloc/sync/outer_optimizer.hpp"
#include "desloc/sync/regional_averager.hpp"
#include "desloc/sync/sync_policy.hpp"

namespace desloc::sync {

struct Replica {
  std::span<float> x;               // parameters
  std::span<float> g;               // gradient buffer, filled before SyncEngine::finish
  optim::Optimizer* opt = nullptr;  // holds u and v
};

using desloc::Overlap;  // sync.overlap (desloc/core/sync_schedule.hpp)

struct StepOptions {
  const optim::ClipConfig* clip = nullptr;  // nullptr = no clipping
  OuterNesterov* outer = nullptr;           // nullptr = plain parameter averaging
  bool reset_step_count = false;            // favg_reset: also restart bias correction
  // The references and error feedback of compressed states (sync.codec_*); nullptr or
  // inactive: every average is fp32. Must outlive the engine.
  CompressionState* compression = nullptr;
  Overlap overlap = Overlap::kNone;
  std::array<std::int64_t, 4> delay{};  // tau by StateKind (kDelayed, kDelayedNaive)
  bool delays() const { return desloc::delays(overlap); }
};

// Whether u or v travels compressed: then u is bounded after every average of v (the quantised
// v can fall below the v that bounded u), and delayed folds of u are always bounded.
bool compresses_moments(const StepOptions& opts);

// The StepOptions a config describes: its overlap mode and delays (favg_reset's restart of the
// step count is the caller's).
StepOptions step_options(const SyncConfig& cfg, const optim::ClipConfig* clip, OuterNesterov* outer,
                         CompressionState* compression = nullptr);

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
// Fragment f of P of them (sync.fragments): each buffer's block f of P (transport::block).
std::vector<std::span<float>> state_views(std::span<Replica> replicas, optim::StateKind kind,
                                          int fragment, int fragments);
// Which fragment of `kind` a step's decision averages, of how many (0 of 1 for the gradient).
struct Fragment {
  int index = 0;
  int parts = 1;
};
Fragment fragment_of(const SyncDecision& due, optim::StateKind kind);

class SyncEngine {
 public:
  // `policy` must outlive the engine.
  explicit SyncEngine(const SyncPolicy& policy, StepOptions opts = {});
  ~SyncEngine();
  SyncEngine(const SyncEngine&) = delete;
  SyncEngine& operator=(const SyncEngine&) = delete;

  // Opens step t (1-based) on `averager`, which must stay alive until finish().
  const SyncDecision& begin(std::int64_t t, Averager& averager);
  // The same, and with StepOptions::overlap also the control exchange (`stop` is this
  // process's stop request) and the start of the due averages of x, u and v, from the values
  // `replicas` hold now. Those must not change before finish(); the gradient may.
  const SyncDecision& begin(std::int64_t t, Averager& averager, std::span<Replica> replicas,
                            bool stop);
  // Runs the step's control exchange and due averages (or completes those begin() started);
  // every replica's g must hold its gradient. `stop` is this process's stop request; returns
  // true when any site of the job asked to stop (known only on steps with averages: false
  // otherwise; with delayed averages from the step their batch was settled on, and from then
  // on). An average that failed on the communication thread throws here.
  bool finish(std::span<Replica> replicas, bool stop = false);
  // Waits for averages begin() started and drops them, and any error they raised: the step is
  // being abandoned (a peer failed and the job recovers from its last common state). Delayed
  // averages in flight are dropped too.
  void abandon();
  // Delayed averages: after step t's update, folds every one in flight (before a checkpoint,
  // at the last step), so the state written holds nothing in flight. A no-op otherwise.
  void drain(std::int64_t t, std::span<Replica> replicas);
  // Delayed averages: waits for the batch on the wire, so that the averager's groups are free
  // for someone else (the evaluation's exchange). A no-op otherwise.
  void settle();
  // What the latest control exchange measured for re-planning (Averager::take_measure; with
  // delayed averages the latest exchange settled, whose wide-area half ran on the thread).
  std::optional<SyncMeasure> take_measure(Averager& averager);
  // Clipping, then each replica's optimizer step at learning rate lr. Returns the global norm
  // of the last replica's gradient before clipping.
  float update(std::span<Replica> replicas, float lr) const;

  const SyncDecision& due() const { return due_; }
  // CPU seconds of the engine's communication threads so far (sync.overlap "step" and
  // "delayed"; the averager's own helpers apart: Averager::helper_cpu_seconds).
  double comm_cpu_seconds() const;
  // Wall seconds the averages started on the engine's communication threads spent on the
  // wide-area wire so far (each thread's span, added when it ends; 0 when averages block).
  double wire_seconds() const;
  // Of wire_seconds(), the delayed batches' control exchanges (sync.overlap "step" exchanges
  // its control on the compute's thread, before the wire).
  double control_seconds() const;

 private:
  // One class per overlap mode, each with its half of the averager protocol (src/sync/
  // overlap_modes.hpp).
  class Mode;
  class Blocking;
  class StepOverlapped;
  class Delayed;

  struct DueViews {
    std::vector<std::vector<std::span<float>>> views;  // per due state, its replicas' fragment
    std::vector<DueAverage> due;                       // the same, as the averager takes them
    std::vector<int> fragment, parts;                  // per due state, its fragment of parts
    std::vector<std::optional<CodecViews>> codec;      // per due state, when compressed
  };
  // The states `due` decides, each with its replicas' views and, where `compress` and its codec
  // says so, its codec views.
  DueViews due_views(std::span<Replica> replicas, const SyncDecision& due, bool compress) const;
  // Delayed averages with regions: step t_'s averages inside the regions (`due`), blocking,
  // then the momentum bound they call for.
  void average_in_regions(const SyncDecision& due, RegionalAverager& regional,
                          std::span<Replica> replicas) const;
  // Opens step t on `averager` (after abandoning what a failed step left): the due states.
  void open(std::int64_t t, Averager& averager);
  // The control exchange and the due averages, in Alg. 1's order, on the caller's thread.
  bool finish_blocking(std::span<Replica> replicas, bool stop);
  void apply(optim::StateKind kind, std::span<Replica> replicas) const;
  void reset_moments(std::span<Replica> replicas) const;
  // Whether the step's average of `kind` spans every site: always without job.regions; with
  // them, only on the job-wide schedule's steps (the others average inside each region). Codecs
  // and the outer step belong to the job-wide averages: a region's average is fp32 and leaves
  // the outer step's parameters and the codecs' references, which every site shares, alone.
  bool job_wide(optim::StateKind kind) const;

  const SyncPolicy& policy_;
  StepOptions opts_;
  Averager* averager_ = nullptr;
  SyncDecision due_;
  SyncDecision global_due_;  // of due_, the averages that span every site (policy.global_at)
  std::int64_t t_ = 0;       // the step begin() opened
  std::unique_ptr<Mode> mode_;
};

}  // namespace desloc::sync
