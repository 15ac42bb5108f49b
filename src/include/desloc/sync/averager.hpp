// Averager: the mean of a named state buffer over all sites of a job. The in-process
// virtual-site averager lives here; the UCX wide-area averager implements the same
// interface. Byte accounting is part of the contract so every backend reports alike.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "desloc/core/sync_schedule.hpp"
#include "desloc/optim/optimizer.hpp"
#include "desloc/sync/compression.hpp"
#include "desloc/sync/payload_guard.hpp"
#include "desloc/sync/replanner.hpp"
#include "desloc/sync/shard_map.hpp"

namespace desloc::sync {

// Bytes one site moved, per state kind (indexed by optim::StateKind).
struct Traffic {
  std::array<std::uint64_t, 4> payload{};  // bytes of state averaged (4 * elements per average)
  // Wide-area bytes sent: for virtual sites what a ring all-reduce sends, 2(M-1)/M *
  // payload (a compressed average: what its ring of encoded segments sends, 2(M-1) segments,
  // scales and padding included); for a networked rank what its WAN group actually sent for
  // its shard.
  std::array<std::uint64_t, 4> wire{};
  // Intra-site bytes the sharded averager's all-gather sent (0 with one rank per site).
  std::array<std::uint64_t, 4> site_wire{};
  // With job.regions: the wide-area bytes of the averages inside a region, counted as `wire`
  // counts the job-wide ones (RegionalAverager).
  std::array<std::uint64_t, 4> region_wire{};
  std::uint64_t total_payload() const { return payload[0] + payload[1] + payload[2] + payload[3]; }
  // Every wide-area byte: the job-wide averages' and the regions'.
  std::uint64_t total_wire() const {
    return wire[0] + wire[1] + wire[2] + wire[3] + total_region_wire();
  }
  std::uint64_t total_region_wire() const {
    return region_wire[0] + region_wire[1] + region_wire[2] + region_wire[3];
  }
  // Adds every counter of `o`.
  Traffic& operator+=(const Traffic& o) {
    for (std::size_t k = 0; k < 4; ++k) {
      payload[k] += o.payload[k];
      wire[k] += o.wire[k];
      site_wire[k] += o.site_wire[k];
      region_wire[k] += o.region_wire[k];
    }
    return *this;
  }
};

// One state due for an average at this step, as the control exchange sees it: the replicas
// this process holds of it (M for virtual sites, 1 for a networked rank).
struct DueAverage {
  optim::StateKind kind = optim::StateKind::kX;
  std::span<const std::span<float>> local;
  const CodecViews* codec = nullptr;  // a compressed state's views (set_codec), or none
};

class Averager {
 public:
  virtual ~Averager() = default;
  // Replaces every replica in `local` (the replicas this process holds: M for virtual
  // sites, 1 for a networked rank) by the mean of that state over all sites of the job.
  // All replicas must have the same length.
  virtual void average(optim::StateKind kind, std::span<const std::span<float>> local) = 0;
  // An average in two halves, for averages that overlap compute (sync.overlap = "step"):
  // average_across_sites() is the wide-area half, and may run on another thread while this
  // process computes, as long as nothing else uses the averager meanwhile: it touches only the
  // wide-area groups. complete_average() then does the rest on the caller's thread (the
  // all-gather inside the site, which shares its group with the step's gradient reduction).
  // Together they compute exactly what average() computes. By default the first half is the
  // whole average.
  virtual void average_across_sites(optim::StateKind kind,
                                    std::span<const std::span<float>> local) {
    average(kind, local);
  }
  virtual void complete_average(optim::StateKind /*kind*/,
                                std::span<const std::span<float>> /*local*/) {}
  // The 1-based step whose averages follow; networked averagers label their chunks with it,
  // and the payload guard's reports carry it.
  // Verdicts of an earlier step's control exchange that were never used are dropped, and so
  // are codec views an abandoned average never consumed.
  void begin_step(std::int64_t t) {
    step_ = t;
    verdicts_ = {};
    codec_ = {};
  }
  // Which of the averages due at this step span every site (SyncPolicy::global_at); the rest
  // are due inside regions only. The sync engine gives it after begin_step(); only a
  // hierarchical averager (RegionalAverager) routes by it, and it follows period switches.
  virtual void set_levels(const desloc::SyncDecision& /*job_wide*/) {}
  // Compresses the next average of `kind` (compression.hpp): each site sends its difference
  // from views.reference, encoded with views.codec, and the encoded segments are summed along
  // the ring (decoded, added, re-encoded) and all-gathered. The views must match the replicas of
  // that average (same fragment) and stay alive until it completes; it consumes them. The
  // setting belongs to the thread that runs the average's first half.
  void set_codec(optim::StateKind kind, CodecViews views) {
    codec_[static_cast<std::size_t>(kind)] = std::move(views);
  }
  virtual int sites() const = 0;
  // Each site's weight in every average, indexed as sites() counts them (a replica, or a ring
  // position): the tokens it trains on per step with sync.weights = "tokens", so the mean is
  // the one over every sequence the sites trained on. Empty: every site alike. Each site's
  // contribution is multiplied by contribution_scales() before the sum, which is then divided
  // by the number of sites kept, as unweighted. A left-out site's weight leaves the divisor.
  void set_weights(std::vector<double> weights) { weights_ = std::move(weights); }
  const std::vector<double>& weights() const { return weights_; }
  // Traffic of site w (a local replica index), a copy: an average on a communication thread
  // (sync.overlap = "delayed") may be adding to it meanwhile.
  virtual Traffic traffic(int w) const = 0;

