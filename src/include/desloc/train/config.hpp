// The job configuration: TOML tables mapped onto typed structs with defaults.
// Every tunable is declared once, in config.cpp's bind_* functions, together with its
// default and its one-line documentation; `desloc config --defaults` prints them all.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "desloc/model/gpt_config.hpp"
#include "desloc/optim/optimizer.hpp"
#include "desloc/sync/sync_policy.hpp"

namespace desloc::train {

struct DataConfig {
  std::string dir = "data/brown";  // directory written by `desloc prepare` (holds dataset.toml)
  int batch = 16;                  // sequences per step per rank (B)
  int seq_len = 0;                 // tokens per sequence (T); 0 = model.context
  std::uint64_t seed = 1234;       // data order
};

struct RunConfig {
  std::int64_t steps = 600;    // optimizer steps; also the length of the LR schedule
  int eval_every = 100;        // steps between validation evaluations (0 = only at the end)
  int eval_batches = 16;       // validation batches per evaluation
  int checkpoint_every = 200;  // steps between checkpoints (0 = only at the end)
  int log_every = 10;          // steps between plain log lines (when not on a TTY)
  std::string out_dir = "runs/quickstart";  // metrics.jsonl and checkpoints go here
  std::uint64_t seed = 42;                  // parameter initialisation
  std::string backend = "cpu";              // "cpu" | "cuda"
  int threads = 0;                          // CPU threads (0 = all cores)
};

struct JobConfig {
  model::GptConfig model;
  optim::OptimizerConfig optim;
  optim::ClipConfig clip;
  optim::ScheduleConfig schedule;
  DataConfig data;
  RunConfig train;
  sync::SyncConfig sync;
  std::string source;  // the file it was read from, for messages

  int seq_len() const { return data.seq_len > 0 ? data.seq_len : model.context; }
  // Identity of everything that shapes the trajectory of training (model, optimizer,
  // schedule, data order, seeds, step count); excludes logging, output paths and threads.
  // A checkpoint records it, and --resume refuses a checkpoint whose hash differs.
  std::uint64_t hash() const;
  std::string canonical() const;  // the text that hash() digests
};

// Parses and validates. Throws ConfigError whose message starts with
// "<file>:<line>:<column>: " and names the key, for syntax errors, unknown keys or tables,
// wrong types, and invalid values (non-positive sizes, heads not dividing d_model, ...).
JobConfig load_config(const std::string& path);
JobConfig parse_config(std::string_view text, const std::string& source_name);

// Every key with its default and documentation, as a valid TOML document.
std::string default_config_toml();

}  // namespace desloc::train
