// Re-planning while training (sync.replan, issue 15): the periods Kx, Ku, Kv re-chosen when the
// wide-area rate drifts from the one they were chosen at. A pure function of the measurements:
// every rank of a networked job receives the same measurement table in the control exchange
// that opens each job-wide average (CollectiveAverager), feeds it to its own Replanner, and so
// takes the same decision at the same average without a message of its own.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "desloc/core/sync_schedule.hpp"

namespace desloc::sync {

// What the sites measured of the job-wide average before this one (the control exchange's
// measurement rows, aggregated alike on every rank).
struct SyncMeasure {
  double state_seconds = 0.0;    // one state's wide-area average, the slowest rank's mean
  double compute_seconds = 0.0;  // one step's compute (forward, backward, update), slowest site
  double bytes_per_s = 0.0;      // wide-area bytes a site sent per second of averaging, slowest
  bool valid() const { return state_seconds > 0.0 && compute_seconds > 0.0; }
};

struct ReplanOptions {
  double target = 0.0;  // overhead aimed for; 0 = the overhead the reference averages measured
  double drift = 2.0;   // a state_seconds this many times the reference's (or 1/drift) is off
  int syncs = 2;        // off this many averages in a row triggers a re-plan; also the reference
  std::int64_t min_kx = 1;        // delayed averages need a period above their delay
  std::int64_t max_kx = 1 << 30;  // train.steps: a longer period averages never again
  // How much of an average's wide-area time a step hides: 0 (blocking), 1 step (overlap =
  // "step"), tau + 1 steps (overlap = "delayed").
  double hidden_steps = 0.0;
};

struct Periods {
  std::int64_t kx = 0, ku = 0, kv = 0;
  bool operator==(const Periods&) const = default;
};

struct ReplanDecision {
  Periods periods;
  double state_seconds = 0.0;      // the drifted measurement the plan priced (median of the run)
  double compute_seconds = 0.0;    // one step's compute then (median of the run)
  double reference_seconds = 0.0;  // what the periods in force were chosen at
  double bytes_per_s = 0.0;
  double target = 0.0;
  double overhead_before = 0.0;   // the periods in force at the new measurement
  double overhead = 0.0;          // the new periods, predicted
  double predicted_step_s = 0.0;  // compute step x (1 + overhead)
  std::string reason;
};

// Overhead of averaging `periods` of `method` against compute, each average of one state
// taking `state_seconds`, with `hidden_steps` of compute hiding each sync's wire time: over one
// cycle of the longest period, every parameter average costs max(0, states due x state_seconds
// - hidden_steps x compute_seconds). When Ku or Kv is no multiple of Kx (a config may say so),
// each state's averages are priced on their own.
double replan_overhead(SyncMethod method, const Periods& periods, double state_seconds,
                       double compute_seconds, double hidden_steps);

class Replanner {
 public:
  // `base`: the config's periods (ku and kv resolved). A plan keeps Ku and Kv whole multiples
  // of Kx, their ratios to it rounded (3 and 6 by default). Every rank derives them from the
  // config, so every rank plans alike whatever it went through (a resume, a rejoin).
  // `region`, with regions (job.regions): the periods inside a region (all 0: no regions). A
  // plan then keeps each job-wide period a whole multiple of its region period and Kx longer
  // than the region's, as the config's own periods must be.
  Replanner(SyncMethod method, Periods base, ReplanOptions options, Periods region = {});

  // One job-wide parameter average's control exchange brought `m` (the average before it).
  // The first is ignored; the medians of the next reference_syncs() give the reference state
  // time and compute (and the target, unless given). Returns the new periods when the drift
  // held for options.syncs averages in a row and the plan at the medians of that run differs
  // from the periods in force (which it then becomes). After a decision the reference is
  // measured afresh (the target stays).
  std::optional<ReplanDecision> observe(const SyncMeasure& m);
  // The periods in force changed under it: measure afresh. A new membership epoch or a resume
  // forgets the target too (every rank of the job resets at the same step, so they stay
  // alike; with the default implicit target, a failure during a slow spell makes that spell
  // the new reference); `keep_target` keeps it (a switch every rank made).
  void reset(Periods in_force, bool keep_target = false);
  const Periods& periods() const { return periods_; }
  // Kx with Ku and Kv in the base ratios (the other methods: all three Kx).
  Periods periods_of(std::int64_t kx) const;
  // At least 3, so that one outlier cannot set the reference.
  std::size_t reference_syncs() const { return static_cast<std::size_t>(std::max(3, opt_.syncs)); }
  double target() const { return target_; }
  // The smallest Kx (with Ku, Kv in the base ratios) whose overhead at `state_seconds` is at
  // most `target`, within [min_kx, max_kx], a multiple of kx_step(). A Kx near max_kx leaves few
  // averages to measure a recovery by: the job may not re-plan back before it ends.
  Periods plan(double state_seconds, double compute_seconds, double target) const;
  // 1 without regions; with them the smallest multiple of the region's Kx whose Ku and Kv (in
  // the base ratios) are multiples of the region's.
  std::int64_t kx_step() const { return kx_step_; }

 private:
  SyncMethod method_;
  ReplanOptions opt_;
  std::int64_t ratio_u_ = 3, ratio_v_ = 6;
  std::int64_t kx_step_ = 1;
  Periods periods_;
  double target_ = 0.0;
  double reference_ = 0.0;           // state_seconds the periods in force were chosen at
  std::vector<SyncMeasure> warmup_;  // the first measurements, before a reference exists
  std::vector<SyncMeasure> off_;     // the current run of drifted measurements
  int direction_ = 0;                // +1 slower, -1 faster
  bool skipped_first_ = false;
};

}  // namespace desloc::sync
