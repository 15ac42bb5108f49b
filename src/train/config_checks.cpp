// The rules between keys: each check runs after its section was read, and names the key a
// user must change (file:line:column) and why.
#include "config_checks.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "desloc/core/error.hpp"
#include "desloc/core/sync_schedule.hpp"
#include "desloc/model/param_layout.hpp"
#include "desloc/sync/compression.hpp"
#include "desloc/transport/ring_order.hpp"
#include "desloc/transport/site_name.hpp"

namespace desloc::train {

// sync.overlap = "delayed": each tau at least 1 and below its state's period (one average of
// a state in flight at a time), and nothing that acts on an average at once.
namespace {

void check_delays(const Binder& b, const sync::SyncConfig& s) {
  for (const char* key : {"delay", "delay_u", "delay_v"})
    if (b.has(key) && !s.delays())
      throw ConfigError(fmt::format(
          "{}: sync.{} is set, but overlap = \"{}\" has no delay; use overlap = \"delayed\" "
          "or remove it",
          b.location_of(key), key, to_string(s.overlap)));
  if (!s.delays()) return;
  if (s.delay < 1)
    throw ConfigError(fmt::format("{}: sync.overlap = \"{}\" needs sync.delay >= 1 (got {})",
                                  b.location_of(b.has("delay") ? "delay" : "overlap"),
                                  to_string(s.overlap), s.delay));
  const bool desloc = s.method == SyncMethod::kDesloc;
  for (const char* key : {"delay_u", "delay_v"})
    if (b.has(key) && !desloc)
      throw ConfigError(fmt::format(
          "{}: sync.{} is set, but method = \"{}\" averages u and v with x; use sync.delay",
          b.location_of(key), key, to_string(s.method)));
  struct Rule {
    const char* key;
    std::int64_t tau;
    std::int64_t period;
    const char* period_key;
    bool averaged;
  };
  const bool moments = desloc || s.method == SyncMethod::kLocalAdam;
  for (const Rule& r : {Rule{"delay", s.delay, s.kx, "kx", true},
                        Rule{"delay_u", s.effective_delay_u(), desloc ? s.effective_ku() : s.kx,
                             desloc ? "ku" : "kx", moments},
                        Rule{"delay_v", s.effective_delay_v(), desloc ? s.effective_kv() : s.kx,
                             desloc ? "kv" : "kx", moments}}) {
    if (!r.averaged || r.tau < r.period) continue;
    const char* key = b.has(r.key) ? r.key : "delay";
    throw ConfigError(fmt::format(
        "{}: sync.{} = {} must be smaller than the period {} = {} of the state it delays (a "
        "state's next average starts before its last one is folded in)",
        b.location_of(key), key, r.tau, r.period_key, r.period));
  }
}

}  // namespace

// sync.fragments: a state average to split, at most one fragment of a state due per step, no
// step of the average that acts on the whole buffer at once, and no more fragments than
// parameters.
void check_fragments(const Binder& b, const sync::SyncConfig& s, const model::GptConfig& model) {
  const bool desloc = s.method == SyncMethod::kDesloc;
  for (const char* key : {"fragments_u", "fragments_v"})
    if (b.has(key) && !desloc)
      throw ConfigError(fmt::format(
          "{}: sync.{} is set, but method = \"{}\" averages u and v with x; use sync.fragments",
          b.location_of(key), key, to_string(s.method)));
  const SyncSchedule sched = s.schedule();
  const int most = std::max({s.fragments, sched.parts_u(), sched.parts_v()});
  if (most <= 1) return;
  const char* key = s.fragments == most       ? "fragments"
                    : sched.parts_u() == most ? "fragments_u"
                                              : "fragments_v";
  const std::string at = b.location_of(b.has(key) ? key : "fragments");
  struct Rule {
    const char* key;
    int parts;
    const char* period_key;
    std::int64_t period;
  };
  for (const Rule& r :
       {Rule{"fragments", s.fragments, "kx", s.kx},
        Rule{desloc && s.fragments_u > 0 ? "fragments_u" : "fragments", sched.parts_u(),
             desloc ? "ku" : "kx", desloc ? s.effective_ku() : s.kx},
        Rule{desloc && s.fragments_v > 0 ? "fragments_v" : "fragments", sched.parts_v(),
             desloc ? "kv" : "kx", desloc ? s.effective_kv() : s.kx}})
    if (r.parts > r.period)
      throw ConfigError(fmt::format(
          "{}: sync.{} = {} exceeds the period {} = {}: the fragments are staggered one step "
          "apart at most, so at most {} fit",
          b.location_of(b.has(r.key) ? r.key : "fragments"), r.key, r.parts, r.period_key, r.period,
          r.period));
  const double params = model::parameter_count(model);
  if (static_cast<double>(most) > params)
    throw ConfigError(fmt::format("{}: sync.{} = {} exceeds the model's {} parameters", at, key,
                                  most, static_cast<long long>(params)));
}

// sync.codec_*: only on a state the method averages across sites, with error feedback only
// behind a codec, and not where something else owns the average's reference.
void check_codecs(const Binder& b, const sync::SyncConfig& s) {
  const bool moments = s.method == SyncMethod::kDesloc || s.method == SyncMethod::kLocalAdam;
  const sync::CompressionConfig c = s.compression();
  struct Rule {
    const char* key;
    bool compressed;
    bool averaged;
  };
  for (const Rule& r : {Rule{"codec_x", c.compresses(optim::StateKind::kX), s.averages_params()},
                        Rule{"codec_u", c.compresses(optim::StateKind::kU), moments},
                        Rule{"codec_v", c.compresses(optim::StateKind::kV), moments}})
    if (r.compressed && !r.averaged)
      throw ConfigError(fmt::format(
          "{}: sync.{} compresses a state that method = \"{}\" never averages across sites; "
          "remove it{}",
          b.location_of(r.key), r.key, to_string(s.method),
          s.averages_params() ? " (only desloc and local_adam average u and v)" : ""));
  if (b.has("codec_block") && s.codec_block % 4 != 0)
    throw ConfigError(fmt::format(
        "{}: sync.codec_block = {} must be a multiple of 4 (the packed integers of a block "
        "start on a byte boundary)",
        b.location_of("codec_block"), s.codec_block));
  if (s.error_feedback && !c.any())
    throw ConfigError(fmt::format(
        "{}: sync.error_feedback = true without a codec: an fp32 average drops nothing to feed "
        "back; set codec_x, codec_u or codec_v",
        b.location_of("error_feedback")));
}

// Cross-key rules of [sync]; each error points at the offending key.
void check_sync(const Binder& b, const sync::SyncConfig& s) {
  const bool desloc = s.method == SyncMethod::kDesloc;
  for (const char* key : {"ku", "kv", "phase_u", "phase_v"}) {
    if (b.has(key) && !desloc)
      throw ConfigError(fmt::format(
          "{}: sync.{} is set, but method = \"{}\" has no separate {} average; remove it "
          "or use method = \"desloc\"",
          b.location_of(key), key, to_string(s.method), key[0] == 'k' ? key + 1 : key + 6));
  }
  for (const char* key : {"ku", "kv"}) {
    if (b.has(key) && (key[1] == 'u' ? s.ku : s.kv) <= 0)
      throw ConfigError(
          fmt::format("{}: sync.{} must be positive (omit it for the default {} * kx)",
                      b.location_of(key), key, key[1] == 'u' ? 3 : 6));
  }
  auto phase = [&](const char* key, std::int64_t value, std::int64_t period, const char* pkey) {
    if (value >= period)
      throw ConfigError(fmt::format("{}: sync.{} = {} must be smaller than its period {} = {}",
                                    b.location_of(key), key, value, pkey, period));
  };
  phase("phase_x", s.phase_x, s.kx, "kx");
  phase("phase_u", s.phase_u, s.effective_ku(), "ku");
  phase("phase_v", s.phase_v, s.effective_kv(), "kv");
  check_delays(b, s);
  if (s.join_step > 0 && s.join_sites <= s.sites)
    throw ConfigError(fmt::format(
        "{}: sync.join_workers = {} must exceed sync.workers = {} when join_step is set",
        b.location_of("join_workers"), s.join_sites, s.sites));
}

// job.regions and sync.region_*: every site of the job in exactly one region, periods that
// divide the job-wide ones, and only the modes the two levels are built for so far.
void check_regions(const Binder& b, const toml::table& root, const std::string& file,
                   const JobConfig& job) {
  const sync::SyncConfig& s = job.sync;
  const auto sync_at = [&](const char* key) {
    const auto* n = root.at_path(std::string("sync.") + key).node();
    return n != nullptr ? where(file, n->source()) : file;
  };
  const auto& regions = job.job.regions;
  if (regions.empty()) {
    for (const char* key : {"region_kx", "region_ku", "region_kv"})
      if (root.at_path(std::string("sync.") + key).node() != nullptr)
        throw ConfigError(
            fmt::format("{}: sync.{} is set, but job.regions is not: name the "
                        "regions, or remove it",
                        sync_at(key), key));
    return;
  }
  const std::string at = b.location_of("regions");
  const std::vector<std::string> sites = job.site_names();
  std::map<std::string, std::size_t> region_of;
  for (std::size_t g = 0; g < regions.size(); ++g) {
    if (regions[g].empty())
      throw ConfigError(fmt::format("{}: job.regions: region {} is empty", at, g + 1));
    for (const std::string& site : regions[g]) {
      if (std::find(sites.begin(), sites.end(), site) == sites.end())
        throw ConfigError(
            fmt::format("{}: job.regions names '{}', which is not a site of the job "
                        "(job.sites: {})",
                        at, site, fmt::join(sites, ", ")));
      if (const auto [it, fresh] = region_of.emplace(site, g); !fresh)
        throw ConfigError(fmt::format("{}: job.regions puts '{}' in region {} and in region {}", at,
                                      site, it->second + 1, g + 1));
    }
  }
  for (const std::string& site : sites)
    if (!region_of.contains(site))
      throw ConfigError(fmt::format("{}: job.regions leaves site '{}' in no region", at, site));
  if (!s.regional())
    throw ConfigError(
        fmt::format("{}: job.regions is set, but sync.region_kx is not: give the "
                    "period of the averages inside a region",
                    at));
  const bool desloc = s.method == SyncMethod::kDesloc;
  for (const char* key : {"region_ku", "region_kv"})
    if (root.at_path(std::string("sync.") + key).node() != nullptr && !desloc)
      throw ConfigError(
          fmt::format("{}: sync.{} is set, but method = \"{}\" averages u and v "
                      "with x; use sync.region_kx",
                      sync_at(key), key, to_string(s.method)));
  struct Level {
    const char* key;
    std::int64_t region, global, phase;
    const char* global_key;
    const char* phase_key;
  };
  for (const Level& l :
       {Level{"region_kx", s.region_kx, s.kx, s.phase_x, "kx", "phase_x"},
        Level{"region_ku", s.effective_region_ku(), s.effective_ku(), s.phase_u, "ku", "phase_u"},
        Level{"region_kv", s.effective_region_kv(), s.effective_kv(), s.phase_v, "kv",
              "phase_v"}}) {
    if (!desloc && l.key != std::string("region_kx")) continue;
    if (l.region >= l.global || l.global % l.region != 0)
      throw ConfigError(fmt::format(
          "{}: sync.{} = {} must divide sync.{} = {} and be shorter: a job-wide average must "
          "fall on a step the regions average too",
          sync_at(l.key), l.key, l.region, l.global_key, l.global));
    if (l.phase >= l.region)
      throw ConfigError(fmt::format("{}: sync.{} = {} must be smaller than sync.{} = {}",
                                    sync_at(l.phase_key), l.phase_key, l.phase, l.key, l.region));
  }
}

// [[job.site]]: the shorthand's keys left out (the tables say what they say), and the
// shorthand's fields filled from the tables: job.sites their names, ranks_per_site the most
// ranks, data.batch the smallest batch (the validation batch, which every site's model holds).
namespace {
void take_site_specs(const Binder& b, const toml::table& root, const std::string& file,
                     JobConfig& job) {
  for (const char* key : {"job.sites", "job.ranks_per_site", "data.batch"})
    if (const toml::node* n = root.at_path(key).node())
      throw ConfigError(fmt::format(
          "{}: {} is the shorthand for sites alike, and [[job.site]] tables (at {}) say each "
          "site's own; give one form: drop {}, or the tables",
          where(file, n->source()), key, b.location_of("site"), key));
  if (job.sync.join_step > 0)
    throw ConfigError(fmt::format(
        "{}: sync.join_step: an in-process join grows the job by sites of the shorthand's shape; "
        "with [[job.site]] tables list every site instead",
        file));
  job.job.sites.clear();
  job.job.ranks_per_site = 1;
  job.data.batch = job.job.site.front().batch;
  for (const SiteSpec& sp : job.job.site) {
    job.job.sites.push_back(sp.name);
    job.job.ranks_per_site = std::max(job.job.ranks_per_site, sp.ranks);
    job.data.batch = std::min(job.data.batch, sp.batch);
  }
  if (job.wan_shards() > 1024)
    throw ConfigError(fmt::format(
        "{}: [[job.site]]: the sites' rank counts have {} as their least common multiple, the "
        "number of wide-area shards each state is cut into; at most 1024: choose rank counts "
        "that share more factors",
        b.location_of("site"), job.wan_shards()));
}
}  // namespace

// job.sites: valid names, each once, as many as sync.workers says if it says; sync.workers then
// follows them.
void check_sites(const Binder& b, const toml::table& root, const std::string& file,
                 JobConfig& job) {
  if (!job.job.site.empty()) take_site_specs(b, root, file, job);
  if (job.job.sites.empty()) return;
  std::set<std::string> seen;
  for (const auto& site : job.job.sites) {
    if (!transport::valid_site_name(site))
      throw ConfigError(fmt::format("{}: job.sites: '{}' is not a valid site name ({})",
                                    b.location_of("sites"), site, transport::kSiteNameRule));
    if (!seen.insert(site).second)
      throw ConfigError(
          fmt::format("{}: job.sites names '{}' twice", b.location_of("sites"), site));
  }
  const auto* sites = root.at_path("sync.workers").node();
  const int m = static_cast<int>(job.job.sites.size());
  if (sites != nullptr && job.sync.sites != m)
    throw ConfigError(fmt::format(
        "{}: sync.workers = {} but job.sites names {} site(s); a site is a worker, so drop "
        "sync.workers or make them agree",
        where(file, sites->source()), job.sync.sites, m));
  job.sync.sites = m;
  if (job.sync.join_step > 0 && job.sync.join_sites <= m)
    throw ConfigError(fmt::format("{}: sync.join_workers = {} must exceed the {} sites", file,
                                  job.sync.join_sites, m));
}

// The failure detector's settings against each other and against the job's sites.
void check_liveness(const Binder& b, const JobConfig& job) {
  const int sites = job.sync.sites;
  if (job.job.min_sites > sites)
    throw ConfigError(fmt::format(
        "{}: job.min_sites = {} but the job has {} site(s): it could never run; at most {}",
        b.location_of("min_sites"), job.job.min_sites, sites, sites));
  // One heartbeat late (a busy host, a GC pause elsewhere) must not be silence.
  if (job.job.heartbeat_timeout_ms < 2 * job.job.heartbeat_ms)
    throw ConfigError(fmt::format(
        "{}: job.heartbeat_timeout_ms = {} is less than two heartbeats (job.heartbeat_ms = {}): "
        "a live rank would be declared silent after one late heartbeat; make it at least {}",
        b.location_of(b.has("heartbeat_timeout_ms") ? "heartbeat_timeout_ms" : "heartbeat_ms"),
        job.job.heartbeat_timeout_ms, job.job.heartbeat_ms, 2 * job.job.heartbeat_ms));
  // Below 1.5 the longest wait would barely stand out of the others (below 1 every failure
  // would name one).
  if (job.job.straggler_ratio > 0.0f && job.job.straggler_ratio < 1.5f)
    throw ConfigError(fmt::format("{}: job.straggler_ratio = {} must be 0 (off) or >= 1.5",
                                  b.location_of("straggler_ratio"), job.job.straggler_ratio));
}

// sync.switches and sync.replan: switches at parameter averages, in order, with periods the
// mode can run; re-planning only where there is a parameter average to switch at.
void check_switches(const Binder& b, const sync::SyncConfig& s) {
  const bool desloc = s.method == SyncMethod::kDesloc;
  if (s.switches.empty()) return;
  const std::string at = b.location_of("switches");
  if (s.switches.size() > sync::kMaxPeriodSwitches)
    throw ConfigError(fmt::format("{}: sync.switches has {} entries, at most {}", at,
                                  s.switches.size(), sync::kMaxPeriodSwitches));
  sync::SyncConfig base = s;
  base.switches.clear();
  sync::SyncPolicy policy(base);
  const std::array<std::int64_t, 3> tau = s.effective_delays();
  for (std::size_t i = 0; i < s.switches.size(); ++i) {
    const sync::PeriodSwitch& sw = s.switches[i];
    if (!desloc && (sw.ku != 0 || sw.kv != 0))
      throw ConfigError(
          fmt::format("{}: sync.switches[{}] sets ku or kv, but method = \"{}\" "
                      "averages u and v with x",
                      at, i + 1, to_string(s.method)));
    try {
      policy.add_switch(sw);
    } catch (const Error& e) {
      throw ConfigError(fmt::format("{}: sync.switches[{}]: {}", at, i + 1, e.message()));
    }
    const SyncSchedule& after = policy.schedule_at(sw.after + 1);
    for (const auto& [name, period, delay, region] :
         {std::tuple{"kx", after.kx, tau[0], s.region_kx},
          std::tuple{"ku", after.ku, tau[1], s.regional() ? s.effective_region_ku() : 0},
          std::tuple{"kv", after.kv, tau[2], s.regional() ? s.effective_region_kv() : 0}}) {
      if (delay >= period)
        throw ConfigError(
            fmt::format("{}: sync.switches[{}] makes {} = {}, not longer than "
                        "its delay {}",
                        at, i + 1, name, period, delay));
      // With regions, as the config's own periods: each region period divides its job-wide one.
      if (region > 0 && (period <= region || period % region != 0))
        throw ConfigError(
            fmt::format("{}: sync.switches[{}] makes {} = {}, which sync.region_{} = {} must "
                        "divide and be shorter than: a job-wide average must fall on a step the "
                        "regions average too",
                        at, i + 1, name, period, name, region));
    }
  }
}

}  // namespace desloc::train
