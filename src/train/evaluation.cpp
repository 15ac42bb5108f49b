// Evaluation of the mean model (evaluation.hpp).
#include "train/evaluation.hpp"

#include <cmath>
#include <limits>

#include "desloc/sync/averager.hpp"

namespace desloc::train {

std::vector<float> mean_of(std::vector<SiteReplica>& sites, optim::StateKind kind, int ranks,
                           int lanes, double lane_share) {
  auto replicas = views_of(sites);
  const auto all = sync::state_views(replicas, kind);
  std::vector<float> mean(all[0].begin(), all[0].end());
  if (all.size() > 1) {
    std::vector<std::vector<float>> copies;
    for (auto& s : all) copies.emplace_back(s.begin(), s.end());
    std::vector<std::span<float>> views(copies.begin(), copies.end());
    sync::VirtualAverager ring(static_cast<int>(views.size()), sync::SumOrder::kRing, ranks, lanes,
                               lane_share);
    ring.average(kind, views);
    mean = std::move(copies[0]);
  }
  return mean;
}

Evaluator::Evaluator(const JobConfig& cfg, model::Model& model, const data::DatasetInfo& dataset)
    : cfg_(cfg),
      model_(model),
      eval_(dataset, cfg.data.batch, cfg.seq_len()),
      token_bytes_(dataset.load_tokenizer()->token_bytes()),
      site0_(!cfg.sync.averages_params()) {}

void Evaluator::bind(RankContext* rank) {
  rank_ = rank;
  averager_.reset();
  if (rank != nullptr)
    averager_.emplace(*rank->wan_group, rank->site_group, rank->wan_reverse,
                      cfg_.transport.lane_share);
}

std::optional<Evaluation> Evaluator::evaluate(std::int64_t step, std::vector<SiteReplica>& sites) {
  std::vector<float> mean_x;
  if (site0_) {
    if (rank_ != nullptr && !rank_->evaluates) return std::nullopt;
    mean_x = sites[0].x;
  } else if (rank_ != nullptr) {
    mean_x = sites[0].x;
    std::span<float> view(mean_x);
    averager_->begin_step(step);
    averager_->average(optim::StateKind::kX, std::span<const std::span<float>>(&view, 1));
    if (!rank_->evaluates) return std::nullopt;
  } else {
    mean_x = mean_of(sites, optim::StateKind::kX, cfg_.job.ranks_per_site, cfg_.transport.lanes,
                     cfg_.transport.lane_share);
  }
  std::copy(mean_x.begin(), mean_x.end(), model_.params().begin());
  model_.params_updated();
  const int B = cfg_.data.batch, T = cfg_.seq_len();
  std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tgt(in.size());
  const std::uint64_t n = std::min<std::uint64_t>(
      static_cast<std::uint64_t>(cfg_.train.eval_batches), eval_.num_batches());
  if (n == 0)
    return Evaluation{std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<double>::quiet_NaN()};
  double sum = 0.0;
  std::uint64_t bytes = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    eval_.batch(i, in, tgt);
    sum += model_.forward({in, tgt, B, T});
    for (const std::int32_t t : tgt) bytes += token_bytes_.at(static_cast<std::size_t>(t));
  }
  // The forward pass gives the mean over B*T targets; bits per byte is the sum of their nats
  // over the bytes they stand for, in bits.
  const double nats = sum * double(B) * double(T);
  return Evaluation{static_cast<float>(sum / double(n)),
                    bytes == 0 ? std::numeric_limits<double>::quiet_NaN()
                               : nats / (std::log(2.0) * double(bytes))};
}

}  // namespace desloc::train
