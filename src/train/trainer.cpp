// run_training and where a run keeps its files; the loop itself is TrainingRun
// (training_run.hpp).
#include "desloc/train/trainer.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <optional>

#include "desloc/core/error.hpp"
#include "desloc/data/prepare.hpp"
#include "desloc/train/memory_estimate.hpp"
#include "desloc/train/out_dir_lock.hpp"
#include "train/training_run.hpp"

namespace desloc::train {
namespace {
std::filesystem::path rank_dir(const JobConfig& cfg, const RankContext* rank) {
  return rank == nullptr ? std::filesystem::path(cfg.train.out_dir)
                         : std::filesystem::path(output_dir(cfg, rank->site, rank->rank));
}
}  // namespace

std::string output_dir(const JobConfig& cfg, int site, int rank) {
  std::filesystem::path dir(cfg.train.out_dir);
  if (site == 0 && rank == 0) return dir.string();
  const auto sites = cfg.site_names();
  return (dir / "ranks" / fmt::format("{}-{}", sites.at(static_cast<std::size_t>(site)), rank))
      .string();
}

std::string metrics_path(const JobConfig& cfg, const RankContext* rank) {
  return (rank_dir(cfg, rank) / "metrics.jsonl").string();
}
std::string checkpoint_dir(const JobConfig& cfg, const RankContext* rank) {
  return (rank_dir(cfg, rank) / "checkpoints").string();
}

data::DatasetInfo dataset_of(const JobConfig& cfg) {
  if (cfg.data.format == data::TokenFormat::kDesloc) return data::load_dataset(cfg.data.dir);
  return data::external_dataset(cfg.data.dir, cfg.data.format,
                                static_cast<std::uint32_t>(cfg.model.vocab));
}

data::DatasetInfo load_training_data(const JobConfig& cfg) {
  data::DatasetInfo d = dataset_of(cfg);
  if (static_cast<int>(d.vocab) > cfg.model.vocab)
    throw ConfigError(
        fmt::format("{}: model.vocab = {} is smaller than the dataset's vocabulary {} ({})",
                    cfg.source, cfg.model.vocab, d.vocab, cfg.data.dir));
  return d;
}

TrainResult run_training(const JobConfig& cfg, const TrainOptions& opts, RankContext* rank) {
  // Before anything is allocated: a config this machine cannot hold is refused with its keys.
  check_memory(cfg, rank != nullptr ? ProcessRole::kRank : ProcessRole::kInProcess);
  TrainingRun run(cfg, opts, rank);  // reads the data; writes nothing yet
  // A networked rank took its directory's lock before it registered (cluster::run_worker).
  std::optional<OutDirLock> lock;
  if (rank == nullptr) lock.emplace(cfg.train.out_dir, "desloc train");
  return run.run();
}

}  // namespace desloc::train
