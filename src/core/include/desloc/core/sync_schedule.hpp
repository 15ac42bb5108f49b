// The DES-LOC schedule as pure logic (arXiv 2505.22549, Alg. 1, line 2): the synchronisation
// methods, and which states are due at step t. One definition, shared by the trainer
// (sync::SyncPolicy) and the simulator (topology::simulate), so a prediction counts exactly the
// averages a run makes.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace desloc {

enum class SyncMethod : std::uint8_t {
  kNone,       // sites never communicate (independent runs; the single-site default)
  kDdp,        // the gradient is averaged every step
  kFavg,       // FAVG+OPT / Local SGD with local Adam: x every kx, u and v stay local
  kFavgReset,  // x every kx; u and v are zeroed after each parameter average
  kLocalAdam,  // x, u and v every kx
  kDesloc,     // x every kx, u every ku, v every kv, each with its own phase
};
inline constexpr std::array<SyncMethod, 6> kSyncMethods{
    SyncMethod::kNone,      SyncMethod::kDdp,       SyncMethod::kFavg,
    SyncMethod::kFavgReset, SyncMethod::kLocalAdam, SyncMethod::kDesloc};

// The config's spelling: "none", "ddp", "favg", "favg_reset", "local_adam", "desloc".
std::string_view to_string(SyncMethod m);
std::optional<SyncMethod> parse_sync_method(std::string_view name);

// How an average meets the step (sync.overlap), parsed once: the config, the sync engine and
// the planner's and simulator's models of a job all take this one type.
enum class Overlap : std::uint8_t {
  kNone,          // "none": averages block the step
  kStep,          // "step": they run during the step's gradient, finish before its update
  kDelayed,       // "delayed": folded in tau steps later, keeping the local progress
  kDelayedNaive,  // "delayed_naive": the stale mean replaces the state tau steps later
};
inline constexpr std::array<Overlap, 4> kOverlaps{Overlap::kNone, Overlap::kStep, Overlap::kDelayed,
                                                  Overlap::kDelayedNaive};
// The config's spelling: "none", "step", "delayed", "delayed_naive".
std::string_view to_string(Overlap o);
std::optional<Overlap> parse_overlap(std::string_view name);
// Whether averages are folded in steps after they start (delayed and delayed_naive).
constexpr bool delays(Overlap o) { return o == Overlap::kDelayed || o == Overlap::kDelayedNaive; }

// Whether the method averages x (every method but none and ddp).
constexpr bool averages_params(SyncMethod m) {
  return m != SyncMethod::kNone && m != SyncMethod::kDdp;
}
// Whether the method shares u and v across sites (a joining site can start from their mean).
constexpr bool shares_moments(SyncMethod m) {
  return m == SyncMethod::kLocalAdam || m == SyncMethod::kDesloc;
}

// A state with period K and phase p is due at the 1-based step t when t >= 1 and
// (t - p) mod K == 0.
bool due_at(std::int64_t t, std::int64_t period, std::int64_t phase);

// With P fragments (sync.fragments) a state of period K and phase p is cut into P fragments;
// fragment f is due at the 1-based step t when t >= 1 and (t - p - floor(f K / P)) mod K == 0,
// so the fragments' averages are staggered over the period and fragment 0 keeps the unfragmented
// schedule. P must not exceed K (then at most one fragment of a state is due per step). Returns
// the due fragment, or -1 when none is.
int due_fragment(std::int64_t t, std::int64_t period, std::int64_t phase, int fragments);

// The states due at one step. `reset_uv` zeroes u and v after the parameter average.
struct SyncDecision {
  bool grad = false;
  bool x = false;
  bool u = false;
  bool v = false;
  bool reset_uv = false;
  // The fragment due of x, u and v (0 without fragments) and how many each state is cut into.
  // Fragment f of P of a buffer of n elements is its block f of P (transport::block).
  int frag_x = 0, frag_u = 0, frag_v = 0;
  int parts_x = 1, parts_u = 1, parts_v = 1;
  bool any() const { return grad || x || u || v; }
  int states() const { return int(grad) + int(x) + int(u) + int(v); }
};

struct SyncSchedule {
  SyncMethod method = SyncMethod::kNone;
  std::int64_t kx = 1, ku = 3, kv = 6;  // periods in steps (ku, kv: desloc only)
  std::int64_t phase_x = 0, phase_u = 0, phase_v = 0;
  int fragments = 1;  // P: each state's average staggered over its period in P fragments
  // desloc: u's and v's own counts (0 = fragments). With P Ku / Kx and P Kv / Kx every state
  // has a fragment due on the same steps, each batch carrying the same bytes.
  int fragments_u = 0, fragments_v = 0;
  // The fragment counts of u and v the method uses (only desloc has its own).
  int parts_u() const {
    return method == SyncMethod::kDesloc && fragments_u > 0 ? fragments_u : fragments;
  }
  int parts_v() const {
    return method == SyncMethod::kDesloc && fragments_v > 0 ? fragments_v : fragments;
  }

  SyncDecision at(std::int64_t t) const;
  // Mean payload per step in units of the model size: 1 for DDP, 1/Kx + 1/Ku + 1/Kv for
  // DES-LOC, 3/Kx for Local Adam, 1/Kx for the favg methods (fragments change none of it).
  double state_syncs_per_step() const;
};

}  // namespace desloc
