// Delayed averages (sync.overlap = "delayed"): an average of state s due at step t starts from
// the snapshot s_t and runs on a communication thread while the site trains on; before step
// t + tau's update it is folded in, keeping the local progress made since the snapshot:
//   s <- s + c_s (mean(s_t) - s_t),   c_x = 1, c_u = beta1^n, c_v = beta2^n,
// n the optimizer updates applied since the snapshot (tau, or fewer when drained early). The
// moments are linear recurrences, u <- beta1 u + (1 - beta1) g, so a change d to u at the
// snapshot has become beta1^n d after n updates; x carries a change forward unchanged (weight
// decay's factor (1 - lr wd) per step is left out). v stays non-negative: v - beta2^n v_t is
// what the updates added, >= 0, and mean(v_t) >= 0 (a float rounding below 0 is clamped).
// docs/sync.md derives it. The naive delay (`naive`) sets s <- mean(s_t), losing the progress:
// the comparison arXiv 2502.12996 reports as clearly worse. With an outer step (Options::outer)
// mean(x_t) is first replaced by the outer step's result on it, as a blocking average's is.
//
// With fragments (sync.fragments = P) each average is one fragment of its state; fragments of
// the same state started at different steps may wait for their folds together (they cover
// disjoint elements), but a fragment is never started again before its last average was folded.
//
// One batch of averages (the states due at one step) is on the wire at a time: a batch that
// starts while the previous one is still travelling waits for it. The control exchange's
// wide-area half (Averager::close_control) and the averages' (average_across_sites) run on the
// thread, so the step waits for no wide-area round trip; the exchange's half inside the site
// and the intra-site completions run on the caller's thread, so the site's group is never
// shared. The exchange's answer (the stop agreement, the re-planning measurement, the guard's
// rejections) is taken when the batch is settled, at a step every rank settles it at. While a
// batch is on the wire the averager must not be used by anyone else: settle() first. Every
// rank folds the same averages at the same steps, so a networked run equals the in-process
// one bit for bit.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <list>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "desloc/core/cpu_time.hpp"
#include "desloc/optim/optimizer.hpp"
#include "desloc/sync/averager.hpp"
#include "desloc/sync/outer_optimizer.hpp"

namespace desloc::sync {

struct Replica;

class DelayedAverages {
 public:
  struct Options {
    bool naive = false;                 // s <- mean(s_t) at the fold ("delayed_naive")
    std::array<std::int64_t, 4> tau{};  // by StateKind; >= 1 for every state averaged
    // Bound u after every fold of it, also with v's: u or v travels compressed, so the
    // averaged pair no longer satisfies Jensen's bound by construction.
    bool always_bound_u = false;
    // The outer step (sync.outer): taken on each average of x (each fragment) when it is
    // folded in, on the mean of the snapshots, in Streaming DiLoCo's manner; the fold then
    // carries the outer step's parameters, with the local progress since the snapshot kept.
    OuterNesterov* outer = nullptr;
  };
  explicit DelayedAverages(Options opts) : opts_(opts) {}
  ~DelayedAverages() { abandon(); }
  DelayedAverages(const DelayedAverages&) = delete;
  DelayedAverages& operator=(const DelayedAverages&) = delete;

