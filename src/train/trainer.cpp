// run_training and where a run keeps its files; the loop itself is TrainingRun
// (training_run.hpp).
#include "desloc/train/trainer.hpp"

#include <fmt/format.h>

#include <filesystem>

#include "desloc/train/memory_estimate.hpp"
#include "train/training_run.hpp"

namespace desloc::train {
namespace {
std::filesystem::path rank_dir(const JobConfig& cfg, const RankContext* rank) {
  std::filesystem::path dir(cfg.train.out_dir);
  if (rank == nullptr || rank->leader()) return dir;
  const auto sites = cfg.site_names();
  return dir / "ranks" /
         fmt::format("{}-{}", sites.at(static_cast<std::size_t>(rank->site)), rank->rank);
}
}  // namespace

std::string metrics_path(const JobConfig& cfg, const RankContext* rank) {
  return (rank_dir(cfg, rank) / "metrics.jsonl").string();
}
std::string checkpoint_dir(const JobConfig& cfg, const RankContext* rank) {
  return (rank_dir(cfg, rank) / "checkpoints").string();
}

TrainResult run_training(const JobConfig& cfg, const TrainOptions& opts, RankContext* rank) {
  // Before anything is allocated: a config this machine cannot hold is refused with its keys.
  check_memory(cfg, rank != nullptr ? ProcessRole::kRank : ProcessRole::kInProcess);
  return TrainingRun(cfg, opts, rank).run();
}

}  // namespace desloc::train
