// A trained model as `desloc export` and `desloc sample` use it: the parameters of one
// checkpoint (or of one checkpoint per site of a networked job), averaged over the sites by
// default, with the model's sizes and the tokenizer it was trained with.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "desloc/data/tokenizer.hpp"
#include "desloc/model/gpt_config.hpp"

namespace desloc::train {

struct TrainedModelOptions {
  // One checkpoint file, or one per site of a networked job (the ranks of a site hold the same
  // x, so one rank's file per site is enough): same step, same config hash. A directory is a
  // run's train.out_dir (or its checkpoints/ folder): its newest step that every site holds,
  // from the run's own checkpoints and each ranks/<site>-0/ of a networked job.
  std::vector<std::string> checkpoints;
  int site = -1;  // -1: the mean x of every site; otherwise that site's own x (0-based)
  // The tokenizer model to use instead of the path the checkpoint recorded (it must still hash
  // to what was recorded).
  std::string tokenizer_file;
  // For a checkpoint written before version 5 (no model description): the job config that
  // wrote it; its hash, with its dataset's tokenizer, must match the checkpoint's.
  std::string config;
};

struct TrainedModel {
  model::GptConfig model;
  std::vector<float> params;  // ParamLayout(model) order
  std::int64_t step = 0;
  int sites = 0;                         // the x's averaged (1 for --site)
  std::vector<std::string> checkpoints;  // the files read (directories resolved)
  std::string tokenizer_kind;
  std::string tokenizer_file;  // the model file used (sentencepiece), else empty
  std::unique_ptr<data::Tokenizer> tokenizer;
};

// Throws DataError naming the file: missing, corrupt or truncated checkpoints (every check of
// load_checkpoint), checkpoints of different steps or jobs, a site out of range, a missing or
// different tokenizer model; ConfigError for a bad config.
TrainedModel load_trained_model(const TrainedModelOptions& opts);

// The checkpoint files `checkpoints` names: files as they are, each directory replaced by the
// newest step every site of that run holds intact (DataError naming the directory when there
// is none).
std::vector<std::string> resolve_checkpoints(const std::vector<std::string>& checkpoints);

}  // namespace desloc::train