  // The payload guard (on by default): a site whose contribution to an average is non-finite,
  // or whose norm is far above the others' (judge_payloads), is left out of that average and
  // receives the mean of the rest; every rank of the job takes the same decision. A warning
  // names the sites, and rejections() keeps the record. When every site is rejected,
  // average() throws Error naming them (not a PeerFailure: no new
  // membership epoch can mend a payload every site got wrong).
  void set_payload_guard(PayloadGuard guard) { guard_ = std::move(guard); }
  const PayloadGuard& payload_guard() const { return guard_; }
  // Every site left out so far, in the order of the averages (several per average possible).
  const std::vector<Rejection>& rejections() const { return rejections_; }
  void clear_rejections() { rejections_.clear(); }

  // The control exchange that opens a step's averages (SyncEngine::finish): every site's
  // payload health for each due state, and whether it asks to stop, travel together in one
  // small exchange instead of one per average. The guard's verdicts are kept for the
  // average() of each of these states that follows in this step; an average() without one
  // judges its payload alone. Returns true when any site of the job asked to stop. The
  // payloads must not change between this call and their average().
  virtual bool exchange_control(std::span<const DueAverage> due, bool stop) = 0;

  // The control exchange in two halves, for averages that start on a communication thread
  // (sync.overlap = "delayed"), so that the step waits for no wide-area round trip:
  // open_control() runs on the caller's thread (it measures the payloads and agrees inside
  // the site, whose group the gradient's reduction shares); close_control() is the wide-area
  // half, run on the communication thread right before the averages. Its answer holds what
  // exchange_control() returns, what take_measure() would then give, and the guard's
  // rejections, which the caller records (record_rejections) once the thread is joined: the
  // trainer reads rejections() meanwhile. The verdicts are held for the averages as with
  // exchange_control(). What each DueAverage points to (its replicas' spans, their payloads,
  // its codec views) must stay alive and unchanged until close_control() returns; the `due`
  // array itself may go. By default the first half keeps its arguments and the second
  // makes the whole exchange.
  struct ControlAnswer {
    bool stop = false;
    std::optional<SyncMeasure> measure;
    std::vector<Rejection> rejections;
  };
  virtual void open_control(std::span<const DueAverage> due, bool stop);
  virtual ControlAnswer close_control();
  // Appends rejections a ControlAnswer carried.
  void record_rejections(std::span<const Rejection> rejected) {
    rejections_.insert(rejections_.end(), rejected.begin(), rejected.end());
  }

  // Re-planning (sync.replan): the trainer notes each step's compute seconds, and a networked
  // averager's next control exchange also carries what the sites measured of the averages
  // since the last one, every rank receiving the same table. In one process nothing is
  // measured: take_measure() is nullopt.
  virtual void note_compute(double /*seconds*/) {}
  // What the latest control exchange measured (once; nullopt when it measured nothing).
  virtual std::optional<SyncMeasure> take_measure() { return std::nullopt; }
  // Each site's wait at the latest control exchange (once; empty when none since the last
  // take, and in one process): the compute seconds the slowest site noted since the exchange
  // before, less the site's own, by site index. Every rank of the job holds the same figures.
  virtual std::vector<double> take_waits() { return {}; }
  // CPU seconds of the threads the averager starts itself (a networked rank's second
  // wide-area lane), since it was made: part of what its averages cost the compute.
  virtual double helper_cpu_seconds() const { return 0.0; }

