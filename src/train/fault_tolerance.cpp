// Fault tolerance of one networked rank: rollback points, the rollback, the retried start and
// the state transfer (fault_tolerance.hpp).
#include "train/fault_tolerance.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <vector>

#include "desloc/core/cpu_time.hpp"
#include "desloc/core/error.hpp"
#include "desloc/core/hash.hpp"
#include "desloc/core/log.hpp"
#include "desloc/transport/ring_order.hpp"

namespace desloc::train {

bool FaultTolerance::recoverable(const std::exception& e) {
  return dynamic_cast<const TransportError*>(&e) != nullptr ||
         dynamic_cast<const TimeoutError*>(&e) != nullptr ||
         dynamic_cast<const PeerFailure*>(&e) != nullptr;
}

FaultTolerance::FaultTolerance(RankContext& rank, Run& run, bool resuming)
    : rank_(rank),
      run_(run),
      rejoining_(rank.joining && !resuming),
      transfer_due_(rejoining_) {}

void FaultTolerance::started(std::int64_t step) {
  if (!rejoining_) keep_point(step);
}

void FaultTolerance::keep_point(std::int64_t step) {
  TrainState reuse;
  if (points_.size() >= 2 && points_.back().state.step < step) {
    reuse = std::move(points_.front().state);
    points_.pop_front();
  }
  const std::uint64_t wire = run_.wire_bytes();
  TrainState state = run_.capture(std::move(reuse));
  while (!points_.empty() && points_.back().state.step >= state.step) points_.pop_back();
  points_.push_back({std::move(state), wire});
  while (points_.size() > 2) points_.pop_front();
}

void FaultTolerance::before_step(std::int64_t t, bool talks_across_sites) {
  const std::int64_t step = t - 1;  // the steps completed: the state before step t
  // A rejoining rank has nothing worth keeping until its state arrived.
  if (talks_across_sites && !(transfer_due_ && rank_.joining)) keep_point(step);
  if (transfer_due_) {
    const bool was_joining = rank_.joining;
    transfer(step);
    transfer_due_ = false;
    if (was_joining && talks_across_sites) keep_point(step);
  }
  if (rank_.recovery_pending())
    throw PeerFailure(
        fmt::format("{}: the coordinator closed membership epoch {}", rank_.name, rank_.epoch));
}

void FaultTolerance::transfer(std::int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool joined = rank_.joining;
  const std::uint64_t moved = transfer_state(rank_, step, run_.replica(), run_.shared());
  rank_.joining = false;
  rank_.joining_sites.clear();
  rejoining_ = false;
  run_.transferred(step, joined, moved, seconds_since(t0));
}

FaultTolerance::Rollback FaultTolerance::recover(std::int64_t failed_at, const std::string& what) {
  failures_of_step_ = failed_at == last_failed_at_ ? failures_of_step_ + 1 : 1;
  last_failed_at_ = failed_at;
  if (failures_of_step_ > kMaxFailuresOfOneStep)
    throw PeerFailure(fmt::format(
        "{}: step {} failed {} times, each time in a new membership epoch; giving up (last "
        "failure: {})",
        rank_.name, failed_at, failures_of_step_, what));
  std::vector<std::int64_t> offer;
  for (const auto& p : points_) offer.push_back(p.state.step);
  log::warn("{}: step {} failed ({}); recovering with rollback point(s) [{}]", rank_.name,
            failed_at, what, fmt::join(offer, ", "));
  const std::uint64_t wire_now = run_.wire_bytes();
  run_.release_groups();
  const std::int64_t resume = rank_.recover(offer, what);
  run_.bind_groups();
  transfer_due_ = !rank_.joining_sites.empty();
  Rollback out;
  out.step = resume;
  if (rank_.joining) return out;  // this rank offered no usable point: a peer sends the state
  const auto it = std::find_if(points_.begin(), points_.end(),
                               [&](const Point& p) { return p.state.step == resume; });
  if (it == points_.end())
    throw PeerFailure(fmt::format(
        "{}: the coordinator resumes at step {}, which this rank holds no snapshot of ([{}])",
        rank_.name, resume, fmt::join(offer, ", ")));
  out.state = it->state;
  out.bytes_resent = wire_now - it->wire;
  points_.erase(std::next(it), points_.end());
  return out;
}

// Before anything was written every survivor offers step 0, which stands for "before the first
// step" here.
bool FaultTolerance::retry_start(const Error& e, int attempt) {
  if (rejoining_ || !recoverable(e) || attempt >= kMaxFailuresOfOneStep) return false;
  log::warn("{}: the job's start failed ({}); agreeing again in the next epoch", rank_.name,
            e.message());
  run_.release_groups();
  const std::int64_t before_start = 0;
  rank_.recover(std::span(&before_start, 1), e.message());
  run_.bind_groups();
  transfer_due_ = !rank_.joining_sites.empty();
  return true;
}

namespace {

// The period switches in force, as the donor sends them: a count, then (after, kx, ku, kv) each.
using SwitchTable = std::array<std::int64_t, 1 + 4 * sync::kMaxPeriodSwitches>;

void send_switches(transport::Collective& ring, const RankContext& rank, SharedState shared,
                   int donor, bool giving, bool receiving) {
  SwitchTable table{};
  const std::vector<sync::PeriodSwitch>& mine_now = shared.policy->switches();
  if (giving) {
    table[0] = static_cast<std::int64_t>(mine_now.size());
    for (std::size_t i = 0; i < mine_now.size(); ++i)
      for (std::size_t f = 0; const std::int64_t v :
                              {mine_now[i].after, mine_now[i].kx, mine_now[i].ku, mine_now[i].kv})
        table[1 + 4 * i + f++] = v;
  }
  ring.broadcast(std::as_writable_bytes(std::span(table)), donor);
  if (!receiving) return;
  if (table[0] < 0 || table[0] > static_cast<std::int64_t>(sync::kMaxPeriodSwitches))
    throw PeerFailure(
        fmt::format("{}: the donor {} sent {} period switches", rank.name, donor, table[0]));
  std::vector<sync::PeriodSwitch> switches(static_cast<std::size_t>(table[0]));
  for (std::size_t i = 0; i < switches.size(); ++i)
    switches[i] = {table[1 + 4 * i], table[2 + 4 * i], table[3 + 4 * i], table[4 + 4 * i]};
  shared.policy->restore_switches(switches);
}

}  // namespace

std::uint64_t transfer_state(RankContext& rank, std::int64_t step, SiteReplica& replica,
                             SharedState shared) {
  transport::Collective& wan = *rank.wan_group();
  const int S = wan.size(), me = wan.rank();
  const auto& joining = rank.joining_sites;
  auto is_joining = [&](int site) {
    return std::find(joining.begin(), joining.end(), site) != joining.end();
  };
  const std::size_t n = replica.x.size();
  const int ranks = rank.site_group != nullptr ? rank.site_group->size() : 1;
  const int r = rank.site_group != nullptr ? rank.site_group->rank() : 0;
  const sync::ShardMap map =
      rank.shard_map != nullptr ? *rank.shard_map : sync::ShardMap::even(ranks);
  std::vector<std::vector<float>*> states{&replica.x, &replica.opt.state().u,
                                          &replica.opt.state().v};
  // The outer optimizer's state and the references are the same on every site.
  std::vector<std::vector<float>*> shared_buffers;
  if (shared.outer != nullptr)
    shared_buffers = {&shared.outer->reference(), &shared.outer->momentum()};
  if (shared.compression != nullptr)
    for (const optim::StateKind k :
         {optim::StateKind::kX, optim::StateKind::kU, optim::StateKind::kV})
      if (!shared.compression->reference(k).empty())
        shared_buffers.push_back(&shared.compression->reference(k));
  std::vector<float> scratch;
  std::uint64_t moved = 0;
  auto crc_of = [](std::span<const float> v) {
    return crc32c({reinterpret_cast<const std::uint8_t*>(v.data()), v.size_bytes()});
  };
  for (const int j : joining) {
    int donor = j;
    do donor = (donor - 1 + S) % S;
    while (is_joining(donor) && donor != j);
    if (donor == j)
      throw PeerFailure(
          fmt::format("{}: every site of epoch {} is joining; none can donate the state", rank.name,
                      rank.epoch));
    const bool giving = me == donor, receiving = me == j;
    // Each of this rank's segments over its ring, in segment order.
    for (const sync::WanRing& w : rank.wan_rings) {
      transport::Collective& ring = *w.ring;
      const transport::Range seg = map.segment(n, w.segment);
      // step, the optimizer's step, x's, u's and v's CRC32C, the run id (bits as i64).
      std::array<std::int64_t, 6> head{step, replica.opt.state().t, 0, 0, 0, 0};
      if (giving && shared.run_id != nullptr) head[5] = static_cast<std::int64_t>(*shared.run_id);
      for (int k = 0; k < 3; ++k)
        if (giving)
          head[std::size_t(2 + k)] = crc_of(
              std::span<const float>(*states[std::size_t(k)]).subspan(seg.offset, seg.count));
      ring.set_label(
          {step, transport::kLabelTransferHeader, static_cast<std::uint32_t>(w.segment)});
      ring.broadcast(std::as_writable_bytes(std::span(head)), donor);
      if (shared.policy != nullptr)  // the period switches in force (re-plans included)
        send_switches(ring, rank, shared, donor, giving, receiving);
      scratch.resize(seg.count);
      for (int k = 0; k < 3; ++k) {
        std::span<float> buf =
            giving || receiving
                ? std::span<float>(*states[std::size_t(k)]).subspan(seg.offset, seg.count)
                : std::span<float>(scratch);
        ring.set_label(
            {step, static_cast<std::uint8_t>(k + 1), static_cast<std::uint32_t>(w.segment)});
        ring.broadcast(buf, donor);
        moved += buf.size_bytes();
        if (receiving && crc_of(buf) != static_cast<std::uint32_t>(head[std::size_t(2 + k)]))
          throw PeerFailure(fmt::format(
              "{}: the state transfer from {} failed its CRC32C check (segment {} of '{}'); the "
              "job retries in a new epoch",
              rank.name, donor, w.segment,
              k == 0   ? "x"
              : k == 1 ? "u"
                       : "v"));
      }
      if (receiving) {
        if (head[0] != step)
          throw PeerFailure(fmt::format("{}: the donor sent the state of step {}, expected {}",
                                        rank.name, head[0], step));
        replica.opt.state().t = head[1];
        if (shared.run_id != nullptr) *shared.run_id = static_cast<std::uint64_t>(head[5]);
      }
      for (std::vector<float>* v : shared_buffers) {
        std::span<float> buf = giving || receiving
                                   ? std::span<float>(*v).subspan(seg.offset, seg.count)
                                   : std::span<float>(scratch);
        ring.broadcast(buf, donor);
        moved += buf.size_bytes();
      }
    }
    if (receiving && shared.compression != nullptr) shared.compression->clear_feedback();
  }
  if (rank.joining && rank.site_group != nullptr) {  // the site's ranks share their ranges
    const std::size_t blk = map.largest_owned(n, ranks);
    const transport::Range mine = map.owned(n, ranks, r);
    std::vector<float> gathered(blk * static_cast<std::size_t>(ranks));
    states.insert(states.end(), shared_buffers.begin(), shared_buffers.end());
    for (std::vector<float>* v : states) {
      std::copy_n(v->begin() + static_cast<std::ptrdiff_t>(mine.offset), mine.count,
                  gathered.begin() + static_cast<std::ptrdiff_t>(r * blk));
      rank.site_group->all_gather(std::span<const float>(gathered).subspan(r * blk, blk), gathered);
      for (int q = 0; q < ranks; ++q) {
        const transport::Range b = map.owned(n, ranks, q);
        std::copy_n(gathered.begin() + static_cast<std::ptrdiff_t>(q * blk), b.count,
                    v->begin() + static_cast<std::ptrdiff_t>(b.offset));
      }
    }
  }
  return moved;
}

}  // namespace desloc::train
