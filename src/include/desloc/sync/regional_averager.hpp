// Hierarchical DES-LOC (job.regions, sync.region_k*): two averagers behind one. A state due in
// the job-wide schedule at step t is averaged over every site (`global`); a state due only in
// the regions' schedule is averaged over the sites of each region (`region`). The sync engine
// sees one Averager and the union of the two schedules (SyncPolicy::at), and says at each step
// which of its averages are job-wide (set_levels, from the schedule in force: period switches
// and re-plans included), so blocking and step-overlapped averages work unchanged, and so does
// the payload guard, judged per level.
// Codecs compress the job-wide averages only (SyncEngine compresses nothing else): the fast
// level inside a region stays fp32, and the codecs' references stay the last job-wide means.
//
// Stop requests travel with the job-wide control exchange only: every site must stop after the
// same step, and a region's exchange reaches only its own sites. So a stop takes effect at the
// next step with a job-wide average.
//
// Delayed averages (sync.overlap = "delayed") use the two levels apart: the job-wide averages
// stream on the sync engine's thread over job_level(), while the regions average whole fp32
// states blocking, on the caller's thread, at the start of their step (average_in_regions).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "desloc/core/sync_schedule.hpp"
#include "desloc/sync/averager.hpp"

namespace desloc::sync {

class RegionalAverager final : public Averager {
 public:
  // `global` and `region` must outlive this. `region_sites[p]` is the job-wide site index (ring
  // position) of position p of the region averager, for naming the sites its guard rejects;
  // empty when the region averager already reports job-wide indices (GroupedAverager).
  RegionalAverager(Averager& global, Averager& region, std::vector<int> region_sites = {});
  // Must follow each begin_step() before the step's averages: without it the step's levels are
  // unknown, and an average is an Error.
  void set_levels(const desloc::SyncDecision& job_wide) override;
  void average(optim::StateKind kind, std::span<const std::span<float>> local) override;
  void average_across_sites(optim::StateKind kind,
                            std::span<const std::span<float>> local) override;
  void complete_average(optim::StateKind kind, std::span<const std::span<float>> local) override;
  bool exchange_control(std::span<const DueAverage> due, bool stop) override;
  void open_control(std::span<const DueAverage> due, bool stop) override;
  ControlAnswer close_control() override;
  int sites() const override { return global_.sites(); }
  // Re-planning measures the job-wide averages only: the regions' links are not the ones the
  // job-wide periods are chosen for.
  void note_compute(double seconds) override { global_.note_compute(seconds); }
  std::optional<SyncMeasure> take_measure() override { return std::exchange(measure_, {}); }
  // The job-wide exchange's (the regions' waits are inside the regions).
  std::vector<double> take_waits() override { return global_.take_waits(); }
  double helper_cpu_seconds() const override {
    return global_.helper_cpu_seconds() + region_.helper_cpu_seconds();
  }
  // The job-wide averager's traffic, with the region averager's wide-area bytes as region_wire.
  Traffic traffic(int w) const override;

  // Delayed averages: the job-wide level, which the engine's thread drives on its own.
  Averager& job_level() { return global_; }
  // Delayed averages: step t's averages inside the regions (`due`, whole states, no codec),
  // each over its region's sites: their control exchange (no stop request), then the averages
  // in order, on the caller's thread. Rejections are recorded here, by job-wide index. Uses
  // only the regions' level, so the job-wide one may be on the wire meanwhile.
  void average_in_regions(std::int64_t t, std::span<const DueAverage> due);

 private:
  // Opens step_ on both averagers once (begin_step is the engine's call on this one).
  void open_step();
  bool job_wide(optim::StateKind kind) const;
  Averager& route(optim::StateKind kind) { return job_wide(kind) ? global_ : region_; }
  // Hands a codec set on this averager (set_codec) to the job-wide one, whose average it
  // compresses; a region's average is fp32, and a codec set for one is an Error.
  void forward_codec(optim::StateKind kind);
  // Moves what the two averagers' guards rejected into `into` (rejections_, or a
  // ControlAnswer's), the regions' named by job-wide index.
  void collect_rejections(std::vector<Rejection>& into);
  Rejection by_job_index(Rejection r) const;

  Averager& global_;
  Averager& region_;
  std::vector<int> region_sites_;
  desloc::SyncDecision levels_;  // set_levels() of step levels_step_
  std::int64_t levels_step_ = -1;
  std::optional<SyncMeasure> measure_;  // the job-wide exchange's, until take_measure()
  std::int64_t opened_ = -1;
  bool job_open_ = false, region_open_ = false;  // which levels open_control() opened
};

// The region level in one process: each region's replicas (by job-wide site index, in the
// region's ring order) averaged by a VirtualAverager of their own, in ring order like the
// networked region groups, with both lanes in a region of three sites or more when `lanes` is 2
// (transport.lanes, as the networked region rings). Rejections are reported by job-wide site
// index.
class GroupedAverager final : public Averager {
 public:
  GroupedAverager(std::vector<std::vector<int>> groups, int sites, const ShardMap& map,
                  const PayloadGuard& guard, int lanes = 1, double lane_share = 0.5);
  void average(optim::StateKind kind, std::span<const std::span<float>> local) override;
  bool exchange_control(std::span<const DueAverage> due, bool stop) override;
  int sites() const override { return sites_; }
  Traffic traffic(int w) const override;

 private:
  void open_step();
  std::vector<std::span<float>> subset(std::size_t g,
                                       std::span<const std::span<float>> local) const;
  void collect_rejections(std::size_t g);

  std::vector<std::vector<int>> groups_;
  int sites_;
  std::vector<std::unique_ptr<VirtualAverager>> averagers_;
  std::int64_t opened_ = -1;
};

}  // namespace desloc::sync
