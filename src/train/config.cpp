// TOML -> JobConfig: each table read through its keys' declarations (config_keys.cpp), then the
// rules between keys (config_checks.cpp); errors name file:line:column and the key.
#include "desloc/train/config.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <toml++/toml.h>
#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
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

// The rules between keys, once every key is read: the sites first (they set sync.workers),
// then the features against each other (the table of sync_features.cpp), then each
// subject's own cross-key rules.
void check_rules(const toml::table& root, const std::string& file,
                 const std::map<std::string, Binder>& binders, JobConfig& job) {
  const auto in = [&](const char* section) -> const Binder& { return binders.at(section); };
  if (job.train.out_dir.empty())
    throw ConfigError(fmt::format(
        "{}: train.out_dir = \"\" names no directory; metrics and checkpoints need one (e.g. "
        "\"runs/my_job\")",
        in("train").location_of("out_dir")));
  check_sites(in("job"), root, file, job);
  check_features(job, [&](const std::string& key) {
    const auto dot = key.find('.');
    return binders.at(key.substr(0, dot)).location_of(key.substr(dot + 1).c_str());
  });
  check_sync(in("sync"), job.sync);
  check_fragments(in("sync"), job.sync, job.model);
  check_codecs(in("sync"), job.sync);
  check_switches(in("sync"), job.sync);
  check_regions(in("job"), root, file, job);
  check_liveness(in("job"), job);
  if (job.model.d_model % job.model.heads != 0)
    throw ConfigError(fmt::format("{}: model.heads = {} does not divide model.d_model = {}",
                                  in("model").location_of("heads"), job.model.heads,
                                  job.model.d_model));
  if (job.seq_len() > job.model.context)
    throw ConfigError(fmt::format("{}: data.seq_len = {} exceeds model.context = {}", file,
                                  job.data.seq_len, job.model.context));
}

JobConfig from_table(const toml::table& root, const std::string& file,
                     const std::vector<KeyOverride>& overrides) {
  for (const KeyOverride& o : overrides)
    if (std::none_of(config_sections().begin(), config_sections().end(),
                     [&](const ConfigSection& s) { return o.section == s.name; }))
      throw ConfigError(fmt::format("{}: overrides unknown table '{}'", o.flag, o.section));
  JobConfig job;
  job.source = file;
  std::map<std::string, Binder> binders;  // by table, kept for the rules' locations
  for (const auto& sec : config_sections()) {
    const toml::node* node = root.get(sec.name);
    if (node != nullptr && !node->is_table())
      throw ConfigError(fmt::format("{}: '{}' must be a table ([{}])", where(file, node->source()),
                                    sec.name, sec.name));
    Binder& b = binders
                    .emplace(std::piecewise_construct, std::forward_as_tuple(sec.name),
                             std::forward_as_tuple(file, sec.name,
                                                   node ? node->as_table() : nullptr, nullptr))
                    .first->second;
    sec.bind(b, job);
    b.reject_unknown_keys();
    apply_overrides(sec, overrides, job);
  }
  for (auto&& [k, v] : root) {
    if (!binders.contains(std::string(k.str())))
      throw ConfigError(
          fmt::format("{}: unknown table or key '{}' (valid tables: model, optim, schedule, data, "
                      "train, sync, job, transport)",
                      where(file, k.source()), k.str()));
  }
  check_rules(root, file, binders, job);
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

int JobConfig::site_ranks(int s) const {
  return static_cast<std::size_t>(s) < job.site.size() ? job.site[std::size_t(s)].ranks
                                                       : job.ranks_per_site;
}

int JobConfig::site_batch(int s) const {
  return static_cast<std::size_t>(s) < job.site.size() ? job.site[std::size_t(s)].batch
                                                       : data.batch;
}

bool JobConfig::sites_alike() const {
  return std::all_of(job.site.begin(), job.site.end(), [&](const SiteSpec& sp) {
    return sp.ranks == job.site[0].ranks && sp.batch == job.site[0].batch;
  });
}

bool JobConfig::ranks_alike() const {
  return std::all_of(job.site.begin(), job.site.end(),
                     [&](const SiteSpec& sp) { return sp.ranks == job.site[0].ranks; });
}

int JobConfig::site_index(const std::string& site) const {
  const std::vector<std::string> names = site_names();
  const auto at = std::find(names.begin(), names.end(), site);
  if (at == names.end())
    throw ConfigError(fmt::format("{}: '{}' is not one of the job's sites ({})", source, site,
                                  fmt::join(names, ", ")));
  return static_cast<int>(at - names.begin());
}

int JobConfig::first_rank(int s) const {
  int first = 0;
  for (int q = 0; q < s; ++q) first += site_ranks(q);
  return first;
}

int JobConfig::ranks_of_sites(int sites) const { return first_rank(sites); }

int JobConfig::wan_shards() const {
  int shards = job.ranks_per_site;
  for (const SiteSpec& sp : job.site) shards = std::lcm(shards, sp.ranks);
  return shards;
}

std::vector<int> JobConfig::site_rank_counts() const {
  std::vector<int> ranks;
  for (int s = 0; s < sync.sites; ++s) ranks.push_back(site_ranks(s));
  return ranks;
}

sync::ShardMap JobConfig::wan_map() const { return sync::ShardMap(site_rank_counts()); }

int JobConfig::max_batch() const {
  int most = data.batch;
  for (const SiteSpec& sp : job.site) most = std::max(most, sp.batch);
  return most;
}

std::uint64_t JobConfig::site_tokens_per_step(int s) const {
  return static_cast<std::uint64_t>(site_ranks(s)) * static_cast<std::uint64_t>(site_batch(s)) *
         static_cast<std::uint64_t>(seq_len());
}

std::vector<double> JobConfig::site_weights(std::span<const int> sites) const {
  std::vector<double> w;
  for (const int s : sites)
    w.push_back(sync.weights == sync::SiteWeights::kTokens
                    ? static_cast<double>(site_tokens_per_step(s))
                    : 1.0);
  return w;
}

std::vector<double> JobConfig::site_weights(int count) const {
  std::vector<int> first(static_cast<std::size_t>(count));
  std::iota(first.begin(), first.end(), 0);
  return site_weights(first);
}

std::vector<std::string> JobConfig::site_names() const {
  if (!job.sites.empty()) return job.sites;
  std::vector<std::string> names;
  for (int w = 0; w < sync.sites; ++w) names.push_back(fmt::format("site{}", w));
  return names;
}

}  // namespace desloc::train
