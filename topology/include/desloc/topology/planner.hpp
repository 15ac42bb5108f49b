// The planner: from a measured topology and a job, the wide-area schedule (ring order, with
// star schedules priced for comparison), the periods Kx, Ku, Kv, their phases, and why.
//
// Cost model (alpha-beta, per directed link): a ring all-reduce of P bytes over n sites takes
// 2(n-1) steps, each moving P/n bytes over every ring link at once, so
//   T_ring = 2(n-1) * max over ring links (latency + P / (n * bandwidth)).
// With two lanes (transport.lanes = 2, 3+ sites) a part s of P goes round the ring and the rest
// round the reversed ring at the same time, on the links' other direction:
// T = max(T_ring(s P), T_reversed((1 - s) P)). The plan weighs s by capacity: the s where the
// two lanes finish together (transport.lane_share; 0.5 where both directions are alike).
// Sharding over R ranks per site changes nothing: the R wide-area groups share each link.
// A star at root r (every other site sends P to r, r sends the sum back) takes
//   T_star = max_leaf (latency + P / bw(leaf -> r)) + max_leaf (latency + P / bw(r -> leaf)).
// Without overlap a sync blocks every site, so over one Kx window the overhead is
//   T_sync * (1/Kx + 1/Ku + 1/Kv) / step,  step = the slowest site's compute step.
// With delayed averages (sync.overlap = "delayed") an average blocks no step (its control
// exchange, about half a ring all-reduce's latency, runs with it on the communication thread),
// as long as it leaves the wire within tau + 1 steps of compute and before the next one
// starts: tau = ceil((T_exchange + T_sync) (1 + target) / step) - 1, and the phases keep the
// averages a third of an x window apart, so floor(Kx / 3) * step >= T_sync (1 + target) and
// Kx > tau. The overhead reported is simulate()'s for the plan.
// Streaming (delayed averages cut into P fragments, sync.fragments): a fragment's average moves
// 1/P of a state, so it leaves the wire P times sooner and tau shrinks with it. The planner
// tries every Kx below the whole-average plan's, each with the fragment counts P that divide
// it (up to 64) and three placements of u's and v's fragments: as many as x's, on x's steps or
// between them, or a P and b P of them (Ku = a Kx, Kv = b Kx) so that one of each lands on
// every x fragment's step. tau is what the largest batch of fragments due at one step needs,
// and `simulate` (one batch on the wire at a time, as the engine runs them) must predict an
// overhead within target. The smallest such Kx wins, then the smallest tau, then the fewest
// fragments.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "desloc/topology/topology.hpp"

