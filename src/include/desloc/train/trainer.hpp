// Single-site training: the loop that drives model, optimizer, data, evaluation,
// metrics and checkpoints. Multi-site sync plugs in between gradient and update (later).
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
  float last_val_loss = 0.0f;       // NaN when no evaluation ran
  double unigram_entropy_nats = 0;  // of the training split, for comparison with val loss
  double tokens_per_s = 0;          // mean over this run's steps
  bool interrupted = false;         // stopped by SIGINT/SIGTERM after saving a checkpoint
  std::string last_checkpoint;
};

// Runs training. Throws ConfigError/DataError with context (file, key, step) on bad input,
// and Error("loss is not finite at step N ...") if training diverges.
TrainResult run_training(const JobConfig& cfg, const TrainOptions& opts);

// Where run_training puts things inside cfg.train.out_dir.
std::string metrics_path(const JobConfig& cfg);
std::string checkpoint_dir(const JobConfig& cfg);

}  // namespace desloc::train
