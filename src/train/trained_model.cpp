// Loading a trained model from checkpoints (trained_model.hpp).
#include "desloc/train/trained_model.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>

#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"
#include "desloc/data/prepare.hpp"
#include "desloc/model/param_layout.hpp"
#include "desloc/train/checkpoint.hpp"
#include "desloc/train/config.hpp"
#include "desloc/train/trainer.hpp"

namespace desloc::train {
namespace {

// The description a checkpoint before version 5 lacks, from the config that wrote it.
CheckpointModel describe_from_config(const std::string& config, const Checkpoint& ck,
                                     const std::string& path) {
  const JobConfig cfg = load_config(config);
  const data::DatasetInfo dataset = dataset_of(cfg);
  if (cfg.hash(dataset.tokenizer_identity()) != ck.config_hash)
    throw ConfigError(fmt::format(
        "'{}' was written by a job with config hash {:016x}, but {} (with the data in '{}') "
        "hashes to {:016x}; pass the config that trained it",
        path, ck.config_hash, config, cfg.data.dir, cfg.hash(dataset.tokenizer_identity())));
  return {cfg.model, dataset.tokenizer, dataset.tokenizer_hash, dataset.tokenizer_file};
}

namespace fs = std::filesystem;

// A run directory's sites: its own checkpoints (in-process sites, or the leader's site of a
// networked job) and ranks/<site>-0/checkpoints of every other site (the other ranks of a
// site hold the same x).
std::vector<std::filesystem::path> site_checkpoint_dirs(const std::filesystem::path& given) {
  fs::path run = given.lexically_normal();
  if (run.filename().empty()) run = run.parent_path();  // "run/" or "run/checkpoints/"
  if (run.filename() == "checkpoints") run = run.parent_path();
  std::vector<fs::path> dirs{run / "checkpoints"};
  std::error_code ec;
  std::vector<fs::path> others;
  for (fs::directory_iterator it(run / "ranks", ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().ends_with("-0"))
      others.push_back(it->path() / "checkpoints");
  std::sort(others.begin(), others.end());
  dirs.insert(dirs.end(), others.begin(), others.end());
  return dirs;
}

// The run's model: the newest step every site holds intact, unless some sites stopped writing
// (no file at all at two or more steps the others hold after the last step all share, as the
// resume agreement judges it, having written some before): a site dropped from the run. Then the
// newest step of the sites that ran on, which are the run's result; the dropped ones are named on
// stderr.
std::vector<std::string> run_checkpoints(const fs::path& given) {
  const std::vector<fs::path> dirs = site_checkpoint_dirs(given);
  std::vector<std::set<std::int64_t>> valid(dirs.size()), any_file(dirs.size());
  std::set<std::int64_t> all_steps;
  for (std::size_t i = 0; i < dirs.size(); ++i) {
    const CheckpointScan scan = scan_checkpoints(dirs[i].string());
    for (const CheckpointInfo& c : scan.valid) valid[i].insert(c.step);
    for (const RejectedCheckpoint& r : scan.rejected) any_file[i].insert(r.step);
    any_file[i].insert(valid[i].begin(), valid[i].end());
    all_steps.insert(valid[i].begin(), valid[i].end());
  }
  std::set<std::int64_t> common = valid[0];
  for (std::size_t i = 1; i < dirs.size(); ++i)
    std::erase_if(common, [&](std::int64_t step) { return !valid[i].contains(step); });
  std::vector<std::string> names;
  for (const fs::path& d : dirs) names.push_back(d.string());
  if (all_steps.empty())
    throw DataError(fmt::format("'{}' holds no intact checkpoint (looked in {})", given.string(),
                                fmt::join(names, ", ")));
  const std::int64_t after = common.empty() ? -1 : *common.rbegin();
  std::vector<std::size_t> ran_on, dropped;
  for (std::size_t i = 0; i < dirs.size(); ++i) {
    const auto missing =
        std::count_if(all_steps.upper_bound(after), all_steps.end(),
                      [&](std::int64_t step) { return !any_file[i].contains(step); });
    // A site with no checkpoint at all never showed it ran: its files may be lost instead.
    (missing >= 2 && !valid[i].empty() ? dropped : ran_on).push_back(i);
  }
  std::optional<std::int64_t> step;
  if (dropped.empty() || ran_on.empty()) {
    if (common.empty())
      throw DataError(fmt::format(
          "'{}' holds no checkpoint step that every site of the run has intact (looked in {}); "
          "pass --checkpoint with the files",
          given.string(), fmt::join(names, ", ")));
    ran_on.clear();
    for (std::size_t i = 0; i < dirs.size(); ++i) ran_on.push_back(i);
    step = after;
  } else {
    std::set<std::int64_t> shared = valid[ran_on[0]];
    for (std::size_t i : ran_on)
      std::erase_if(shared, [&](std::int64_t s) { return !valid[i].contains(s); });
    if (shared.empty())
      throw DataError(fmt::format(
          "'{}': the sites that ran on share no intact checkpoint step (looked in {}); pass "
          "--checkpoint with the files",
          given.string(), fmt::join(names, ", ")));
    step = *shared.rbegin();
    for (std::size_t i : dropped)
      log::warn(
          "'{}' holds nothing after step {} while the others went on: its site was "
          "dropped from the run, and the model is the mean of the sites that ran on",
          names[i], valid[i].empty() ? std::int64_t{0} : *valid[i].rbegin());
  }
  std::vector<std::string> files;
  for (std::size_t i : ran_on) files.push_back(checkpoint_path(names[i], *step));
  return files;
}

}  // namespace

std::vector<std::string> resolve_checkpoints(const std::vector<std::string>& checkpoints) {
  std::vector<std::string> files;
  for (const std::string& c : checkpoints) {
    std::error_code ec;
    if (fs::is_directory(c, ec)) {
      for (std::string& f : run_checkpoints(c)) files.push_back(std::move(f));
    } else {
      files.push_back(c);
    }
  }
  return files;
}

TrainedModel load_trained_model(const TrainedModelOptions& given) {
  if (given.checkpoints.empty()) throw ConfigError("no checkpoint given; pass --checkpoint FILE");
  TrainedModelOptions opts = given;
  opts.checkpoints = resolve_checkpoints(given.checkpoints);
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
  m.checkpoints = opts.checkpoints;
  m.model = desc.model;
  m.step = first.step;
  const std::size_t n = model::ParamLayout(m.model).total();
  std::vector<const std::vector<float>*> xs;
  for (std::size_t i = 0; i < cks.size(); ++i)
    for (const SiteState& w : cks[i].sites) {
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
