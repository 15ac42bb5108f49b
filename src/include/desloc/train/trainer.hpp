// Training: the loop that drives model, optimizer, data, sync, evaluation, metrics and
// checkpoints, for one worker or M in-process virtual workers.
#pragma once

#include <cstdint>
#include <string>

#include "desloc/train/config.hpp"

namespace desloc::train {

struct TrainOptions {
  bool resume = false;  // continue from the newest valid checkpoint in out_dir
  std::int64_t stop_after =
      -1;             // stop (with a checkpoint) once this many steps are done; -1 = run all
  int progress = -1;  // 1 = progress bar, 0 = log lines, -1 = bar only if stderr is a TTY
};

struct TrainResult {
  std::int64_t start_step = 0;
  std::int64_t steps_done = 0;  // optimizer steps completed in total (including before a resume)
  float last_train_loss = 0.0f;
  float last_val_loss = 0.0f;               // NaN when no evaluation ran
  double unigram_entropy_nats = 0;          // of the training split, for comparison with val loss
  double tokens_per_s = 0;                  // mean over this run's steps
  int workers = 1;                          // workers at the end of the run
  std::uint64_t bytes_sent_per_worker = 0;  // ring all-reduce wire bytes of worker 0, this run
  bool interrupted = false;                 // stopped by SIGINT/SIGTERM after saving a checkpoint
  std::string last_checkpoint;
};

// Runs training. Throws ConfigError/DataError with context (file, key, step) on bad input,
// and Error("loss is not finite at step N ...") if training diverges.
TrainResult run_training(const JobConfig& cfg, const TrainOptions& opts);

// Where run_training puts things inside cfg.train.out_dir.
std::string metrics_path(const JobConfig& cfg);
std::string checkpoint_dir(const JobConfig& cfg);

}  // namespace desloc::train