 protected:
  // The payload guard's decision for one state of one step.
  struct Verdict {
    std::vector<Rejection> rejected;
    int kept = 0;  // sites averaged
  };
  // Records the verdict (rejections(), or the ControlAnswer's during close_control(); one
  // warning when `log`) and keeps it for kind's next average(); throws Error when every site
  // is rejected.
  void hold_verdict(optim::StateKind kind, std::vector<Rejection> rejected, int sites, bool log);
  // close_control() for an implementation whose exchange_control() runs whole: the rejections
  // its verdicts find go to the answer instead of rejections().
  ControlAnswer close_with(const std::function<bool()>& exchange);
  // The verdict exchange_control left for kind, consumed; nullopt when there is none.
  std::optional<Verdict> take_verdict(optim::StateKind kind);
  // The factor each site's contribution takes before the sum, by site: w_site * kept / (the
  // kept sites' weights summed in site order), rounded to float, where `left_out[s]` marks the
  // sites the guard rejected (their factor is 1: they send zeros). Exactly 1 when the kept
  // sites weigh alike (their sum is then kept times one of them, exactly, for weights that are
  // integers below 2^53), so an average of equal weights computes what an unweighted one does,
  // bit for bit. Every rank computes the same factors: the in-process and networked averages
  // stay equal.
  std::vector<float> contribution_scales(std::span<const char> left_out) const;
  // left_out as contribution_scales() reads it, from a verdict's rejections (none: all kept).
  std::vector<char> left_out_of(const std::optional<Verdict>& verdict, int sites) const;

  std::int64_t step_ = -1;
  mutable std::mutex traffic_mu_;  // guards the implementations' traffic counters
  PayloadGuard guard_;
  std::vector<Rejection> rejections_;
  std::array<std::optional<Verdict>, 4> verdicts_;  // by optim::StateKind
  std::array<std::optional<CodecViews>, 4> codec_;  // by optim::StateKind (set_codec)
  std::vector<double> weights_;                     // set_weights(); empty: equal
  // Between open_control() and close_control() (the default halves): the due states and the
  // stop request.
  std::vector<DueAverage> opened_due_;
  bool opened_stop_ = false;
  // While close_control() runs: where hold_verdict() puts the rejections.
  std::vector<Rejection>* answer_rejections_ = nullptr;
};

// How VirtualAverager sums.
enum class SumOrder {
  // Each element summed in double in site order (each times its contribution_scales factor) and
  // divided once: deterministic, and exact whenever the inputs' sum is representable
  // (closed-form tests rely on that).
  kExact,
  // Bit for bit what the networked CollectiveAverager computes over the same ShardMap: each
  // segment summed in the ring order of transport::ring_sum_reference in float, then divided
  // by M in float. The trainer uses it, so `desloc train` is the exact
  // reference for a multi-process `desloc launch` of the same job.
  kRing,
};

// M replicas in one process; a single replica is returned unchanged. Each replica is a site to
// the payload guard: its health is measured per segment and summed per rank, then over the
// site's ranks, as the networked averager's ranks do, so both reject the same sites and stay
// equal bit for bit.
class VirtualAverager final : public Averager {
 public:
  // `shards` (kRing): the ranks of each site (ShardMap::even). `lanes` (kRing): 2 splits each
  // segment over the ring and the reversed ring, as the networked
  // averager does with transport.lanes = 2, `lane_share` of it on the ring
  // (transport::lane_block).
  explicit VirtualAverager(int sites, SumOrder order = SumOrder::kExact, int shards = 1,
                           int lanes = 1, double lane_share = 0.5);
  // kRing over the segments of `map` (sites whose rank counts differ): each site's payload
  // health is the sum of its ranks' (each the sum of its segments'), as the networked ranks
  // combine it.
  VirtualAverager(int sites, SumOrder order, ShardMap map, int lanes, double lane_share);
  void average(optim::StateKind kind, std::span<const std::span<float>> local) override;
  // In one process the sites' requests are one: returns `stop`.
  bool exchange_control(std::span<const DueAverage> due, bool stop) override;
  int sites() const override { return sites_; }
  Traffic traffic(int w) const override {
    const std::lock_guard lock(traffic_mu_);
    return traffic_.at(static_cast<std::size_t>(w));
  }
  // Sites can be added mid-run (elastic join); traffic of existing sites is kept.
  void resize(int sites);

 private:
  void check_replicas(optim::StateKind kind, std::span<const std::span<float>> local) const;
  // The guard's verdict on the replicas' payloads (each measured per shard, summed in shard
  // order, as the networked ranks do).
  // A compressed state (`codec`) is judged by what its payloads carry once decoded.
  void judge(optim::StateKind kind, std::span<const std::span<float>> local,
             const CodecViews* codec);
  // A compressed average (set_codec); left_out[w] marks the replicas the guard rejected.
  void average_compressed(optim::StateKind kind, std::span<const std::span<float>> local,
                          const CodecViews& codec, std::span<const char> left_out);

  int sites_;
  SumOrder order_;
  ShardMap map_;
  int lanes_;
  double lane_share_;
  std::vector<Traffic> traffic_;
  // A compressed average's buffers, kept between averages: fresh ones of a large state's size
  // cost page faults that made the ring's codec work 4.5x its price (bench_codec --ring).
  std::vector<std::vector<std::byte>> encoded_;
  std::vector<std::byte> combined_;
  std::vector<float> scratch_, mean_;
  std::vector<std::vector<float>> scaled_;  // weighted ring averages: each site's scaled shard
};

}  // namespace desloc::sync
