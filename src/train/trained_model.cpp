// Loading a trained model from checkpoints (trained_model.hpp).
#include "desloc/train/trained_model.hpp"

#include <fmt/format.h>

#include "desloc/core/error.hpp"
#include "desloc/data/prepare.hpp"
#include "desloc/model/param_layout.hpp"
#include "desloc/train/checkpoint.hpp"
#include "desloc/train/config.hpp"

namespace desloc::train {
namespace {

// The description a checkpoint before version 5 lacks, from the config that wrote it.
CheckpointModel describe_from_config(const std::string& config, const Checkpoint& ck,
                                     const std::string& path) {
  const JobConfig cfg = load_config(config);
  const data::DatasetInfo dataset = data::load_dataset(cfg.data.dir);
  if (cfg.hash(dataset.tokenizer_identity()) != ck.config_hash)
    throw ConfigError(fmt::format(
        "'{}' was written by a job with config hash {:016x}, but {} (with the data in '{}') "
        "hashes to {:016x}; pass the config that trained it",
        path, ck.config_hash, config, cfg.data.dir, cfg.hash(dataset.tokenizer_identity())));
  return {cfg.model, dataset.tokenizer, dataset.tokenizer_hash, dataset.tokenizer_file};
}

}  // namespace

TrainedModel load_trained_model(const TrainedModelOptions& opts) {
  if (opts.checkpoints.empty()) throw ConfigError("no checkpoint given; pass --checkpoint FILE");
  std::vector<Checkpoint> cks;
  for (const std::string& path : opts.checkpoints) cks.push_back(load_checkpoint(path));
  const Checkpoint& first = cks[0];
  const std::string& first_path = opts.checkpoints[0];
  for (std::size_t i = 1; i < cks.size(); ++i) {
    if (cks[i].config_hash != first.config_hash || cks[i].step != first.step)
      throw DataError(fmt::format(
          "'{}' (step {}, config hash {:016x}) and '{}' (step {}, config hash {:016x}) are not "
          "the sites of one job at one step; pass checkpoints of the same step of one job",
          first_path, first.step, first.config_hash, opts.checkpoints[i], cks[i].step,
          cks[i].config_hash));
  }
  CheckpointModel desc;
  if (first.model) {
    desc = *first.model;
  } else if (!opts.config.empty()) {
    desc = describe_from_config(opts.config, first, first_path);
  } else {
    throw DataError(fmt::format(
        "'{}' was written before checkpoints described their model (version 5); pass --config "
        "with the job config that trained it",
        first_path));
  }

  TrainedModel m;
  m.model = desc.model;
  m.step = first.step;
  const std::size_t n = model::ParamLayout(m.model).total();
  std::vector<const std::vector<float>*> xs;
  for (std::size_t i = 0; i < cks.size(); ++i)
    for (const WorkerState& w : cks[i].workers) {
      if (w.params.size() != n)
        throw DataError(
            fmt::format("'{}' holds {} parameters; its model ({} layers, d_model {}, "
                        "vocab {}) has {}",
                        opts.checkpoints[i], w.params.size(), m.model.layers, m.model.d_model,
                        m.model.vocab, n));
      xs.push_back(&w.params);
    }
  if (opts.site >= static_cast<int>(xs.size()))
    throw ConfigError(fmt::format("--site {}: the checkpoint{} hold{} {} site{} (0 to {})",
                                  opts.site, cks.size() > 1 ? "s" : "", cks.size() > 1 ? "" : "s",
                                  xs.size(), xs.size() == 1 ? "" : "s", xs.size() - 1));
  if (opts.site >= 0) {
    m.params = *xs[static_cast<std::size_t>(opts.site)];
    m.sites = 1;
  } else {
    // The mean in double, in site order: the model the sites would agree on at a sync.
    std::vector<double> sum(n, 0.0);
    for (const auto* x : xs)
      for (std::size_t k = 0; k < n; ++k) sum[k] += (*x)[k];
    m.params.resize(n);
    for (std::size_t k = 0; k < n; ++k)
      m.params[k] = static_cast<float>(sum[k] / static_cast<double>(xs.size()));
    m.sites = static_cast<int>(xs.size());
  }

  m.tokenizer_kind = desc.tokenizer;
  if (desc.tokenizer != "byte") {
    m.tokenizer_file = opts.tokenizer_file.empty() ? desc.tokenizer_file : opts.tokenizer_file;
    if (m.tokenizer_file.empty())
      throw DataError(fmt::format(
          "'{}' does not record where its {} model is (the path was too long to keep); pass "
          "--tokenizer FILE",
          first_path, desc.tokenizer));
  }
  try {
    m.tokenizer = data::load_tokenizer(desc.tokenizer, m.tokenizer_file, desc.tokenizer_hash);
  } catch (const DataError& e) {
    throw DataError(fmt::format("checkpoint '{}': {}", first_path, e.message()));
  }
  if (m.tokenizer->vocab() > m.model.vocab)
    throw DataError(
        fmt::format("'{}': the tokenizer has {} tokens but the model only {} (model.vocab)",
                    first_path, m.tokenizer->vocab(), m.model.vocab));
  return m;
}

}  // namespace desloc::train
