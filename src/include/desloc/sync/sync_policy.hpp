// Which states are averaged across sites at step t: DES-LOC and its special cases
// (Iacob et al., arXiv 2505.22549, Alg. 1). Pure logic, no buffers: the trainer asks
// `at(t)` and hands the due states to an Averager before the local optimizer update.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "desloc/core/sync_schedule.hpp"
#include "desloc/sync/compression.hpp"

namespace desloc::sync {

using desloc::SyncDecision;
using desloc::SyncMethod;

// New periods from a parameter average on (sync.switches, or a re-plan while training): after
// step `after`, x is averaged every kx steps counted from `after`, u every ku and v every kv, all
// three in phase with that average. `after` must be a step x is averaged at.
struct PeriodSwitch {
  std::int64_t after = 0;
  std::int64_t kx = 0;
  std::int64_t ku = 0;  // desloc: 0 = 3 * kx; the other methods average u and v with x
  std::int64_t kv = 0;  // desloc: 0 = 6 * kx
  bool operator==(const PeriodSwitch&) const = default;
};

// The outer step on the parameter average (sync.outer): none, or DiLoCo's Nesterov step on
// x_ref - mean x.
enum class OuterStep : std::uint8_t { kNone, kNesterov };
constexpr std::string_view to_string(OuterStep o) {
  return o == OuterStep::kNesterov ? "nesterov" : "none";
}

// How the sites weigh in every average (sync.weights): by the tokens each trains on per step
// (a site with twice the ranks or batch counts twice), or alike.
enum class SiteWeights : std::uint8_t { kTokens, kEqual };
constexpr std::string_view to_string(SiteWeights w) {
  return w == SiteWeights::kEqual ? "equal" : "tokens";
}

// The most switches a job keeps (a checkpoint holds them in a fixed-size block).
inline constexpr std::size_t kMaxPeriodSwitches = 32;

struct SyncConfig {
  SyncMethod method = SyncMethod::kNone;  // see desloc/core/sync_schedule.hpp
  int sites = 1;                          // in-process virtual sites (M)
  std::int64_t kx = 32;                   // parameter-average period
  std::int64_t ku = 0;                    // first-moment period; 0 = 3 * kx (desloc only)
  std::int64_t kv = 0;                    // second-moment period; 0 = 6 * kx (desloc only)
  std::int64_t phase_x = 0;               // average x at steps t with (t - phase_x) mod kx == 0
  std::int64_t phase_u = 0;
  std::int64_t phase_v = 0;
  OuterStep outer = OuterStep::kNone;
  float outer_lr = 0.7f;
  float outer_momentum = 0.9f;
  SiteWeights weights = SiteWeights::kTokens;  // alike for sites alike ([[job.site]])
  std::int64_t join_step = 0;  // elastic join: grow to join_workers at the first sync from here on
  int join_sites = 0;
  // "none": a step's averages run after its gradient and block it. "step": the averages of x,
  // u and v due at step t start before its forward pass, from the values they hold then (final
  // until the update), and run while the gradient is computed; they finish before the update.
  // The numbers are the same bit for bit; up to one step of compute hides the wire time.
  // "delayed": an average of state s due at step t starts from s_t and the site trains on; at
  // step t + tau (before that step's update) it is folded in, keeping the local progress made
  // meanwhile: s <- s + c (mean(s_t) - s_t), c_x = 1, c_u = beta1^tau, c_v = beta2^tau
  // (docs/sync.md derives it). Up to tau + 1 steps of compute hide the wire time.
  // "delayed_naive": for comparison only, s <- mean(s_t) at step t + tau, losing the progress.
  Overlap overlap = Overlap::kNone;
  std::int64_t delay = 0;    // tau of every state (overlap = "delayed"), >= 1
  std::int64_t delay_u = 0;  // tau of u when it differs (0 = delay)
  std::int64_t delay_v = 0;  // tau of v when it differs (0 = delay)
  // P: each state's buffer is cut into P fragments (transport::block) whose averages are
  // staggered over the state's period (desloc/core/sync_schedule.hpp, due_fragment), so the
  // link carries a steady stream of 1/P-sized averages instead of one burst per period. The
  // bytes per period are the same. 1 = whole-buffer averages.
  int fragments = 1;
  int fragments_u = 0;  // desloc: u's fragment count (0 = fragments)
  int fragments_v = 0;  // desloc: v's fragment count (0 = fragments)
  // Codecs of the wide-area averages of x, u and v (compression.hpp): "fp32" sends the state
  // itself; "bf16", "int8", "int4", "int2" send its difference from the last mean, encoded.
  std::string codec_x = "fp32";
  std::string codec_u = "fp32";
  std::string codec_v = "fp32";
  int codec_block = static_cast<int>(kDefaultCodecBlock);  // elements per scale
  bool error_feedback = false;  // keep what quantisation dropped and send it next time
  // Hierarchical DES-LOC (with job.regions): the periods of the averages inside a region, each
  // dividing its job-wide period; 0 = one level. ku and kv default to 3 and 6 region_kx
  // (desloc); the other methods average u and v with x. A step due at both levels averages
  // over every site.
  std::int64_t region_kx = 0;
  std::int64_t region_ku = 0;
  std::int64_t region_kv = 0;
  // Period switches in force, in order of `after` (sync.switches; a re-plan appends to a
  // running job's SyncPolicy, and `desloc train` replays them from the config).
  std::vector<PeriodSwitch> switches;
  // Re-planning while training (networked jobs): the sites measure each job-wide average in the
  // control exchange that precedes the next one, and all switch periods at the same average
  // when the wide-area rate drifts (sync/replanner.hpp).
  bool replan = false;
  float replan_target = 0.0f;  // overhead aimed for; 0 = what the first averages measured
  float replan_drift = 2.0f;   // a rate this many times off the plan's triggers a re-plan
  int replan_syncs = 2;        // ... for this many job-wide averages in a row

