// The rules between a config's keys (config_checks.cpp), run by config.cpp as it reads.
// Each throws ConfigError naming file:line:column, the key to change and why.
#pragma once

#include <toml++/toml.h>

#include <functional>
#include <string>

#include "config_binder.hpp"
#include "desloc/model/gpt_config.hpp"
#include "desloc/sync/sync_policy.hpp"
#include "desloc/train/config.hpp"

namespace desloc::train {

// "file:line:column" of a key ("sync.overlap") as the config gave it, or the file's name.
using KeyLocator = std::function<std::string(const std::string& key)>;

// The sync features against each other (sync_features.cpp): ConfigError at the first pair the
// config turns on that the table refuses, naming both settings and the reason.
void check_features(const JobConfig& job, const KeyLocator& where);

// [sync] on its own: periods, phases, the outer step, overlap and delays.
void check_sync(const Binder& b, const sync::SyncConfig& s);
// sync.fragments*: what can be split, and into no more pieces than the model has parameters.
void check_fragments(const Binder& b, const sync::SyncConfig& s, const model::GptConfig& model);
// sync.codec_* and error_feedback.
void check_codecs(const Binder& b, const sync::SyncConfig& s);
// sync.switches and sync.replan.
void check_switches(const Binder& b, const sync::SyncConfig& s);
// job.sites (and sync.workers, which it sets from them).
void check_sites(const Binder& b, const toml::table& root, const std::string& file, JobConfig& job);
// job.regions with sync.region_*.
void check_regions(const Binder& b, const toml::table& root, const std::string& file,
                   const JobConfig& job);
// job.min_sites, the heartbeat settings and the straggler rule.
void check_liveness(const Binder& b, const JobConfig& job);

}  // namespace desloc::train
