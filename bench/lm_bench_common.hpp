// Shared pieces of the language-model sync benchmarks: the common small GPT job, the Brown
// corpus on demand, and byte formatting.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "desloc/core/error.hpp"
#include "harness.hpp"

#include "desloc/data/prepare.hpp"
#include "desloc/train/config.hpp"

namespace desloc::bench {

// The same small GPT for every method: 2 layers, d_model 64, context 64, byte-level, AdamW
// with global-norm clipping, warmup + cosine. Only [sync] differs between runs.
inline train::JobConfig small_lm_job(const std::string& data_dir, std::int64_t steps,
                                     int eval_every, int threads, int workers) {
  const std::string text = fmt::format(R"([model]
context = 64
layers = 2
heads = 4
d_model = 64
[optim]
name = "adamw"
beta1 = 0.9
beta2 = 0.95
weight_decay = 0.1
clip = "norm"
clip_value = 1.0
[schedule]
kind = "cosine"
lr = 3e-3
warmup = 64
min_lr_ratio = 0.1
[data]
dir = "{}"
batch = 8
seed = 1234
[train]
steps = {}
eval_every = {}
eval_batches = 16
checkpoint_every = 0
log_every = {}
seed = 42
threads = {}
[sync]
workers = {}
)",
                                       data_dir, steps, eval_every,
                                       std::max<std::int64_t>(1, steps / 4), threads, workers);
  return train::parse_config(text, "bench job");
}

inline void ensure_brown(const std::string& dir) {
  if (std::filesystem::exists(std::filesystem::path(dir) / "dataset.toml")) return;
  std::printf("preparing the Brown corpus into %s\n", dir.c_str());
  // Forced: a directory without dataset.toml holds no usable dataset, whatever else is in it.
  data::prepare_corpus({.source = "brown", .out_dir = dir, .force = true});
}

inline std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000.0 && u < 4) {
    b /= 1000.0;
    ++u;
  }
  return fmt::format("{:.3g} {}", b, units[u]);
}

}  // namespace desloc::bench
