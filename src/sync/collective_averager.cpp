// The networked averager: WAN all-reduce of this rank's shard, scale, intra-site all-gather.
#include "desloc/sync/collective_averager.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <exception>
#include <limits>
#include <string>
#include <thread>
#include <utility>

#include "desloc/core/error.hpp"
#include "desloc/transport/ring_order.hpp"

namespace desloc::sync {

CollectiveAverager::CollectiveAverager(transport::Collective& wan, transport::Collective* site,
                                       transport::Collective* wan_reverse, double lane_share)
    : CollectiveAverager(
          {WanRing{site != nullptr && site->size() > 1 ? site->rank() : 0, &wan, wan_reverse}},
          ShardMap::even(site != nullptr && site->size() > 1 ? site->size() : 1), site,
          lane_share) {}

CollectiveAverager::CollectiveAverager(std::vector<WanRing> rings, ShardMap map,
                                       transport::Collective* site, double lane_share)
    : rings_(std::move(rings)),
      map_(std::move(map)),
      site_(site != nullptr && site->size() > 1 ? site : nullptr),
      lane_share_(lane_share) {
  if (rings_.empty()) throw Error("collective averager: a rank with no wide-area ring");
  for (WanRing& w : rings_) {
    if (w.ring == nullptr || w.ring->size() != wan().size() || w.ring->rank() != wan().rank())
      throw Error("collective averager: segment " + std::to_string(w.segment) +
                  "'s ring does not hold the same sites as the first");
    if (w.reverse != nullptr && w.reverse->size() < 3) w.reverse = nullptr;
  }
}

void CollectiveAverager::average(optim::StateKind kind, std::span<const std::span<float>> local) {
  average_across_sites(kind, local);
  complete_average(kind, local);
}

std::uint64_t CollectiveAverager::wan_sent(
    std::initializer_list<transport::CollectiveOp> ops) const {
  std::uint64_t sent = 0;
  for (const WanRing& w : rings_)
    for (const transport::CollectiveOp op : ops) {
      sent += w.ring->bytes()[op].sent;
      if (w.reverse != nullptr) sent += w.reverse->bytes()[op].sent;
    }
  return sent;
}

void CollectiveAverager::average_across_sites(optim::StateKind kind,
                                              std::span<const std::span<float>> local) {
  using transport::CollectiveOp;
  check_one_replica(kind, local);
  const std::span<float> data = local[0];
  if (sites() == 1) return;
  const auto k = static_cast<std::size_t>(kind);
  const auto start = std::chrono::steady_clock::now();
  if (codec_[k] && !codec_[k]->reference.empty()) {
    const std::uint64_t before = wan_sent({CollectiveOp::kAllReduce, CollectiveOp::kAllGather});
    across_sites_compressed(kind, data);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const SyncMeter::LaneSample lane{
        wan_sent({CollectiveOp::kAllReduce, CollectiveOp::kAllGather}) - before, seconds};
    if (meter_ != nullptr) meter_->record(seconds, std::span(&lane, 1));
    measured(seconds, lane.bytes);
    return;
  }
  // A rejected site sends zeros; a kept one its segments times its weight's factor, as the
  // VirtualAverager scales each replica's.
  const Decision decision = decide(kind, data);
  std::array<SyncMeter::LaneSample, 2> lanes{};
  for (const WanRing& w : rings_) {
    const transport::Range b = map_.segment(data.size(), w.segment);
    average_segment(kind, w, data.subspan(b.offset, b.count), decision, lanes);
  }
  {
    const std::lock_guard lock(traffic_mu_);
    traffic_.wire[k] += lanes[0].bytes + lanes[1].bytes;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const bool two = rings_.front().reverse != nullptr;
  if (meter_ != nullptr) meter_->record(seconds, std::span(lanes.data(), two ? 2 : 1));
  measured(seconds, lanes[0].bytes + lanes[1].bytes);
}

void CollectiveAverager::average_segment(optim::StateKind kind, const WanRing& w,
                                         std::span<float> shard, const Decision& decision,
                                         std::array<SyncMeter::LaneSample, 2>& lanes) {
  using transport::CollectiveOp;
  const auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  const std::uint64_t ring_before = w.ring->bytes()[CollectiveOp::kAllReduce].sent;
  const std::uint64_t reverse_before =
      w.reverse != nullptr ? w.reverse->bytes()[CollectiveOp::kAllReduce].sent : 0;
  const transport::OpLabel label{step_, static_cast<std::uint8_t>(kind),
                                 static_cast<std::uint32_t>(w.segment)};
  if (decision.rejected) std::fill(shard.begin(), shard.end(), 0.0f);
  if (decision.scale != 1.0f)
    for (float& x : shard) x *= decision.scale;
  w.ring->set_label(label);
  if (w.reverse == nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    w.ring->all_reduce_sum(shard);
    lanes[0].seconds += seconds_since(t0);
  } else {
    // Two lanes at once, one thread each (a collective serves one thread at a time).
    const transport::Range a = transport::lane_block(shard.size(), lane_share_, 0);
    const transport::Range b = transport::lane_block(shard.size(), lane_share_, 1);
    w.reverse->set_label(label);
    std::exception_ptr lane_error;
    const auto t0 = std::chrono::steady_clock::now();
    std::thread lane([&] {
      try {
        w.reverse->all_reduce_sum(shard.subspan(b.offset, b.count));
        lanes[1].seconds += seconds_since(t0);
      } catch (...) {
        lane_error = std::current_exception();
      }
      lane_cpu_.add_calling_thread();
    });
    try {
      w.ring->all_reduce_sum(shard.subspan(a.offset, a.count));
      lanes[0].seconds += seconds_since(t0);
    } catch (...) {
      lane.join();
      throw;
    }
    lane.join();
    if (lane_error) std::rethrow_exception(lane_error);
    lanes[1].bytes += w.reverse->bytes()[CollectiveOp::kAllReduce].sent - reverse_before;
  }
  const auto size = static_cast<float>(decision.kept);
  for (float& x : shard) x /= size;  // a division, not a reciprocal: correctly rounded
  lanes[0].bytes += w.ring->bytes()[CollectiveOp::kAllReduce].sent - ring_before;
}

void CollectiveAverager::measured(double seconds, std::uint64_t bytes) {
  const std::lock_guard lock(traffic_mu_);
  pending_.seconds += seconds;
  pending_.bytes += bytes;
  ++pending_.averages;
}

void CollectiveAverager::note_compute(double seconds) {
  const std::lock_guard lock(traffic_mu_);
  pending_.compute += seconds;
  ++pending_.steps;
}

std::optional<SyncMeasure> CollectiveAverager::take_measure() {
  std::optional<SyncMeasure> m;
  std::swap(m, measure_);
  return m;
}

std::vector<double> CollectiveAverager::take_waits() {
  const std::lock_guard lock(traffic_mu_);
  return std::exchange(waits_, {});
}

void CollectiveAverager::complete_average(optim::StateKind kind,
                                          std::span<const std::span<float>> local) {
  using transport::CollectiveOp;
  check_one_replica(kind, local);
  const std::span<float> data = local[0];
  const auto k = static_cast<std::size_t>(kind);
  std::optional<CodecViews> codec;
  std::swap(codec, codec_[k]);
  // A compressed state's reference becomes the mean (with one site: the state itself).
  const auto keep_reference = [&] {
    if (codec && !codec->reference.empty()) set_reference(*codec, data, codec->reference);
  };
  if (sites() == 1) {
    keep_reference();
    return;
  }
  if (site_ != nullptr) {
    const int ranks = site_->size();
    const int r = site_->rank();
    const transport::Range mine = map_.owned(data.size(), ranks, r);
    const std::span<float> shard = data.subspan(mine.offset, mine.count);
    const transport::OpLabel label{step_, static_cast<std::uint8_t>(kind),
                                   static_cast<std::uint32_t>(r)};
    // Equal blocks for the all-gather: some ranks own less, so pad into place.
    const std::size_t blk = map_.largest_owned(data.size(), ranks);
    gathered_.assign(blk * static_cast<std::size_t>(ranks), 0.0f);
    site_->set_label(label);
    std::copy(shard.begin(), shard.end(), gathered_.begin() + static_cast<std::ptrdiff_t>(r * blk));
    const std::uint64_t site_before = site_->bytes()[CollectiveOp::kAllGather].sent;
    site_->all_gather(std::span<const float>(gathered_).subspan(r * blk, blk), gathered_);
    const std::lock_guard lock(traffic_mu_);
    traffic_.site_wire[k] += site_->bytes()[CollectiveOp::kAllGather].sent - site_before;
    for (int q = 0; q < ranks; ++q) {
      const transport::Range b = map_.owned(data.size(), ranks, q);
      std::copy_n(gathered_.begin() + static_cast<std::ptrdiff_t>(q * blk), b.count,
                  data.begin() + static_cast<std::ptrdiff_t>(b.offset));
    }
  }
  keep_reference();
  const std::lock_guard lock(traffic_mu_);
  traffic_.payload[k] += data.size() * sizeof(float);
}

// Each of this rank's segments as the difference from the reference, encoded; a ring
// reduce-scatter of the encoded pieces over the segment's ring (each rank decoding, adding its
// own and re-encoding), an all-gather of the sums, and their decoded mean on top of the
// reference (compression.hpp). A site the guard rejected contributes zeros.
void CollectiveAverager::across_sites_compressed(optim::StateKind kind, std::span<float> data) {
  using transport::CollectiveOp;
  const auto k = static_cast<std::size_t>(kind);
  const CodecViews& codec = *codec_[k];
  if (codec.reference.size() != data.size() || codec.feedback.size() > 1)
    throw Error("collective averager: the codec views of '" + std::string(optim::to_string(kind)) +
                "' do not match its replica");
  const int sites = this->sites();
  const int me = wan().rank();
  const Decision decision = decide(kind, data);
  const std::uint64_t before = wan_sent({CollectiveOp::kAllReduce, CollectiveOp::kAllGather});
  for (const WanRing& w : rings_) {
    const transport::Range mine = map_.segment(data.size(), w.segment);
    const std::span<float> shard = data.subspan(mine.offset, mine.count);
    const RingLayout l(codec, shard.size(), sites);
    const std::span<float> ef = codec.feedback.empty()
                                    ? std::span<float>()
                                    : codec.feedback[0].subspan(mine.offset, mine.count);
    const std::span<float> ref = codec.reference.subspan(mine.offset, mine.count);
    const std::size_t seg = l.segment_bytes;
    encoded_.resize(seg * static_cast<std::size_t>(sites));
    encode_contribution(l, shard, ref, ef, decision.rejected, encoded_, scratch_, decision.scale);
    transport::Collective& ring = *w.ring;
    ring.set_label({step_, static_cast<std::uint8_t>(kind), static_cast<std::uint32_t>(w.segment)});
    ring.reduce_scatter_encoded(
        encoded_, seg, l.piece_bytes,
        [&](int s, std::size_t c, std::span<const std::byte> received, std::span<std::byte> own) {
          combine_piece(l, s, c, received, own, ef, scratch_);
        });
    // This rank holds piece me + 1's sum; the all-gather puts rank q's at block q.
    const auto owned = static_cast<std::size_t>((me + 1) % sites);
    gathered_bytes_.resize(seg * static_cast<std::size_t>(sites));
    ring.all_gather(std::span<const std::byte>(encoded_).subspan(owned * seg, seg),
                    gathered_bytes_);
    for (int q = 0; q < sites; ++q) {  // block q is piece q + 1
      const auto s = static_cast<std::size_t>((q + 1) % sites);
      std::copy_n(gathered_bytes_.begin() + static_cast<std::ptrdiff_t>(std::size_t(q) * seg), seg,
                  encoded_.begin() + static_cast<std::ptrdiff_t>(s * seg));
    }
    finish_mean(l, codec, encoded_, decision.kept, ref, shard, scratch_);
  }
  const std::lock_guard lock(traffic_mu_);
  traffic_.wire[k] += wan_sent({CollectiveOp::kAllReduce, CollectiveOp::kAllGather}) - before;
}

bool CollectiveAverager::exchange_control(std::span<const DueAverage> due, bool stop) {
  return exchange(due, stop, true);
}

void CollectiveAverager::open_control(std::span<const DueAverage> due, bool stop) {
  opened_ = site_rows(due, stop, true);
}

Averager::ControlAnswer CollectiveAverager::close_control() {
  if (!opened_)
    throw Error("collective averager: step " + std::to_string(step_) +
                " closes a control exchange it never opened");
  const ControlRows site = std::move(*opened_);
  opened_.reset();
  std::optional<SyncMeasure> measured;
  ControlAnswer answer = close_with([&] { return agree(site, measured); });
  answer.measure = measured;
  return answer;
}

bool CollectiveAverager::exchange(std::span<const DueAverage> due, bool stop, bool measure) {
  std::optional<SyncMeasure> measured;
  const bool any_stop = agree(site_rows(due, stop, measure), measured);
  if (measure && sites() > 1) measure_ = measured;
  return any_stop;
}

// The rows of one rank's control message: one PayloadHealth per due state (zero when the guard
// is off), then the stop request in `nonfinite`, then with `measure` three rows of what this
// rank measured since the last such exchange: {seconds of its averages, their wide-area bytes},
// {its mean compute seconds per step, the number of averages} and {its compute seconds, 0}. A
// site's row is the sum of its ranks' rows, except the seconds (the slowest rank's) and the
// count (the same on every rank: the engine finishes a site's averages before the next
// exchange).
CollectiveAverager::ControlRows CollectiveAverager::site_rows(std::span<const DueAverage> due,
                                                              bool stop, bool measure) {
  ControlRows out;
  out.stop = stop;
  out.measure = measure;
  const int sites = this->sites();
  if (sites == 1) return out;  // the site reducer already agreed on the stop
  for (const DueAverage& d : due) {
    check_one_replica(d.kind, d.local);
    out.kinds.push_back(d.kind);
    out.elements.push_back(d.local[0].size());
  }
  const std::size_t stop_row = due.size();
  const std::size_t rows = due.size() + 1 + (measure ? 3 : 0);
  std::vector<PayloadHealth>& mine = out.rows;
  mine.resize(rows);
  const int ranks = site_ != nullptr ? site_->size() : 1;
  const int r = site_ != nullptr ? site_->rank() : 0;
  // Its own scratch, kept per thread: an average started earlier may still use scratch_ on the
  // communication thread, and a fresh buffer of a large shard costs page faults every time.
  thread_local std::vector<float> scratch;
  if (guard_.enabled)
    for (std::size_t k = 0; k < due.size(); ++k) {
      const std::span<float> data = due[k].local[0];
      for (const WanRing& w : rings_) {  // summed in segment order, as the VirtualAverager does
        const transport::Range b = map_.segment(data.size(), w.segment);
        mine[k] +=
            measure_sent(due[k].codec, 0, b, data.subspan(b.offset, b.count), sites, scratch);
      }
    }
  mine[stop_row].nonfinite = stop ? 1.0 : 0.0;
  if (measure) {
    const std::lock_guard lock(traffic_mu_);
    mine[stop_row + 1] = {pending_.seconds, double(pending_.bytes)};
    mine[stop_row + 2] = {pending_.steps > 0 ? pending_.compute / pending_.steps : 0.0,
                          double(pending_.averages)};
    mine[stop_row + 3] = {pending_.compute, 0.0};
    pending_ = {};
  }
  if (site_ == nullptr) return out;
  // The site's figure is the sum of its ranks' shard figures in rank order: every rank of the
  // site holds the same bits, even when one rank's shard is the bad one.
  std::vector<PayloadHealth> gathered(rows * static_cast<std::size_t>(ranks));
  site_->set_label({step_, transport::kLabelControl, static_cast<std::uint32_t>(r)});
  site_->all_gather(std::as_bytes(std::span<const PayloadHealth>(mine)),
                    std::as_writable_bytes(std::span<PayloadHealth>(gathered)));
  std::fill(mine.begin(), mine.end(), PayloadHealth{});
  for (int q = 0; q < ranks; ++q)
    for (std::size_t k = 0; k < rows; ++k) {
      const PayloadHealth& h = gathered[std::size_t(q) * rows + k];
      if (k == stop_row + 1) {
        mine[k].nonfinite = std::max(mine[k].nonfinite, h.nonfinite);
        mine[k].sum_squares += h.sum_squares;
      } else if (k == stop_row + 3) {
        mine[k].nonfinite = std::max(mine[k].nonfinite, h.nonfinite);
      } else if (k == stop_row + 2) {
        mine[k].nonfinite = std::max(mine[k].nonfinite, h.nonfinite);
        mine[k].sum_squares = h.sum_squares;
      } else {
        mine[k] += h;
      }
    }
  return out;
}

bool CollectiveAverager::agree(const ControlRows& site, std::optional<SyncMeasure>& measured) {
  const int sites = this->sites();
  if (sites == 1) return site.stop;
  const std::size_t states = site.kinds.size();
  const std::size_t stop_row = states;
  const std::size_t rows = site.rows.size();
  // The WAN all-gather gives every rank of the job the same table, so all decide alike. A rank
  // of several segments makes it on each of their rings, in segment order: each ring's other
  // ranks wait for it there (the tables are the same).
  health_.assign(rows * static_cast<std::size_t>(sites), PayloadHealth{});
  for (const WanRing& w : rings_) {
    w.ring->set_label({step_, transport::kLabelControl, static_cast<std::uint32_t>(w.segment)});
    w.ring->all_gather(std::as_bytes(std::span<const PayloadHealth>(site.rows)),
                       std::as_writable_bytes(std::span<PayloadHealth>(health_)));
  }
  bool any_stop = false;
  for (int s = 0; s < sites; ++s)
    any_stop = any_stop || health_[std::size_t(s) * rows + stop_row].nonfinite > 0.0;
  if (site.measure) {
    SyncMeasure m;
    m.bytes_per_s = std::numeric_limits<double>::infinity();
    for (int s = 0; s < sites; ++s) {
      const PayloadHealth& wire = health_[std::size_t(s) * rows + stop_row + 1];
      const PayloadHealth& work = health_[std::size_t(s) * rows + stop_row + 2];
      if (work.sum_squares < 1.0 || wire.nonfinite <= 0.0) {  // a site measured no average
        m = {};
        break;
      }
      m.state_seconds = std::max(m.state_seconds, wire.nonfinite / work.sum_squares);
      m.compute_seconds = std::max(m.compute_seconds, work.nonfinite);
      m.bytes_per_s = std::min(m.bytes_per_s, wire.sum_squares / wire.nonfinite);
    }
    measured = m.valid() ? std::optional(m) : std::nullopt;
    // Each site's wait: the slowest site's compute since the exchange before, less its own.
    std::vector<double> waits(static_cast<std::size_t>(sites));
    double slowest = 0.0;
    for (int s = 0; s < sites; ++s)
      slowest = std::max(slowest, health_[std::size_t(s) * rows + stop_row + 3].nonfinite);
    for (int s = 0; s < sites; ++s)
      waits[std::size_t(s)] = slowest - health_[std::size_t(s) * rows + stop_row + 3].nonfinite;
    const std::lock_guard lock(traffic_mu_);
    waits_ = std::move(waits);
  }
  if (guard_.enabled)
    for (std::size_t k = 0; k < states; ++k) {
      std::vector<PayloadHealth> column(static_cast<std::size_t>(sites));
      for (int s = 0; s < sites; ++s) column[std::size_t(s)] = health_[std::size_t(s) * rows + k];
      // One warning per site (its rank 0), not one per rank.
      hold_verdict(site.kinds[k],
                   judge_payloads(column, site.elements[k], guard_, step_, site.kinds[k]), sites,
                   site_ == nullptr || site_->rank() == 0);
    }
  return any_stop;
}

void CollectiveAverager::check_one_replica(optim::StateKind kind,
                                           std::span<const std::span<float>> local) const {
  if (local.size() != 1)
    throw Error("collective averager: WAN rank " + std::to_string(wan().rank()) + " got " +
                std::to_string(local.size()) + " replicas of '" + optim::to_string(kind) +
                "'; a networked rank holds exactly one");
}

CollectiveAverager::Decision CollectiveAverager::decide(optim::StateKind kind,
                                                        std::span<float> data) {
  const int sites = this->sites();
  std::optional<Verdict> verdict;
  if (guard_.enabled) {
    if (!verdicts_[static_cast<std::size_t>(kind)]) {  // no control exchange this step: alone
      const std::optional<CodecViews>& codec = codec_[static_cast<std::size_t>(kind)];
      const DueAverage d{kind, std::span<const std::span<float>>(&data, 1),
                         codec ? &*codec : nullptr};
      exchange(std::span<const DueAverage>(&d, 1), false, false);
    }
    verdict = take_verdict(kind);
  }
  const std::vector<char> left_out = left_out_of(verdict, sites);
  const auto me = static_cast<std::size_t>(wan().rank());
  Decision out{verdict ? verdict->kept : sites, left_out[me] != 0, 1.0f};
  out.scale = contribution_scales(left_out)[me];
  return out;
}

Traffic CollectiveAverager::traffic(int w) const {
  if (w != 0)
    throw Error("collective averager: WAN rank " + std::to_string(wan().rank()) +
                " only knows its own traffic (site 0 of its local replicas), not site " +
                std::to_string(w));
  const std::lock_guard lock(traffic_mu_);
  return traffic_;
}

}  // namespace desloc::sync
