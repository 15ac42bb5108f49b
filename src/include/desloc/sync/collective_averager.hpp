// The networked Averager: a job of S sites, each rank a process holding its site's replica.
// Each rank owns a contiguous range of every state buffer, cut into segments (ShardMap); the
// owners of segment j in all sites form a WAN ring, which averages that segment across the
// sites with a ring all-reduce. For sites alike (R ranks each) rank r owns segment r alone and
// its one ring is rank r of every site; a site with fewer ranks than another owns several
// segments per rank and runs their rings one after the other, in segment order (so no two
// ranks wait on each other in a cycle). An all-gather inside the site then makes every rank of
// the site identical again. With R = 1 the whole buffer goes over the site's rings. The trainer
// cannot tell it from the VirtualAverager, whose kRing order it matches bit for bit, payload guard
// included: before a step's averages the sites swap a 16-byte health summary per due state (an
// all-gather inside the site, then one over the WAN group: the control exchange) and a rejected
// site sends zeros.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <vector>

#include "desloc/core/cpu_time.hpp"
#include "desloc/sync/averager.hpp"
#include "desloc/sync/shard_map.hpp"
#include "desloc/sync/sync_meter.hpp"
#include "desloc/transport/collective.hpp"
#include "desloc/transport/ring_order.hpp"

namespace desloc::sync {

// One segment's wide-area rings as a rank holds them: `ring` (rank = the site's ring position)
// and, when given, the same ranks in the reversed ring (the second lane).
struct WanRing {
  int segment = 0;  // ShardMap segment
  transport::Collective* ring = nullptr;
  transport::Collective* reverse = nullptr;
};

class CollectiveAverager final : public Averager {
 public:
  // `wan` is this rank's WAN group (size S, rank = the site's ring position); `site` is the
  // site's group (size R, rank = r), or nullptr when R = 1; `wan_reverse`, when given, is the
  // same sites in the reversed ring (rank = transport::reversed_rank), the second lane: the
  // shard's second part travels it concurrently, on the links' other direction; `lane_share`
  // of the shard takes the ring, the rest the reversed ring (transport::lane_block). All must
  // outlive the averager.
  // Every rank must call average() for the same states in the same order (the SyncPolicy
  // guarantees that: it is a function of t).
  explicit CollectiveAverager(transport::Collective& wan, transport::Collective* site = nullptr,
                              transport::Collective* wan_reverse = nullptr,
                              double lane_share = 0.5);
  // The segments of `map` this rank owns (as a rank of `site`, whose rank count the map
  // knows), each with its rings, in segment order; every ring has the same sites in the same
  // order.
  CollectiveAverager(std::vector<WanRing> rings, ShardMap map, transport::Collective* site,
                     double lane_share);
  // `local` holds exactly one replica, identical on every rank of a site.
  void average(optim::StateKind kind, std::span<const std::span<float>> local) override;
  // The payload guard and the WAN all-reduce of this rank's shard, divided: only the WAN
  // groups are used (the guard's verdict must come from this step's exchange_control).
  void average_across_sites(optim::StateKind kind,
                            std::span<const std::span<float>> local) override;
  // The intra-site all-gather of the averaged shards.
  void complete_average(optim::StateKind kind, std::span<const std::span<float>> local) override;
  // One all-gather inside the site, then one over the WAN group, carrying each due state's
  // health and the site's stop request (16 bytes a row).
  // With the measurement of the averages since the last exchange (two more rows).
  bool exchange_control(std::span<const DueAverage> due, bool stop) override;
  // The same in two halves: the rows and the all-gather inside the site, then the WAN
  // all-gather (which only uses the WAN group).
  void open_control(std::span<const DueAverage> due, bool stop) override;
  ControlAnswer close_control() override;
  void note_compute(double seconds) override;
  std::optional<SyncMeasure> take_measure() override;
  std::vector<double> take_waits() override;
  // The second lane's threads (one per two-lane average).
  double helper_cpu_seconds() const override { return lane_cpu_.seconds(); }
  int sites() const override { return wan().size(); }
  // Wire bytes are what the collectives actually sent, not a formula: `wire` is the WAN
  // group's, `site_wire` the intra-site all-gather's.
  Traffic traffic(int w) const override;
  // Times every wide-area average into `meter` (for the heartbeats), which must outlive the
  // averager; nullptr stops it.
  void set_sync_meter(SyncMeter* meter) { meter_ = meter; }

