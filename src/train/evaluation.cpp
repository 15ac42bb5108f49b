// Evaluation of the mean model (evaluation.hpp).
#include "train/evaluation.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>

#include "desloc/sync/averager.hpp"
#include "desloc/transport/collective.hpp"
#include "desloc/transport/job_gather.hpp"

namespace desloc::train {

std::vector<float> mean_of(std::vector<SiteReplica>& sites, optim::StateKind kind,
                           const sync::ShardMap& map, int lanes, double lane_share,
                           std::span<const double> weights) {
  auto replicas = views_of(sites);
  const auto all = sync::state_views(replicas, kind);
  std::vector<float> mean(all[0].begin(), all[0].end());
  if (all.size() > 1) {
    std::vector<std::vector<float>> copies;
    for (auto& s : all) copies.emplace_back(s.begin(), s.end());
    std::vector<std::span<float>> views(copies.begin(), copies.end());
    sync::VirtualAverager ring(static_cast<int>(views.size()), sync::SumOrder::kRing, map, lanes,
                               lane_share);
    ring.set_weights({weights.begin(), weights.end()});
    ring.average(kind, views);
    mean = std::move(copies[0]);
  }
  return mean;
}

Evaluator::Evaluator(const JobConfig& cfg, model::Model& model, const data::DatasetInfo& dataset)
    : cfg_(cfg),
      model_(model),
      eval_(dataset, cfg.data.batch, cfg.seq_len()),
      // Another tool's tokens come without their tokenizer: no bits per byte (NaN) for them.
      token_bytes_(dataset.format == data::TokenFormat::kDesloc
                       ? dataset.load_tokenizer()->token_bytes()
                       : std::vector<std::uint32_t>()),
      site0_(!cfg.sync.averages_params()),
      map_(cfg.wan_map()) {}

void Evaluator::bind(RankContext* rank) {
  rank_ = rank;
  averager_.reset();
  if (rank != nullptr) {
    averager_.emplace(rank->wan_rings, map_, rank->site_group, cfg_.transport.lane_share);
    averager_->set_weights(cfg_.site_weights(rank->live_sites));
  }
}

namespace {
// One validation batch's result: its mean loss and the bytes of text its targets stand for.
struct BatchResult {
  double loss = 0;
  std::uint64_t bytes = 0;
};

// A networked job's evaluation is shared: every rank holds the mean x, so rank w of the W
// ranks of the live sites (counted site by site in ring order, whatever each site's rank count)
// runs batches w, w + W, ..., and one job-wide gather (transport::gather_job) gives every rank
// every batch's result, in batch order.
struct Share {
  std::size_t index = 0, count = 1;
};
Share share_of(const JobConfig& cfg, const RankContext& rank) {
  Share s;
  s.count = 0;
  for (std::size_t p = 0; p < rank.live_sites.size(); ++p) {
    if (static_cast<int>(p) == rank.wan_group()->rank()) s.index = s.count + std::size_t(rank.rank);
    s.count += static_cast<std::size_t>(cfg.site_ranks(rank.live_sites[p]));
  }
  return s;
}

// Every rank's `mine` (batches share.index + j * share.count, padded to `per_rank`) into the
// n batches' results in order.
std::vector<BatchResult> gather(const RankContext& rank, std::vector<BatchResult> mine,
                                std::size_t per_rank, std::size_t n) {
  mine.resize(per_rank);
  const std::vector<transport::Collective*> rings = rank.rings();
  const transport::JobBlocks all =
      transport::gather_job(std::as_bytes(std::span<const BatchResult>(mine)), rank.site_group,
                            rings, {-1, transport::kLabelControl, 0});
  const auto* results = reinterpret_cast<const BatchResult*>(all.bytes.data());
  const std::size_t W = all.bytes.size() / all.block;
  std::vector<BatchResult> ordered(n);
  for (std::size_t i = 0; i < n; ++i) ordered[i] = results[(i % W) * per_rank + i / W];
  return ordered;
}
}  // namespace

std::optional<Evaluation> Evaluator::evaluate(std::int64_t step, std::vector<SiteReplica>& sites) {
  std::vector<float> mean_x;
  const bool shared = !site0_ && rank_ != nullptr;  // every rank holds the mean: split the work
  if (site0_) {
    if (rank_ != nullptr && !rank_->evaluates) return std::nullopt;
    mean_x = sites[0].x;
  } else if (rank_ != nullptr) {
    mean_x = sites[0].x;
    std::span<float> view(mean_x);
    averager_->begin_step(step);
    averager_->average(optim::StateKind::kX, std::span<const std::span<float>>(&view, 1));
  } else {
    mean_x = mean_of(sites, optim::StateKind::kX, map_, cfg_.transport.lanes,
                     cfg_.transport.lane_share, cfg_.site_weights(static_cast<int>(sites.size())));
  }
  const std::size_t n =
      std::min<std::size_t>(static_cast<std::size_t>(cfg_.train.eval_batches), eval_.num_batches());
  if (n == 0) {
    if (shared && !rank_->evaluates) return std::nullopt;
    return Evaluation{std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<double>::quiet_NaN()};
  }
  std::copy(mean_x.begin(), mean_x.end(), model_.params().begin());
  model_.params_updated();
  const int B = cfg_.data.batch, T = cfg_.seq_len();
  std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tgt(in.size());
  const Share share = shared ? share_of(cfg_, *rank_) : Share{};
  std::vector<BatchResult> results;
  for (std::size_t i = share.index; i < n; i += share.count) {
    eval_.batch(i, in, tgt);
    BatchResult b{model_.forward({in, tgt, B, T}), 0};
    if (!token_bytes_.empty())
      for (const std::int32_t t : tgt) b.bytes += token_bytes_.at(static_cast<std::size_t>(t));
    results.push_back(b);
  }
  if (shared) {
    results = gather(*rank_, std::move(results), (n + share.count - 1) / share.count, n);
    if (!rank_->evaluates) return std::nullopt;
  }
  // Summed in batch order, wherever each batch ran: the in-process run's sum.
  double sum = 0.0;
  std::uint64_t bytes = 0;
  for (const BatchResult& b : results) {
    sum += b.loss;
    bytes += b.bytes;
  }
  // The forward pass gives the mean over B*T targets; bits per byte is the sum of their nats
  // over the bytes they stand for, in bits.
  const double nats = sum * double(B) * double(T);
  return Evaluation{static_cast<float>(sum / double(n)),
                    bytes == 0 ? std::numeric_limits<double>::quiet_NaN()
                               : nats / (std::log(2.0) * double(bytes))};
}

}  // namespace desloc::train