namespace desloc::topology {

// How the averages a plan prices meet the steps: blocking (sync.overlap = "none"), under any
// number of following steps (the what-if of `desloc plan --overlap`; sync.overlap = "step"
// hides at most one), or delayed (sync.overlap = "delayed", whole or in fragments).
enum class PlanMode : std::uint8_t { kBlocking, kUnbounded, kDelayed };

struct PlanRequest {
  double state_bytes = 0;         // bytes of one state buffer (4 x parameters)
  double target_overhead = 0.05;  // communication time / compute time
  double beta1 = 0.9;             // the local optimizer's moment decays, for Ku and Kv
  double beta2 = 0.95;
  std::int64_t steps = 0;  // train.steps: Kx may not exceed it
  PlanMode mode = PlanMode::kBlocking;
  // With delayed: 0 = the planner chooses the fragment count (1 = whole averages), P > 0 = use
  // exactly P.
  int fragments = 0;
  // With delayed: the largest tau a plan may use (0 = any). A delay costs loss (docs/sync.md);
  // this trades a longer period for a shorter delay.
  std::int64_t max_delay = 0;
  // With delayed: how many steps of period one step of delay costs the model. The plan
  // minimises Kx + delay_weight * tau among those within the target (the least Kx on a tie);
  // 0 = the least Kx, then the least tau. 8 fits the e2e bed's model (docs/topology.md).
  double delay_weight = 8.0;
  int lanes = 1;  // transport.lanes, already reduced by effective_lanes()
  // Compressed averages (sync.codec_*), by state x, u, v: wire bytes per fp32 byte, and the
  // seconds of codec work one site spends on one average of the whole state. The planner
  // prices a state's average as its encoded bytes over the ring plus that time; Kx, Ku and Kv
  // keep their ratios, so the three are weighted 1, Kx / Ku and Kx / Kv.
  std::array<double, 3> wire_ratio{1.0, 1.0, 1.0};
  std::array<double, 3> codec_s{};
  std::string codec_keys;  // the [sync] codec lines the config fragment repeats
  // Hierarchical DES-LOC with delayed averages (plan_regions): the regions, each in its ring
  // order, and their x period. Kx is then a multiple of region_kx, u's and v's phases lie
  // within the regions' periods (a Kx and b Kx, as the job-wide ones), and the simulated
  // overhead includes the regions' averages (blocking, fp32, at the step's start), which take
  // region_overhead beside the target.
  std::vector<std::vector<std::string>> regions;
  std::int64_t region_kx = 0;
  double region_overhead = 0;
};

struct Schedule {
  std::string kind;                // "ring" or "star"
  std::vector<std::string> order;  // ring order, or {root} for a star
  int lanes = 1;                   // rings: 2 = also the reversed ring
  double lane_share = 0.5;         // with 2 lanes: the part of each shard on the ring
  double seconds = 0;              // predicted all-reduce time of one state
  double bottleneck_bps = 0;       // slowest link used, payload bytes/s
  std::string describe() const;    // "ring A -> B -> C -> A [both directions]" or "star at B"
};

struct Plan {
  Schedule chosen;                   // the best ring: the schedule desloc's transport runs
  std::vector<Schedule> candidates;  // the best ring per direction class, and every star
  double step_s = 0;                 // slowest site's compute step
  std::int64_t kx = 0, ku = 0, kv = 0;
  std::int64_t phase_x = 0, phase_u = 0, phase_v = 0;
  std::int64_t delay = 0;  // sync.delay (with PlanRequest::delayed), else 0
  int fragments = 1;       // sync.fragments
  int fragments_u = 0;     // sync.fragments_u and fragments_v (0: as x)
  int fragments_v = 0;
  double overhead = 0;  // predicted, at the chosen periods
  std::vector<std::string> explanation;
  // Where the periods leave convergence: set when Kx is beyond what the paper validated
  // (kValidatedKx), so the sites average rarely and train nearly alone.
  std::vector<std::string> warnings;
  std::string config_fragment;  // [sync] and [job] keys that launch and worker accept
  PlanRequest request;          // what it answers (plan_regions plans again from it)
};

// The longest parameter period DES-LOC's convergence was shown at (arXiv 2505.22549: Kx up to
// 256, with Ku = 3 Kx and Kv = 6 Kx). A plan beyond it is still printed, with a warning.
inline constexpr std::int64_t kValidatedKx = 256;

// Half-life in steps of an exponential moving average with decay beta: ln 0.5 / ln beta.
double half_life(double beta);

// Wide-area bytes each of n sites sends for one ring all-reduce of `bytes`: 2 (n - 1) / n of
// them (none alone).
double site_bytes(double bytes, std::size_t n);
// Predicted all-reduce time of `bytes` over `order` as a ring / as a star at `root`.
double ring_seconds(const Topology& t, const std::vector<std::string>& order, double bytes,
                    int lanes = 1, double lane_share = 0.5);
// The lane share (a multiple of 0.01 in [0.01, 0.99]) at which the ring and its reverse finish
// `bytes` together: the minimax of the two lanes' times. 0.5 where both directions are alike.
double balanced_lane_share(const Topology& t, const std::vector<std::string>& order, double bytes);
double star_seconds(const Topology& t, const std::string& root, double bytes);
// A delayed average's control exchange over `order`: an all-gather of a few bytes per site,
// half a ring all-reduce's hops, on the wire ahead of the averages it opens.
double exchange_seconds(const Topology& t, const std::vector<std::string>& order);

// Overhead of periods (kx, ku, kv) for a sync time and step time, with or without overlap.
double overhead(double sync_s, double step_s, std::int64_t kx, std::int64_t ku, std::int64_t kv,
                bool overlap);

// Hierarchical DES-LOC beside a flat plan (issue 15): the period of the averages inside the
// regions, each over its own ring (one lane), at the same overhead target. Blocking: the flat
// plan's Kx rounded up to a multiple of it for the job-wide averages. Delayed (the flat plan's
// request): the job-wide averages planned again with the regions (PlanRequest::regions),
// streaming when fragments help, so one hierarchical streaming plan comes out (`plan`).
struct RegionPlan {
  std::vector<std::vector<std::string>> regions;
  double region_seconds = 0;  // the slowest region's all-reduce of one state
  std::int64_t region_kx = 0, kx = 0;
  double region_overhead = 0;  // the regions' averages against compute, at region_kx
  bool worthwhile = false;     // region_kx < kx: the regions average more often than the flat plan
  std::vector<std::string> explanation;
  std::string config_fragment;  // blocking: the keys to add to the flat plan's
  // Delayed: the whole hierarchical plan (its config_fragment complete), when one meets the
  // target; its explanation says why not otherwise.
  std::optional<Plan> plan;
};
RegionPlan plan_regions(const Topology& t, const Plan& flat,
                        const std::vector<std::vector<std::string>>& regions);

// ConfigError when the request is invalid (no bytes, target <= 0) or the target cannot be met
// within req.steps; that message says which Kx the target needs and the overhead at the
// largest Kx allowed.
Plan make_plan(const Topology& t, const PlanRequest& req);

// What a plan costs the model, in steps of period: Kx + weight * tau (tau = 0 when blocking;
// PlanRequest::delay_weight). Delayed plans, `--auto` and `--codecs auto` all choose by it.
double delay_score(std::int64_t kx, std::int64_t tau, double weight);

}  // namespace desloc::topology
