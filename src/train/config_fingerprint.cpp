// A job's identity, derived from the key declarations: each key's value (normalized) and its
// scope, digested into hash() (the trajectory: checkpoints) and agreement_hash() (the ranks).
#include <fmt/format.h>

#include <string>
#include <vector>

#include "config_binder.hpp"
#include "desloc/core/hash.hpp"
#include "desloc/core/sync_schedule.hpp"
#include "desloc/train/config.hpp"
#include "desloc/transport/ring_order.hpp"

namespace desloc::train {
namespace {

// The same job written another way reads the same: each key the job's modes leave unused takes
// its default, and each key whose 0 stands for another value takes that value.
JobConfig normalized(const JobConfig& in) {
  JobConfig c = in;
  const JobConfig defaults;
  c.data.seq_len = in.seq_len();
  c.job.sites = in.site_names();
  // [[job.site]] tables alike are the shorthand (which check_sites filled in), and sites alike
  // weigh alike whatever sync.weights says.
  if (in.sites_alike()) {
    c.job.site.clear();
    c.sync.weights = defaults.sync.weights;
  }
  sync::SyncConfig& s = c.sync;
  const sync::SyncConfig& d = defaults.sync;
  const bool desloc = s.method == SyncMethod::kDesloc;
  const SyncSchedule schedule = in.sync.schedule();
  if (desloc) {
    s.ku = in.sync.effective_ku();
    s.kv = in.sync.effective_kv();
    s.fragments_u = schedule.parts_u();
    s.fragments_v = schedule.parts_v();
  }
  if (s.outer == sync::OuterStep::kNone) {
    s.outer_lr = d.outer_lr;
    s.outer_momentum = d.outer_momentum;
  }
  if (s.delays()) {
    s.delay_u = in.sync.effective_delay_u();
    s.delay_v = in.sync.effective_delay_v();
  } else {
    // A checkpoint folds the averages in flight early: with delays it moves the trajectory.
    c.train.checkpoint_every = defaults.train.checkpoint_every;
  }
  if (!s.compression().any()) {
    s.codec_block = d.codec_block;
    s.error_feedback = d.error_feedback;
  }
  if (in.job.regions.empty()) {
    s.region_kx = s.region_ku = s.region_kv = 0;
  } else {
    s.region_ku = in.sync.effective_region_ku();
    s.region_kv = in.sync.effective_region_kv();
  }
  if (!s.replan) {
    s.replan_target = d.replan_target;
    s.replan_drift = d.replan_drift;
    s.replan_syncs = d.replan_syncs;
  }
  // Two sites have one ring: a second lane is the same ring reversed, never built.
  c.transport.lanes = transport::effective_lanes(in.transport.lanes, in.sync.sites);
  if (c.transport.lanes == 1) c.transport.lane_share = defaults.transport.lane_share;
  return c;
}

}  // namespace

std::vector<ConfigEntry> JobConfig::entries() const {
  JobConfig c = normalized(*this);
  std::vector<ConfigEntry> out;
  for (const ConfigSection& sec : config_sections()) {
    Binder b(sec.name, &out);
    sec.bind(b, c);
  }
  return out;
}

std::string JobConfig::canonical(KeyScope widest) const {
  std::string text;
  for (const ConfigEntry& e : entries())
    if (e.scope <= widest) text += e.key + "=" + e.value + ";";
  return text;
}

std::uint64_t JobConfig::hash() const { return fnv1a64(canonical(KeyScope::kTrajectory)); }

std::uint64_t JobConfig::agreement_hash() const { return fnv1a64(canonical(KeyScope::kJob)); }

std::uint64_t JobConfig::hash(std::string_view tokenizer) const {
  if (tokenizer.empty() || tokenizer == "byte") return hash();
  return fnv1a64(canonical() + "tokenizer=" + std::string(tokenizer) + ";");
}

}  // namespace desloc::train