  std::int64_t effective_ku() const { return ku > 0 ? ku : 3 * kx; }
  std::int64_t effective_kv() const { return kv > 0 ? kv : 6 * kx; }
  bool regional() const { return region_kx > 0; }
  std::int64_t effective_region_ku() const {
    if (method != SyncMethod::kDesloc) return region_kx;
    return region_ku > 0 ? region_ku : 3 * region_kx;
  }
  std::int64_t effective_region_kv() const {
    if (method != SyncMethod::kDesloc) return region_kx;
    return region_kv > 0 ? region_kv : 6 * region_kx;
  }
  bool averages_params() const { return desloc::averages_params(method); }
  bool overlaps() const { return overlap != Overlap::kNone; }
  bool delays() const { return desloc::delays(overlap); }
  std::int64_t effective_delay_u() const { return delay_u > 0 ? delay_u : delay; }
  std::int64_t effective_delay_v() const { return delay_v > 0 ? delay_v : delay; }
  // tau of x, u and v with overlap = "delayed" (or "delayed_naive"); all 0 otherwise.
  std::array<std::int64_t, 3> effective_delays() const {
    if (!delays()) return {};
    return {delay, effective_delay_u(), effective_delay_v()};
  }
  // The schedule these settings describe (ku and kv resolved), as the simulator takes it.
  SyncSchedule schedule() const;
  // The schedule of the averages inside a region (regional() only): the region periods, the
  // same method and phases, whole states.
  SyncSchedule region_schedule() const;
  // The schedule from `sw.after` on: its periods (ku and kv resolved), every phase at `after`.
  SyncSchedule schedule_after(const PeriodSwitch& sw) const;
  // The codecs by state (an unknown name reads as fp32: the config loader refuses it first).
  CompressionConfig compression() const;
};

class SyncPolicy {
 public:
  explicit SyncPolicy(SyncConfig cfg);  // cfg must already be validated
  // t is the 1-based number of the step being taken (the first update is t = 1).
  // A state with period K and phase p is due when t >= 1 and (t - p) mod K == 0. With regions,
  // a state is due when it is due at either level.
  SyncDecision at(std::int64_t t) const;
  // The averages due at t that span every site: without regions, at(t). Only these are a
  // barrier for the whole job (a region's averages wait for its own sites only).
  SyncDecision global_at(std::int64_t t) const { return schedule_at(t).at(t); }
  // The averages due inside the regions at t, on the regions' schedule alone (nullopt without
  // regions): with delayed averages the regions average these at the start of step t, and
  // the job-wide averages of global_at(t) start from their result.
  std::optional<SyncDecision> region_at(std::int64_t t) const {
    return region_ ? std::optional(region_->at(t)) : std::nullopt;
  }
  // The job-wide schedule in force at step t (the last switch with after < t, else the
  // config's periods).
  const SyncSchedule& schedule_at(std::int64_t t) const;
  const SyncConfig& config() const { return cfg_; }
  // Mean payload per step in units of the model size at the config's periods: 1 for DDP,
  // 1/Kx + 1/Ku + 1/Kv for DES-LOC.
  double state_syncs_per_step() const { return schedule_.state_syncs_per_step(); }

  // Every switch in force, the config's first.
  const std::vector<PeriodSwitch>& switches() const { return switches_; }
  // Appends a switch (a re-plan). Error when `after` is not past the last switch, when x is not
  // averaged at `after`, or beyond kMaxPeriodSwitches.
  void add_switch(const PeriodSwitch& sw);
  // The switches of a checkpoint (a resume): they must begin with the config's.
  void restore_switches(const std::vector<PeriodSwitch>& switches);

 private:
  SyncConfig cfg_;
  SyncSchedule schedule_;
  std::optional<SyncSchedule> region_;
  std::vector<PeriodSwitch> switches_;
  std::vector<SyncSchedule> after_;  // after_[i]: the schedule from switches_[i] on
};

}  // namespace desloc::sync