 private:
  // The payload guard's decision on this site's `data`: the control exchange's verdict, or an
  // exchange of its own when there was none (all sites kept when the guard is off). Control
  // bytes are not counted in traffic().
  struct Decision {
    int kept = 0;           // sites averaged
    bool rejected = false;  // this site is left out
    float scale = 1.0f;     // this site's contribution_scales factor (1 when rejected)
  };
  Decision decide(optim::StateKind kind, std::span<float> data);
  // The control exchange; `measure` adds the measurement rows (only the engine's exchange,
  // which every rank makes at the same point, consumes what was measured) and leaves their
  // table in measure_.
  bool exchange(std::span<const DueAverage> due, bool stop, bool measure);
  // The exchange's first half: this site's rows (its ranks' rows combined by an all-gather
  // inside the site).
  struct ControlRows {
    std::vector<PayloadHealth> rows;
    std::vector<optim::StateKind> kinds;  // per due state
    std::vector<std::size_t> elements;    // per due state, of the whole replica
    bool stop = false;
    bool measure = false;
  };
  ControlRows site_rows(std::span<const DueAverage> due, bool stop, bool measure);
  // Its second half: the WAN all-gather of every site's rows. Holds the guard's verdicts and
  // returns whether any site asked to stop; `measured` receives the measurement when the rows
  // carry one.
  bool agree(const ControlRows& site, std::optional<SyncMeasure>& measured);
  // One wide-area average's seconds and bytes, for the next exchange's measurement.
  void measured(double seconds, std::uint64_t bytes);
  void check_one_replica(optim::StateKind kind, std::span<const std::span<float>> local) const;
  // The wide-area half of a compressed average (set_codec): this rank's segments of data.
  void across_sites_compressed(optim::StateKind kind, std::span<float> data);
  // One segment's exact average: `shard` (zeros when rejected, else scaled) summed over its
  // ring (and its reversed ring, `lane_share_` apart) and divided by the sites kept; the
  // lanes' seconds and bytes added to `lanes`.
  void average_segment(optim::StateKind kind, const WanRing& w, std::span<float> shard,
                       const Decision& decision, std::array<SyncMeter::LaneSample, 2>& lanes);
  // The bytes every ring of this rank sent in `ops`.
  std::uint64_t wan_sent(std::initializer_list<transport::CollectiveOp> ops) const;
  // The first ring: the sites' size and this site's ring position are the same in every ring.
  transport::Collective& wan() const { return *rings_.front().ring; }

  std::vector<WanRing> rings_;
  ShardMap map_;
  transport::Collective* site_;
  double lane_share_;
  ThreadCpuTally lane_cpu_;  // helper_cpu_seconds()
  Traffic traffic_;
  SyncMeter* meter_ = nullptr;
  // Since the last measuring exchange, under traffic_mu_: the averages' seconds, bytes and
  // count, and the compute seconds and steps the trainer noted.
  struct Pending {
    double seconds = 0.0;
    std::uint64_t bytes = 0;
    int averages = 0;
    double compute = 0.0;
    int steps = 0;
  } pending_;
  std::optional<SyncMeasure> measure_;
  std::vector<double> waits_;              // take_waits(), under traffic_mu_
  std::optional<ControlRows> opened_;      // between open_control() and close_control()
  std::vector<float> gathered_;            // R blocks, for the intra-site all-gather
  std::vector<PayloadHealth> health_;      // rows x S: the control exchange's table
  std::vector<std::byte> encoded_;         // S encoded segments: a compressed average's ring
  std::vector<std::byte> gathered_bytes_;  // their sums, all-gathered
  std::vector<float> scratch_;             // a compressed average's differences and decodes
};

}  // namespace desloc::sync
