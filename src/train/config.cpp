// TOML -> JobConfig: each table read through its keys' declarations (config_keys.cpp), then the
// rules between keys (config_checks.cpp); errors name file:line:column and the key.
#include "desloc/train/config.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <toml++/toml.h>
#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "config_binder.hpp"
#include "config_checks.hpp"
#include "desloc/core/error.hpp"

namespace desloc::train {
namespace {

// Binds each override of `section` through the section's own declarations, so a flag meets
// the checks its key meets in a file; messages name the flag.
void apply_overrides(const ConfigSection& sec, const std::vector<KeyOverride>& overrides,
                     JobConfig& job) {
  for (const KeyOverride& o : overrides) {
    if (o.section != sec.name) continue;
    toml::table table;
    std::visit([&](const auto& v) { table.insert(o.key, v); }, o.value);
    Binder b(o.flag, sec.name, &table, nullptr);
    sec.bind(b, job);
    b.reject_unknown_keys();
  }
}

JobConfig from_table(const toml::table& root, const std::string& file,
                     const std::vector<KeyOverride>& overrides) {
  for (const KeyOverride& o : overrides)
    if (std::none_of(config_sections().begin(), config_sections().end(),
                     [&](const ConfigSection& s) { return o.section == s.name; }))
      throw ConfigError(fmt::format("{}: overrides unknown table '{}'", o.flag, o.section));
  JobConfig job;
  job.source = file;
  std::set<std::string> known;
  std::string heads_at = file;
  for (const auto& sec : config_sections()) {
    known.insert(sec.name);
    const toml::node* node = root.get(sec.name);
    if (node != nullptr && !node->is_table())
      throw ConfigError(fmt::format("{}: '{}' must be a table ([{}])", where(file, node->source()),
                                    sec.name, sec.name));
    Binder b(file, sec.name, node ? node->as_table() : nullptr, nullptr);
    sec.bind(b, job);
    b.reject_unknown_keys();
    apply_overrides(sec, overrides, job);
    if (std::string(sec.name) == "model") heads_at = b.location_of("heads");
    if (std::string(sec.name) == "sync") {
      check_sync(b, job.sync);
      check_fragments(b, job.sync, job.model);
      check_codecs(b, job.sync);
      check_switches(b, job.sync);
    }
    if (std::string(sec.name) == "train" && job.train.out_dir.empty())
      throw ConfigError(fmt::format(
          "{}: train.out_dir = \"\" names no directory; metrics and checkpoints need one (e.g. "
          "\"runs/my_job\")",
          b.location_of("out_dir")));
    if (std::string(sec.name) == "job") {
      check_sites(b, root, file, job);
      check_regions(b, root, file, job);
      check_liveness(b, job);
    }
  }
  for (auto&& [k, v] : root) {
    if (!known.contains(std::string(k.str())))
      throw ConfigError(
          fmt::format("{}: unknown table or key '{}' (valid tables: model, optim, schedule, data, "
                      "train, sync, job, transport)",
                      where(file, k.source()), k.str()));
  }
  if (job.model.d_model % job.model.heads != 0)
    throw ConfigError(fmt::format("{}: model.heads = {} does not divide model.d_model = {}",
                                  heads_at, job.model.heads, job.model.d_model));
  if (job.seq_len() > job.model.context)
    throw ConfigError(fmt::format("{}: data.seq_len = {} exceeds model.context = {}", file,
                                  job.data.seq_len, job.model.context));
  job.model.validate();
  job.optim.validate();
  job.clip.validate();
  job.schedule.validate();
  return job;
}

}  // namespace

JobConfig parse_config(std::string_view text, const std::string& source_name,
                       const std::vector<KeyOverride>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    throw ConfigError(
        fmt::format("{}: TOML syntax error: {}", where(source_name, e.source()), e.description()));
  }
  return from_table(root, source_name, overrides);
}

JobConfig load_config(const std::string& path, const std::vector<KeyOverride>& overrides) {
  // A directory reads as an empty document, which would silently mean "all defaults".
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    std::vector<std::string> tomls;
    for (std::filesystem::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().extension() == ".toml") tomls.push_back(it->path().string());
    std::sort(tomls.begin(), tomls.end());
    throw ConfigError(fmt::format("{}: is a directory, not a config file; pass a TOML file{}", path,
                                  tomls.empty()
                                      ? std::string(" (e.g. configs/quickstart.toml)")
                                      : fmt::format(" such as {}", fmt::join(tomls, " or "))));
  }
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& r = e.source();
    if (r.begin.line == 0)
      throw ConfigError(fmt::format("{}: cannot read config: {}", path, e.description()));
    throw ConfigError(fmt::format("{}: TOML syntax error: {}", where(path, r), e.description()));
  }
  return from_table(root, path, overrides);
}

std::string default_config_toml() {
  std::ostringstream out;
  JobConfig job;
  out << "# desloc job configuration: every key, its default and its meaning.\n";
  for (const auto& sec : config_sections()) {
    out << "\n[" << sec.name << "]\n";
    Binder b("", sec.name, nullptr, &out);
    sec.bind(b, job);
  }
  return out.str();
}

std::vector<std::string> JobConfig::site_names() const {
  if (!job.sites.empty()) return job.sites;
  std::vector<std::string> names;
  for (int w = 0; w < sync.workers; ++w) names.push_back(fmt::format("site{}", w));
  return names;
}

}  // namespace desloc::train
