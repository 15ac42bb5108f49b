// The in-process virtual-site averager.
#include "desloc/sync/averager.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/transport/ring_order.hpp"

namespace desloc::sync {

VirtualAverager::VirtualAverager(int sites, SumOrder order, int shards, int lanes,
                                 double lane_share)
    : VirtualAverager(sites, order, ShardMap::even(shards), lanes, lane_share) {}

VirtualAverager::VirtualAverager(int sites, SumOrder order, ShardMap map, int lanes,
                                 double lane_share)
    : sites_(sites),
      order_(order),
      map_(std::move(map)),
      lanes_(lanes),
      lane_share_(lane_share),
      traffic_(static_cast<std::size_t>(sites)) {
  if (sites < 1) throw ConfigError("sync.workers must be >= 1, got " + std::to_string(sites));
  if (!map_.alike() && map_.sites_known() != sites)
    throw ConfigError("virtual averager: a shard map of " + std::to_string(map_.sites_known()) +
                      " sites for " + std::to_string(sites));
}

void VirtualAverager::resize(int sites) {
  if (sites < 1) throw ConfigError("sync.workers must be >= 1, got " + std::to_string(sites));
  sites_ = sites;
  const std::lock_guard lock(traffic_mu_);
  traffic_.resize(static_cast<std::size_t>(sites));
}

void Averager::open_control(std::span<const DueAverage> due, bool stop) {
  opened_due_.assign(due.begin(), due.end());
  opened_stop_ = stop;
}

Averager::ControlAnswer Averager::close_control() {
  ControlAnswer answer = close_with([this] { return exchange_control(opened_due_, opened_stop_); });
  answer.measure = take_measure();
  opened_due_.clear();
  return answer;
}

Averager::ControlAnswer Averager::close_with(const std::function<bool()>& exchange) {
  ControlAnswer answer;
  answer_rejections_ = &answer.rejections;
  try {
    answer.stop = exchange();
  } catch (...) {
    answer_rejections_ = nullptr;
    throw;
  }
  answer_rejections_ = nullptr;
  return answer;
}

void Averager::hold_verdict(optim::StateKind kind, std::vector<Rejection> rejected, int sites,
                            bool log) {
  std::vector<Rejection>& record =
      answer_rejections_ != nullptr ? *answer_rejections_ : rejections_;
  record.insert(record.end(), rejected.begin(), rejected.end());
  const int kept = enforce_rejections(rejected, sites, guard_, log);
  verdicts_[static_cast<std::size_t>(kind)] = Verdict{std::move(rejected), kept};
}

std::optional<Averager::Verdict> Averager::take_verdict(optim::StateKind kind) {
  std::optional<Verdict> v;
  std::swap(v, verdicts_[static_cast<std::size_t>(kind)]);
  return v;
}

std::vector<float> Averager::contribution_scales(std::span<const char> left_out) const {
  std::vector<float> scales(left_out.size(), 1.0f);
  if (weights_.empty()) return scales;
  if (weights_.size() != left_out.size())
    throw Error("averager: " + std::to_string(weights_.size()) + " site weights for " +
                std::to_string(left_out.size()) + " sites");
  double total = 0.0;
  int kept = 0;
  for (std::size_t s = 0; s < weights_.size(); ++s)
    if (!left_out[s]) {
      total += weights_[s];
      ++kept;
    }
  if (!(total > 0.0))
    throw Error("averager: the kept sites' weights sum to " + std::to_string(total));
  for (std::size_t s = 0; s < weights_.size(); ++s)
    if (!left_out[s]) scales[s] = static_cast<float>(weights_[s] * kept / total);
  return scales;
}

std::vector<char> Averager::left_out_of(const std::optional<Verdict>& verdict, int sites) const {
  std::vector<char> out(static_cast<std::size_t>(sites), 0);
  if (verdict)
    for (const Rejection& r : verdict->rejected) out.at(static_cast<std::size_t>(r.site)) = 1;
  return out;
}

void VirtualAverager::check_replicas(optim::StateKind kind,
                                     std::span<const std::span<float>> local) const {
  if (static_cast<int>(local.size()) != sites_)
    throw Error("virtual averager: got " + std::to_string(local.size()) + " replicas of '" +
                optim::to_string(kind) + "' for " + std::to_string(sites_) + " sites");
  const std::size_t n = local.empty() ? 0 : local[0].size();
  for (const auto& r : local)
    if (r.size() != n)
      throw Error(std::string("virtual averager: replicas of '") + optim::to_string(kind) +
                  "' differ in length");
}

void VirtualAverager::judge(optim::StateKind kind, std::span<const std::span<float>> local,
                            const CodecViews* codec) {
  const std::size_t M = local.size();
  const std::size_t n = local.empty() ? 0 : local[0].size();
  std::vector<PayloadHealth> health(M);
  for (std::size_t w = 0; w < M; ++w) {
    const int ranks = map_.ranks_of(static_cast<int>(w));
    for (int q = 0; q < ranks; ++q) {
      PayloadHealth rank;
      const ShardMap::Segments mine = map_.segments_of(ranks, q);
      for (int j = mine.first; j < mine.last; ++j) {
        const transport::Range b = map_.segment(n, j);
        rank += measure_sent(codec, w, b, local[w].subspan(b.offset, b.count), static_cast<int>(M),
                             scratch_);
      }
      health[w] += rank;
    }
  }
  hold_verdict(kind, judge_payloads(health, n, guard_, step_, kind), static_cast<int>(M),
               /*log=*/true);
}

bool VirtualAverager::exchange_control(std::span<const DueAverage> due, bool stop) {
  for (const DueAverage& d : due) {
    check_replicas(d.kind, d.local);
    if (d.local.size() > 1 && guard_.enabled) judge(d.kind, d.local, d.codec);
  }
  return stop;
}

void VirtualAverager::average(optim::StateKind kind, std::span<const std::span<float>> local) {
  check_replicas(kind, local);
  const std::size_t n = local.empty() ? 0 : local[0].size();
  const std::size_t M = local.size();
  // Payload guard: rejected replicas contribute zeros and take the others' mean.
  std::vector<char> left_out(M, 0);
  std::size_t kept = M;
  if (M > 1 && guard_.enabled) {
    const std::optional<CodecViews>& codec = codec_[static_cast<std::size_t>(kind)];
    if (!verdicts_[static_cast<std::size_t>(kind)]) judge(kind, local, codec ? &*codec : nullptr);
    const Verdict verdict = *take_verdict(kind);
    kept = static_cast<std::size_t>(verdict.kept);
    for (const Rejection& r : verdict.rejected) left_out[static_cast<std::size_t>(r.site)] = 1;
  }
  std::optional<CodecViews> codec;
  std::swap(codec, codec_[static_cast<std::size_t>(kind)]);
  if (codec && !codec->reference.empty()) {
    average_compressed(kind, local, *codec, left_out);
    return;
  }
  const std::vector<float> scale =
      M > 1 ? contribution_scales(left_out) : std::vector<float>(M, 1.0f);
  if (M > 1 && order_ == SumOrder::kRing) {
    std::vector<float> sum;
    std::size_t largest = 0;
    for (int j = 0; j < map_.segments(); ++j) largest = std::max(largest, map_.segment(n, j).count);
    const std::vector<float> zeros(kept < M ? largest : 0, 0.0f);
    std::vector<std::span<const float>> parts(M);
    scaled_.resize(M);
    for (int j = 0; j < map_.segments(); ++j) {
      const transport::Range b = map_.segment(n, j);
      for (std::size_t w = 0; w < M; ++w) {
        parts[w] = left_out[w] ? std::span<const float>(zeros).first(b.count)
                               : local[w].subspan(b.offset, b.count);
        if (left_out[w] || scale[w] == 1.0f) continue;
        // What a networked rank's shard becomes before its ring (CollectiveAverager).
        scaled_[w].resize(b.count);
        for (std::size_t i = 0; i < b.count; ++i) scaled_[w][i] = parts[w][i] * scale[w];
        parts[w] = scaled_[w];
      }
      sum.resize(b.count);
      transport::lane_sum_reference(parts, sum, transport::effective_lanes(lanes_, sites_),
                                    lane_share_);
      const auto m = static_cast<float>(kept);
      for (float& x : sum) x /= m;
      for (std::size_t w = 0; w < M; ++w)
        std::copy(sum.begin(), sum.end(), local[w].begin() + static_cast<std::ptrdiff_t>(b.offset));
    }
  } else if (M > 1) {
    const double inv = 1.0 / static_cast<double>(kept);
#pragma omp parallel for schedule(static)
    for (std::size_t i = 0; i < n; ++i) {
      double s = 0.0;
      for (std::size_t w = 0; w < M; ++w)
        if (!left_out[w]) s += static_cast<double>(scale[w]) * static_cast<double>(local[w][i]);
      const auto mean = static_cast<float>(s * inv);
      for (std::size_t w = 0; w < M; ++w) local[w][i] = mean;
    }
  }
  const auto k = static_cast<std::size_t>(kind);
  const std::uint64_t payload = n * sizeof(float);
  // Ring all-reduce (reduce-scatter + all-gather): each site sends 2(M-1)/M of the payload.
  const std::uint64_t wire = M > 1 ? payload * 2 * (M - 1) / M : 0;
  const std::lock_guard lock(traffic_mu_);
  for (std::size_t w = 0; w < M; ++w) {
    traffic_[w].payload[k] += M > 1 ? payload : 0;
    traffic_[w].wire[k] += wire;
  }
}

// Segment by segment, as the networked ranks do: every replica's encoded contribution, each
// segment's ring replayed (segment s from site s on, each next site combining), then the
// combined sums decoded into the mean of every replica.
void VirtualAverager::average_compressed(optim::StateKind kind,
                                         std::span<const std::span<float>> local,
                                         const CodecViews& codec, std::span<const char> left_out) {
  const std::size_t n = local.empty() ? 0 : local[0].size();
  const std::size_t M = local.size();
  if (codec.reference.size() != n || (!codec.feedback.empty() && codec.feedback.size() != M))
    throw Error(std::string("virtual averager: the codec views of '") + optim::to_string(kind) +
                "' do not match its replicas");
  std::uint64_t wire = 0;
  if (M == 1) {  // nothing to average: the state is its own mean
    set_reference(codec, local[0], codec.reference);
  } else {
    const int S = static_cast<int>(M);
    int kept = 0;
    for (std::size_t w = 0; w < M; ++w) kept += left_out[w] ? 0 : 1;
    std::vector<std::vector<std::byte>>& bytes = encoded_;
    std::vector<std::byte>& combined = combined_;
    std::vector<float>& scratch = scratch_;
    std::vector<float>& mean = mean_;
    bytes.resize(M);
    const std::vector<float> scale = contribution_scales(left_out);
    for (int j = 0; j < map_.segments(); ++j) {
      const transport::Range b = map_.segment(n, j);
      const RingLayout l(codec, b.count, S);
      auto feedback = [&](std::size_t w) {
        return codec.feedback.empty() ? std::span<float>()
                                      : codec.feedback[w].subspan(b.offset, b.count);
      };
      const std::span<float> ref = codec.reference.subspan(b.offset, b.count);
      for (std::size_t w = 0; w < M; ++w) {
        bytes[w].resize(l.segment_bytes * M);
        encode_contribution(l, local[w].subspan(b.offset, b.count), ref, feedback(w),
                            left_out[w] != 0, bytes[w], scratch, scale[w]);
      }
      combined.assign(l.segment_bytes * M, std::byte{0});
      for (int s = 0; s < S; ++s) {
        const std::size_t at = static_cast<std::size_t>(s) * l.segment_bytes;
        for (int j = 1; j < S; ++j) {
          const auto from = static_cast<std::size_t>((s + j - 1) % S);
          const auto to = static_cast<std::size_t>((s + j) % S);
          for (std::size_t c = 0; c < l.pieces(s); ++c) {
            const std::size_t off = at + c * l.piece_bytes;
            combine_piece(l, s, c, std::span<const std::byte>(bytes[from]).subspan(off),
                          std::span<std::byte>(bytes[to]).subspan(off), feedback(to), scratch);
          }
        }
        const auto last = static_cast<std::size_t>((s + S - 1) % S);
        std::copy_n(bytes[last].begin() + static_cast<std::ptrdiff_t>(at), l.segment_bytes,
                    combined.begin() + static_cast<std::ptrdiff_t>(at));
      }
      mean.resize(b.count);
      finish_mean(l, codec, combined, kept, ref, mean, scratch);
      for (std::size_t w = 0; w < M; ++w)
        std::copy(mean.begin(), mean.end(),
                  local[w].begin() + static_cast<std::ptrdiff_t>(b.offset));
      // The reduce-scatter and the all-gather each send S - 1 segments.
      wire += 2 * (M - 1) * l.segment_bytes;
    }
  }
  const auto k = static_cast<std::size_t>(kind);
  const std::uint64_t payload = M > 1 ? n * sizeof(float) : 0;
  const std::lock_guard lock(traffic_mu_);
  for (std::size_t w = 0; w < M; ++w) {
    traffic_[w].payload[k] += payload;
    traffic_[w].wire[k] += wire;
  }
}

}  // namespace desloc::sync