  // Step t's due averages (`due`, in Alg. 1's order, each with this process's replicas of
  // it, fragment `fragment[k]` of `parts[k]` for due[k]) start: the batch on the wire (if
  // any) is settled, then the snapshots, the control exchange's half inside the site (`stop`
  // is this process's stop request), and on the thread its wide-area half and the averages'.
  // Throws Error for a gradient, and when a fragment is due again before its last average was
  // folded in. The exchange's rejections are recorded on `record` (the averager the trainer
  // reads them from; `averager` when null).
  void start(std::int64_t t, std::span<const DueAverage> due, std::span<const int> fragment,
             std::span<const int> parts, Averager& averager, bool stop, Averager* record = nullptr);
  // Before step t's update: folds every average whose fold step is t, in Alg. 1's order (x, u,
  // v), and bounds u (bound_momentum) when u was folded without v. An error raised on the wire
  // is thrown here or by settle().
  void fold_due(std::int64_t t, std::span<Replica> replicas);
  // After step t's update: folds every average in flight now (checkpoints, the last step),
  // with n = t - start + 1.
  void drain(std::int64_t t, std::span<Replica> replicas);
  // Waits for the batch on the wire and completes it inside the site; folds nothing. After it
  // the averager and its groups are free. (A fold waits only for its own average and those
  // started before it in the batch, whose completions inside the site run meanwhile on the
  // caller's thread: the communication thread uses only the wide-area groups.)
  void settle();
  // Drops every average in flight (waiting for the wire first) and any error it raised.
  void abandon();
  // Whether a control exchange settled so far found a site asking to stop.
  bool stop_agreed() const { return stop_agreed_; }
  // CPU seconds of the communication threads so far (the averager's own helpers apart:
  // Averager::helper_cpu_seconds), each added when it ends.
  double comm_cpu_seconds() const { return comm_cpu_.seconds(); }
  // Wall seconds the batches so far spent on the wide-area wire: each from its thread's start
  // (the control exchange's wide-area half) to its last average, added when the thread ends.
  double wire_seconds() const { return comm_wall_.seconds(); }
  // Of wire_seconds(), the control exchanges': the wait for every site to reach the batch's
  // step, and one round trip. The rest is the averages' transfer.
  double control_seconds() const { return comm_control_.seconds(); }
  // What the latest settled control exchange measured (once; Averager::take_measure).
  std::optional<SyncMeasure> take_measure() {
    std::optional<SyncMeasure> m;
    std::swap(m, measure_);
    return m;
  }

 private:
  struct Pending {
    optim::StateKind kind = optim::StateKind::kX;
    int fragment = 0, fragments = 1;
    bool folded = false;
    bool complete = false;  // complete_average done: `mean` holds mean(s_t)
    std::int64_t start = 0;
    std::int64_t fold_at = 0;
    std::vector<std::vector<float>> snap;  // each replica's s_t
    std::vector<std::vector<float>> mean;  // its copy, averaged in place
    std::vector<std::span<float>> views;   // of `mean`
    std::optional<CodecViews> codec;       // a compressed state's
  };
  // Folds p into the replicas after n updates since its snapshot.
  void fold(Pending& p, std::int64_t n, std::span<Replica> replicas);
  // Folds, in Alg. 1's order, the averages due at step t (all of them with `drain`, after step
  // t's update), then bounds u when it was folded without v.
  void fold_pending(std::int64_t t, bool drain, std::span<Replica> replicas);
  void join();
  // A buffer for a snapshot or a mean of n elements, from spare_ when one is there: fresh
  // buffers of a whole state cost their page faults at every start (about 40 ms for the
  // quickstart model's x, u and v on the e2e bed).
  std::vector<float> reuse(std::size_t n);
  // Waits until on_wire_[0, count) are off the wide-area wire and completes them inside the
  // site (taking the control exchange's answer first); once the whole batch is, joins the
  // thread. A fold waits for its own average, not for the rest of its batch.
  void complete_through(std::size_t count);

  Options opts_;
  Averager* averager_ = nullptr;
  Averager* record_ = nullptr;  // where the exchange's rejections go (start's `record`)
  // Started, not yet folded, in start order. A list: folding one never moves another, which the
  // thread may be averaging.
  std::list<Pending> pending_;
  std::vector<std::vector<float>> spare_;  // folded averages' buffers (reuse)
  std::vector<Pending*> on_wire_;          // the batch the thread is averaging, in start order
  Averager::ControlAnswer answer_;         // the exchange's answer, from the thread
  bool answered_ = false;                  // answer_ taken (by the batch's first completion)
  std::size_t completed_ = 0;              // on_wire_[0, completed_) completed inside the site
  std::thread comm_;
  std::exception_ptr comm_error_;  // set by the thread before finished_
  ThreadCpuTally comm_cpu_;        // comm_cpu_seconds()
  SecondsTally comm_wall_;         // wire_seconds()
  SecondsTally comm_control_;      // control_seconds()
  std::mutex mu_;
  std::condition_variable wire_;  // signals sent_ and finished_
  std::size_t sent_ = 0;          // under mu_: on_wire_[0, sent_) are off the wide-area wire
  bool finished_ = false;         // under mu_: the thread is done (comm_error_ when it failed)
  bool stop_agreed_ = false;
  std::optional<SyncMeasure> measure_;
};

}  // namespace desloc::sync
