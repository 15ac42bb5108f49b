// Evaluation: the validation loss of the model DES-LOC would ship, the sites' mean parameters.
// For one site that is its own x; in-process the mean is taken in the training averages'
// ring order; a networked job averages x across sites for it, then every rank runs a share of
// the validation batches and one reports (each batch's loss gathered and summed in batch
// order: the in-process sum, and no site waits at its next average while another evaluates
// alone). Under ddp every site holds the same x and under none the sites are independent
// models: both evaluate site 0's own x, with no traffic.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "desloc/data/loader.hpp"
#include "desloc/model/model.hpp"
#include "desloc/sync/collective_averager.hpp"
#include "desloc/train/config.hpp"
#include "desloc/train/trainer.hpp"
#include "train/replica.hpp"

namespace desloc::train {

// The mean of one state over in-process replicas, in the training averages' order, without
// touching them (evaluation, elastic join), each site weighing `weights` (empty: alike).
std::vector<float> mean_of(std::vector<SiteReplica>& sites, optim::StateKind kind,
                           const sync::ShardMap& map, int lanes, double lane_share,
                           std::span<const double> weights);

// A validation result: nats per token and bits per byte of the text the targets stand for (so
// runs with different tokenizers compare honestly). bits_per_byte is NaN without batches.
struct Evaluation {
  float loss = 0.0f;
  double bits_per_byte = 0.0;
};

class Evaluator {
 public:
  Evaluator(const JobConfig& cfg, model::Model& model, const data::DatasetInfo& dataset);

  // A networked rank's groups (again after a recovery); nullptr in-process.
  void bind(RankContext* rank);
  void unbind() { averager_.reset(); }

  // Whether evaluating needs the other sites (a cross-site average of x).
  bool talks_across_sites() const { return !site0_; }
  // The validation loss at `step` (NaN without validation batches); nullopt on a rank that
  // only took part (the average, its share of the batches).
  std::optional<Evaluation> evaluate(std::int64_t step, std::vector<SiteReplica>& sites);

 private:
  const JobConfig& cfg_;
  model::Model& model_;
  data::EvalLoader eval_;
  std::vector<std::uint32_t> token_bytes_;  // the bytes of text each token id stands for
  bool site0_;
  const sync::ShardMap map_;  // the job's wide-area shard map (JobConfig::wan_map)
  RankContext* rank_ = nullptr;
  // The evaluation's parameter mean travels separately, so it never counts as training traffic.
  std::optional<sync::CollectiveAverager> averager_;
};

}  // namespace desloc::train
