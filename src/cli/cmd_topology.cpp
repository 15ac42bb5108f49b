// `desloc plan` and `desloc simulate`: choose periods and a ring order from a measured topology,
// and predict a job on one.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/model/param_layout.hpp"
#include "desloc/report/svg_chart.hpp"
#include "desloc/report/topology_svg.hpp"
#include "desloc/sync/codec.hpp"
#include "desloc/sync/compression.hpp"
#include "desloc/topology/planner.hpp"
#include "desloc/topology/regions.hpp"
#include "desloc/topology/simulator.hpp"
#include "desloc/topology/site_batches.hpp"
#include "desloc/train/config.hpp"
#include "desloc/train/memory_estimate.hpp"
#include "desloc/transport/ring_order.hpp"
#include "flag_checks.hpp"

namespace desloc::cli {
namespace {

// The codecs of a job's [sync], priced for the planner and the simulator: encoded bytes per
// fp32 byte (scales included), and the codec work of one average on one rank
// (sync::codec_seconds_priced of its shard).
struct CodecPrice {
  std::array<double, 3> ratio{1.0, 1.0, 1.0};
  std::array<double, 3> seconds{};
  std::string keys;  // the config lines, "codec_x = \"int8\"\n..."
};

// `spell_fp32`: an all-fp32 job still names its codecs (a choice among codecs overrides the
// config's).
CodecPrice price_codecs(const train::JobConfig& cfg, double params, bool spell_fp32 = false) {
  CodecPrice p;
  const sync::CompressionConfig c = cfg.sync.compression();
  if (!c.any()) {
    if (spell_fp32)
      p.keys = "codec_x = \"fp32\"\ncodec_u = \"fp32\"\ncodec_v = \"fp32\"\nerror_feedback = false";
    return p;
  }
  const auto n = static_cast<std::size_t>(std::max(1.0, params));
  const std::array<optim::StateKind, 3> kinds = {optim::StateKind::kX, optim::StateKind::kU,
                                                 optim::StateKind::kV};
  const std::array<const char*, 3> keys = {"codec_x", "codec_u", "codec_v"};
  for (std::size_t k = 0; k < 3; ++k) {
    if (!c.compresses(kinds[k])) continue;
    p.ratio[k] = double(sync::encoded_bytes(c.of(kinds[k]), n, c.block)) / (4.0 * double(n));
    p.seconds[k] = sync::codec_seconds_priced(params / double(cfg.job.ranks_per_site));
    const bool root = kinds[k] == optim::StateKind::kV && c.sqrt_v;
    p.keys += fmt::format("{} = \"{}{}\"\n", keys[k], root ? "sqrt-" : "",
                          sync::to_string(c.of(kinds[k])));
  }
  p.keys += fmt::format("codec_block = {}\nerror_feedback = {}", c.block,
                        c.error_feedback ? "true" : "false");
  return p;
}

struct PlanOptions {
  std::string topology, config, out, svg_dir;
  double target = 0.05;
  bool overlap = false;
  bool delayed = false;
  int fragments = 0;
  std::int64_t max_delay = 0;
  double delay_weight = topology::PlanRequest{}.delay_weight;
  std::string codecs = "config";
  bool auto_mode = false;
};

// The codec sets `--codecs auto` chooses from, most precise first: on the LM bench (docs/sync.md)
// int8 and int4 on x, u and v stayed within 0.5% of fp32 DES-LOC's loss at the same Kx, while
// a shorter Kx gained more than that.
constexpr std::array<const char*, 3> kAutoCodecs = {"fp32", "int8", "int4"};

// The job with `codec` on every state's average, without error feedback: a candidate of
// --codecs auto and --auto.
train::JobConfig with_codec(train::JobConfig job, const char* codec) {
  job.sync.codec_x = job.sync.codec_u = job.sync.codec_v = codec;
  job.sync.error_feedback = false;
  return job;
}

// What a plan costs the model in steps of period (topology::delay_score).
double plan_score(const topology::Plan& p, const topology::PlanRequest& req) {
  return topology::delay_score(p.kx, p.delay, req.delay_weight);
}

// `desloc plan --auto`: every mode (blocking, delayed) with every codec set of kAutoCodecs,
// priced as one table. Blocking fp32 stays when its Kx is within the validated periods (no
// delay, no compression needed); otherwise the least Kx + W tau wins (plan_score), the simpler
// alternative on a tie (blocking before delayed, the more precise codec first).
template <class PlanWith>
topology::Plan plan_alternatives(const train::JobConfig& cfg, const topology::PlanRequest& req,
                                 PlanWith&& plan_with) {
  struct Alternative {
    std::string mode, codec;
    std::optional<topology::Plan> plan;
    std::string why_not;
  };
  std::vector<Alternative> alts;
  for (const bool delayed : {false, true})
    for (const char* codec : kAutoCodecs) {
      Alternative a{delayed ? "delayed" : "blocking", codec, std::nullopt, ""};
      topology::PlanRequest r = req;
      r.mode = delayed ? topology::PlanMode::kDelayed : topology::PlanMode::kBlocking;
      try {
        a.plan = plan_with(with_codec(cfg, codec), r, true);
      } catch (const ConfigError&) {
        a.why_not = "no Kx within train.steps meets the target";
      }
      alts.push_back(std::move(a));
    }
  const Alternative* chosen = nullptr;
  if (alts[0].plan && alts[0].plan->kx <= topology::kValidatedKx) {
    chosen = &alts[0];
  } else {
    for (const auto& a : alts)
      if (a.plan &&
          (chosen == nullptr || plan_score(*a.plan, req) < plan_score(*chosen->plan, req)))
        chosen = &a;
  }
  if (chosen == nullptr)
    throw ConfigError(fmt::format(
        "plan --auto: no mode and codec meets the target overhead {:.1f}% within train.steps = "
        "{} (blocking and delayed averages, fp32, int8 and int4 payloads were priced); raise "
        "--target-overhead or train.steps",
        100 * req.target_overhead, req.steps));
  topology::Plan plan = *chosen->plan;
  std::vector<std::string> table = {
      fmt::format("alternatives priced (--auto), for a target overhead of {:.1f}%:",
                  100 * req.target_overhead),
      fmt::format("  {:<9} {:<6} {:>8} {:>6} {:>10} {:>9} {:>10}", "mode", "codec", "Kx", "tau",
                  "fragments", "overhead", "x averages")};
  for (const auto& a : alts) {
    if (!a.plan) {
      table.push_back(fmt::format("  {:<9} {:<6} {}", a.mode, a.codec, a.why_not));
      continue;
    }
    const topology::Plan& p = *a.plan;
    table.push_back(fmt::format("  {:<9} {:<6} {:>8} {:>6} {:>10} {:>8.2f}% {:>10}{}", a.mode,
                                a.codec, p.kx, p.delay, p.fragments, 100 * p.overhead,
                                req.steps / p.kx, &a == chosen ? "  <- chosen" : ""));
  }
  table.push_back(fmt::format(
      "chose {} averages with {} payloads: {}", chosen->mode, chosen->codec,
      chosen == &alts[0]
          ? fmt::format("blocking fp32 already gives Kx <= {}, so nothing is traded for it",
                        topology::kValidatedKx)
          : fmt::format("blocking fp32 {}; the least Kx + {:g} tau wins (--delay-weight's "
                        "default; tau = 0 when blocking; the simpler alternative on a tie: "
                        "blocking before delayed, the more precise codec first)",
                        alts[0].plan ? fmt::format("needs Kx = {}", alts[0].plan->kx)
                                     : std::string("cannot meet the target"),
                        req.delay_weight)));
  plan.explanation.insert(plan.explanation.end(), table.begin(), table.end());
  return plan;
}

// The topology with each job site's step at the batch the config gives it: a step the profile
// timed at another batch (SiteProfile::batch) scales linearly with it.
topology::Topology at_site_batches(topology::Topology topo, const train::JobConfig& cfg) {
  const auto names = cfg.site_names();
  for (std::size_t s = 0; s < names.size(); ++s) {
    const auto at = topo.find_site(names[s]);
    if (!at) continue;
    topology::SiteProfile& site = topo.sites[*at];
    const int batch = cfg.site_batch(static_cast<int>(s));
    // A step without its batch was timed at the config's (desloc profile of this config).
    if (site.batch > 0) site.step_s *= double(batch) / double(site.batch);
    site.batch = batch;
  }
  return topo;
}

// `desloc plan` for sites of unequal speed: each site's batch per rank balanced to its speed
// (topology/site_batches.hpp), within the memory its profile measured. nullopt when the sites'
// steps at the configured batches are within 10% of each other (nothing to balance).
std::optional<topology::SiteBatchPlan> plan_site_batches(const topology::Topology& topo,
                                                         const train::JobConfig& cfg) {
  const auto names = cfg.site_names();
  if (names.size() < 2) return std::nullopt;
  topology::SiteBatchRequest req;
  req.sites = names;
  for (int s = 0; s < static_cast<int>(names.size()); ++s) {
    req.ranks.push_back(cfg.site_ranks(s));
    req.batch.push_back(cfg.site_batch(s));
  }
  req.memory_at = [&cfg](int batch) {
    train::JobConfig one = cfg;  // a rank of a site at this batch
    one.job.site.clear();
    one.data.batch = batch;
    return train::estimate_memory(one, train::ProcessRole::kRank).bytes();
  };
  topology::SiteBatchPlan p = topology::balance_site_batches(topo, req);
  const auto [lo, hi] = std::minmax_element(p.configured_step_s.begin(), p.configured_step_s.end());
  if (*hi <= 1.1 * *lo && p.batch == req.batch) return std::nullopt;
  return p;
}

// A plan's config fragment with the balanced batches: its `sites = [...]` line (the ring order)
// becomes [[job.site]] tables in that order, since a config gives one form or the other.
std::string with_site_tables(const std::string& fragment,
                             const std::optional<topology::SiteBatchPlan>& balanced,
                             const std::vector<std::string>& job_sites) {
  if (!balanced) return fragment;
  std::vector<std::string> order;
  std::string out;
  std::size_t at = 0;
  while (at < fragment.size()) {
    const std::size_t end = std::min(fragment.find('\n', at), fragment.size());
    const std::string line = fragment.substr(at, end - at);
    at = end + 1;
    if (!line.starts_with("sites = [")) {
      out += line + "\n";
      continue;
    }
    for (std::size_t q = line.find('"'); q != std::string::npos; q = line.find('"', q + 1)) {
      const std::size_t close = line.find('"', q + 1);
      order.push_back(line.substr(q + 1, close - q - 1));
      q = close;
    }
  }
  if (order.empty()) order = job_sites;
  out += "# each site's batch per rank, balanced to its speed (desloc plan), in the ring order\n";
  for (const std::string& name : order) {
    const auto s = static_cast<std::size_t>(std::find(job_sites.begin(), job_sites.end(), name) -
                                            job_sites.begin());
    out += fmt::format("[[job.site]]\nname = \"{}\"\nranks = {}\nbatch = {}\n", name,
                       balanced->ranks.at(s), balanced->batch.at(s));
  }
  return out;
}

int run_plan(const PlanOptions& o) {
  const std::string& topology_path = o.topology;
  const std::string& out = o.out;
  const std::string& svg_dir = o.svg_dir;
  const auto cfg = train::load_config(o.config);
  const auto sites = cfg.site_names();
  const topology::Topology measured = at_site_batches(topology::load_topology(topology_path), cfg);
  for (const auto& s : sites) measured.site(s);  // every job site must be in the topology
  // Sites of unequal speed: the periods are planned for the steps at the balanced batches the
  // fragment gives them.
  const std::optional<topology::SiteBatchPlan> balanced = plan_site_batches(measured, cfg);
  const topology::Topology topo = [&] {
    if (!balanced) return measured;
    train::JobConfig at_balance = cfg;
    at_balance.job.site.clear();
    for (std::size_t s = 0; s < sites.size(); ++s)
      at_balance.job.site.push_back({sites[s], balanced->ranks[s], balanced->batch[s]});
    return at_site_batches(measured, at_balance);
  }();
  topology::PlanRequest req;
  req.state_bytes = 4.0 * model::parameter_count(cfg.model);
  req.target_overhead = o.target;
  req.beta1 = cfg.optim.beta1;
  req.beta2 = cfg.optim.beta2;
  req.steps = cfg.train.steps;
  req.mode = o.delayed   ? topology::PlanMode::kDelayed
             : o.overlap ? topology::PlanMode::kUnbounded
                         : topology::PlanMode::kBlocking;
  req.fragments = o.fragments;
  req.max_delay = o.max_delay;
  req.delay_weight = o.delay_weight;
  req.lanes = transport::effective_lanes(cfg.transport.lanes, static_cast<int>(sites.size()));
  auto plan_with = [&](const train::JobConfig& job, topology::PlanRequest r, bool spell_fp32) {
    const CodecPrice codecs = price_codecs(job, model::parameter_count(job.model), spell_fp32);
    r.wire_ratio = codecs.ratio;
    r.codec_s = codecs.seconds;
    r.codec_keys = codecs.keys;
    return topology::make_plan(topo, r);
  };
  topology::Plan plan;
  std::string choice;
  if (o.auto_mode) {
    plan = plan_alternatives(cfg, req, plan_with);
  } else if (o.codecs == "auto") {
    // Each codec set's plan; the least Kx + W tau wins (plan_score), the more precise set on a
    // tie.
    // A set whose Kx would exceed train.steps is left out; when every one is, fp32's reason
    // is the error.
    std::string tried;
    std::optional<ConfigError> first_error;
    for (const char* codec : kAutoCodecs) {
      topology::Plan p;
      try {
        p = plan_with(with_codec(cfg, codec), req, true);
      } catch (const ConfigError& e) {
        if (!first_error) first_error = e;
        tried += fmt::format("{}{}: no Kx within train.steps", tried.empty() ? "" : ", ", codec);
        continue;
      }
      tried +=
          fmt::format("{}{} Kx = {}{} (overhead {:.1f}%)", tried.empty() ? "" : ", ", codec, p.kx,
                      p.delay > 0 ? fmt::format(", tau = {}", p.delay) : "", 100.0 * p.overhead);
      if (choice.empty() || plan_score(p, req) < plan_score(plan, req)) {
        plan = std::move(p);
        choice = codec;
      }
    }
    if (choice.empty()) throw *first_error;
    plan.explanation.push_back(fmt::format(
        "codecs (--codecs auto, on x, u and v, blocks of {}): {}; chose {}, the least Kx + W tau "
        "(--delay-weight; the more precise codec on a tie; int8 and int4 stayed within 0.5% of "
        "fp32's loss at the same Kx on the LM bench, docs/sync.md)",
        cfg.sync.codec_block, tried, choice));
  } else {
    plan = plan_with(cfg, req, false);
  }
  for (const auto& line : plan.explanation) std::printf("%s\n", line.c_str());
  // Issue 15: the regions of the config, or the ones the bandwidth matrix suggests, priced as
  // hierarchical DES-LOC beside the flat plan.
  std::optional<topology::RegionPlan> hierarchical;
  if (sites.size() >= 3) {
    std::vector<std::vector<std::string>> regions = cfg.job.regions;
    if (regions.empty()) {
      const topology::RegionProposal proposal = topology::propose_regions(topo);
      for (const auto& line : proposal.explanation) std::printf("%s\n", line.c_str());
      regions = proposal.regions;
    }
    if (regions.size() >= 2 && !plan.chosen.order.empty())
      hierarchical = topology::plan_regions(topo, plan, regions);
    if (hierarchical)
      for (const auto& line : hierarchical->explanation) std::printf("%s\n", line.c_str());
  }
  if (balanced)
    for (const auto& line : balanced->explanation) std::printf("%s\n", line.c_str());
  for (const auto& line : plan.warnings) std::printf("warning: %s\n", line.c_str());
  plan.config_fragment = with_site_tables(plan.config_fragment, balanced, sites);
  if (hierarchical) {
    hierarchical->config_fragment =
        with_site_tables(hierarchical->config_fragment, balanced, sites);
  }
  std::printf("\n%s", plan.config_fragment.c_str());
  // A delayed plan with regions is one whole hierarchical plan; the config's own regions make
  // it the one --out writes.
  const bool whole_hierarchical = hierarchical && hierarchical->plan;
  if (whole_hierarchical)
    std::printf("\n# hierarchical %s DES-LOC (docs/sync.md): instead of the fragment above\n%s",
                hierarchical->plan->fragments > 1 ? "streaming" : "delayed",
                hierarchical->config_fragment.c_str());
  else if (hierarchical && hierarchical->worthwhile)
    std::printf("\n%s", hierarchical->config_fragment.c_str());
  if (!out.empty()) {
    const auto& text = whole_hierarchical && !cfg.job.regions.empty()
                           ? hierarchical->config_fragment
                           : plan.config_fragment;
    write_file_atomic(out, text);
    std::printf("wrote %s\n", out.c_str());
  }
  if (!svg_dir.empty()) {
    std::filesystem::create_directories(svg_dir);
    const std::string diagram = svg_dir + "/topology.svg", heat = svg_dir + "/bandwidth.svg";
    report::write_svg_file(diagram,
                           report::svg_topology_diagram(
                               topo, plan.chosen.order,
                               fmt::format("{}: {} ({:.3f} s per all-reduce), Kx {}", topology_path,
                                           plan.chosen.describe(), plan.chosen.seconds, plan.kx)));
    report::write_svg_file(
        heat, report::svg_bandwidth_heatmap(topo, "measured bandwidth, " + topology_path));
    std::printf("wrote %s and %s\n", diagram.c_str(), heat.c_str());
  }
  return 0;
}

struct SimulateOptions {
  std::string topology, config, methods = "none,ddp,local_adam,desloc";
  std::int64_t steps = 0;  // 0 = train.steps
  bool overlap = false;
  double jitter = -1.0;  // -1 = each site's step_jitter (the topology's)
  double link_scale = 1.0, step_scale = 1.0, params = 0.0;  // params 0 = config's
};

// The simulator walks every step; beyond this a run takes minutes per method.
constexpr std::int64_t kMaxSimulatedSteps = 1'000'000'000;

// "--methods none,ddp" -> {kNone, kDdp}; ConfigError for no name at all or an unknown one.
std::vector<SyncMethod> parse_methods(const std::string& text) {
  std::string valid;
  for (const auto m : kSyncMethods)
    valid += fmt::format("{}{}", valid.empty() ? "" : ", ", to_string(m));
  std::vector<SyncMethod> methods;
  std::string list = text + ",";
  for (std::size_t at = 0, next; (next = list.find(',', at)) != std::string::npos; at = next + 1) {
    const std::string m = list.substr(at, next - at);
    if (m.empty()) continue;
    const auto method = parse_sync_method(m);
    if (!method)
      throw ConfigError(
          fmt::format("--methods: unknown method '{}'; the simulator models {}", m, valid));
    methods.push_back(*method);
  }
  if (methods.empty())
    throw ConfigError(fmt::format(
        "--methods '{}' names no method; give a comma-separated list of {}", text, valid));
  return methods;
}

// "0.30", or each site's measured noise: "by site (the topology's step_jitter): A 0.29, B 0".
std::string describe_jitter(const topology::Topology& t, std::optional<double> given) {
  if (given) return fmt::format("{:.2f}", *given);
  std::string by_site;
  for (const auto& s : t.sites)
    by_site += fmt::format("{}{} {:.2f}", by_site.empty() ? "" : ", ", s.name, s.step_jitter);
  return "by site (the topology's step_jitter): " + by_site;
}

// The topology of --topology with --link-scale and --step-scale applied. The scales are checked
// finite and positive; their products must stay so too.
topology::Topology scaled_topology(const SimulateOptions& o) {
  auto topo = topology::load_topology(o.topology);
  for (auto& l : topo.links) {
    l.bandwidth_bps *= o.link_scale;
    if (!(std::isfinite(l.bandwidth_bps) && l.bandwidth_bps > 0))
      throw ConfigError(fmt::format(
          "--link-scale {}: the link {} -> {} would carry {} bytes/s; choose a scale that keeps "
          "every bandwidth finite and positive",
          o.link_scale, l.from, l.to, l.bandwidth_bps));
  }
  for (auto& site : topo.sites) {
    site.step_s *= o.step_scale;
    if (!(std::isfinite(site.step_s) && site.step_s > 0))
      throw ConfigError(fmt::format(
          "--step-scale {}: site {}'s step would take {} s; choose a scale that keeps every step "
          "time finite and positive",
          o.step_scale, site.name, site.step_s));
  }
  return topo;
}

// The job a config describes, as the simulator takes it: its steps, states, codecs, overlap
// mode and delays, ring, lanes, periods, switches and regions. A job that is not desloc
// compares against desloc at the paper's ratios Ku = 3 Kx, Kv = 6 Kx.
topology::SimJob simulated_job(const train::JobConfig& cfg, const SimulateOptions& o, double params,
                               const CodecPrice& codecs) {
  topology::SimJob job;
  job.steps = o.steps > 0 ? o.steps : cfg.train.steps;
  if (job.steps > kMaxSimulatedSteps)
    throw ConfigError(
        fmt::format("{}: train.steps = {} is more than the simulator walks ({}); pass --steps",
                    cfg.source, cfg.train.steps, kMaxSimulatedSteps));
  job.state_bytes = 4.0 * params;
  job.wire_ratio = codecs.ratio;
  job.codec_s = codecs.seconds;
  job.overlap = o.overlap;
  job.mode = cfg.sync.overlap;
  job.delay = cfg.sync.effective_delays();
  if (o.jitter >= 0) job.jitter = o.jitter;
  job.ring = cfg.site_names();
  job.lanes = transport::effective_lanes(cfg.transport.lanes, static_cast<int>(job.ring.size()));
  job.lane_share = cfg.transport.lane_share;
  auto sync = cfg.sync;
  if (sync.method != SyncMethod::kDesloc) sync = {.kx = cfg.sync.kx};
  sync.method = SyncMethod::kDesloc;
  job.schedule = sync.schedule();
  for (const sync::PeriodSwitch& sw : cfg.sync.switches)
    job.switches.emplace_back(sw.after, sync.schedule_after(sw));
  if (!cfg.job.regions.empty()) {
    auto regional = cfg.sync;
    regional.method = SyncMethod::kDesloc;
    job.regions = cfg.job.regions;
    job.region_schedule = regional.region_schedule();
  }
  return job;
}

// What is simulated: the sites, the model, the periods, the mode, switches, regions, codecs.
void print_simulated_job(const topology::Topology& topo, const topology::SimJob& base,
                         double params, const CodecPrice& codecs, bool overlap) {
  std::printf(
      "simulate: %zu sites, %.3g parameters (%.2f MB per state), %lld steps, Kx %lld, "
      "Ku %lld, Kv %lld, %s syncs%s, compute jitter %s\n",
      topo.sites.size(), params, base.state_bytes / 1e6, static_cast<long long>(base.steps),
      static_cast<long long>(base.schedule.kx), static_cast<long long>(base.schedule.ku),
      static_cast<long long>(base.schedule.kv),
      overlap                       ? "overlapped (what-if)"
      : base.mode == Overlap::kStep ? "step-overlapped (sync.overlap)"
      : base.delayed()              ? "delayed (sync.overlap)"
                                    : "blocking",
      ((base.delayed() && !overlap
            ? fmt::format(" tau {}/{}/{}", base.delay[0], base.delay[1], base.delay[2])
            : std::string()) +
       (base.schedule.fragments > 1
            ? fmt::format(", {} fragments per average", base.schedule.fragments)
            : std::string()))
          .c_str(),
      describe_jitter(topo, base.jitter).c_str());
  for (const auto& [after, s] : base.switches)
    std::printf("after step %lld: Kx %lld, Ku %lld, Kv %lld (sync.switches)\n",
                static_cast<long long>(after), static_cast<long long>(s.kx),
                static_cast<long long>(s.ku), static_cast<long long>(s.kv));
  if (!base.regions.empty()) {
    std::printf("regions %s: inside each, Kx %lld, Ku %lld, Kv %lld (methods that average x)\n",
                topology::describe_regions(base.regions).c_str(),
                static_cast<long long>(base.region_schedule.kx),
                static_cast<long long>(base.region_schedule.ku),
                static_cast<long long>(base.region_schedule.kv));
  }
  if (!codecs.keys.empty()) {
    std::string line = codecs.keys;
    std::replace(line.begin(), line.end(), '\n', ' ');
    std::printf(
        "codecs on every method's %saverages of x, u and v: %s (x %.3fx, u %.3fx, v %.3fx of "
        "fp32 on the wire, %.3f s of codec work per average of a state)\n",
        base.regions.empty() ? "" : "job-wide (the regions' stay fp32) ", line.c_str(),
        codecs.ratio[0], codecs.ratio[1], codecs.ratio[2],
        std::max({codecs.seconds[0], codecs.seconds[1], codecs.seconds[2]}));
  }
}

int run_simulate(const SimulateOptions& o) {
  const auto methods = parse_methods(o.methods);
  const auto cfg = train::load_config(o.config);
  const topology::Topology topo = at_site_batches(scaled_topology(o), cfg);
  const double params = o.params > 0 ? o.params : model::parameter_count(cfg.model);
  const CodecPrice codecs = price_codecs(cfg, params);
  const topology::SimJob base = simulated_job(cfg, o, params, codecs);
  for (const auto& s : base.ring) topo.site(s);
  print_simulated_job(topo, base, params, codecs, o.overlap);
  std::printf("%-11s %10s %12s %10s %10s %8s %12s %9s %9s\n", "method", "ms/step", "total",
              "comm s", "wait s", "syncs", "MB/site", "vs none", "steal s");
  double none_total = 0;
  std::vector<std::string> waits;  // each method's wait per site, after the table
  for (const auto& method : methods) {
    auto job = base;
    job.schedule.method = method;
    job.region_schedule.method = method;
    for (auto& sw : job.switches) sw.second.method = method;
    const auto r = topology::simulate(topo, job);
    if (method == SyncMethod::kNone) none_total = r.total_s;
    const std::string total = r.total_s >= 86400  ? fmt::format("{:.2f} days", r.total_s / 86400)
                              : r.total_s >= 3600 ? fmt::format("{:.2f} h", r.total_s / 3600)
                                                  : fmt::format("{:.1f} s", r.total_s);
    std::printf("%-11s %10.1f %12s %10.3f %10.3f %8lld %12.1f %9s %9.3f\n",
                std::string(to_string(method)).c_str(), r.step_s * 1e3, total.c_str(), r.comm_s,
                r.wait_s, static_cast<long long>(r.syncs), r.bytes_per_site / 1e6,
                none_total > 0 ? fmt::format("{:.3f}x", r.total_s / none_total).c_str() : "-",
                r.steal_s);
    if (method != SyncMethod::kNone && topo.sites.size() > 1) {
      std::vector<std::string> each;
      for (std::size_t i = 0; i < topo.sites.size(); ++i)
        each.push_back(fmt::format("{} {:.3f} s", topo.sites[i].name, r.wait_by_site.at(i)));
      waits.push_back(fmt::format("{}: {}", to_string(method), fmt::join(each, ", ")));
    }
  }
  if (!waits.empty()) std::printf("wait per site at the averages:\n");
  for (const auto& line : waits) std::printf("  %s\n", line.c_str());
  return 0;
}

}  // namespace

std::vector<Command> add_topology_commands(CLI::App& app) {
  auto plan_opts = std::make_shared<PlanOptions>();
  PlanOptions& p = *plan_opts;
  auto* plan = app.add_subcommand(
      "plan",
      "choose the wide-area ring order, Kx, Ku, Kv and their phases from a measured topology "
      "(topology.toml) and a job, with the reasons; prints a config fragment");
  plan->add_option("--topology", p.topology, "topology.toml (sites, step times, links)")
      ->required();
  plan->add_option("-c,--config", p.config, "job config (model size, betas, steps)")->required();
  plan->add_option("--target-overhead", p.target,
                   "communication time as a fraction of compute time; refused when Kx would "
                   "have to exceed train.steps")
      ->check(finite_above(0, "communication time / compute time, e.g. 0.05"))
      ->capture_default_str();
  auto* overlap_flag =
      plan->add_flag("--overlap", p.overlap,
                     "price syncs as running under any number of following steps (a what-if: "
                     "sync.overlap = \"step\" hides at most one step)");
  auto* delayed_flag =
      plan->add_flag(
              "--delayed", p.delayed,
              "plan delayed averages (sync.overlap = \"delayed\"): the delay tau that hides "
              "an average under tau + 1 steps of compute, the Kx that keeps averages apart "
              "on the link, and the fragment count (streaming, sync.fragments) when fragments "
              "give a shorter Kx; no step waits for an average that leaves the wire in time")
          ->excludes(overlap_flag);
  plan->add_option("--fragments", p.fragments,
                   "with --delayed: 0 = choose the fragment count (streaming DES-LOC, "
                   "sync.fragments) that gives the least Kx + W tau (--delay-weight), 1 = whole "
                   "averages, P = exactly P")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str()
      ->needs(delayed_flag);
  plan->add_option("--max-delay", p.max_delay,
                   "with --delayed: the largest delay tau in steps a plan may use (0 = any); "
                   "the planner then takes a longer Kx or more fragments instead")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40))
      ->capture_default_str()
      ->needs(delayed_flag);
  plan->add_option("--delay-weight", p.delay_weight,
                   "with --delayed: how many steps of period one step of delay tau costs the "
                   "model; the plan minimises Kx + W tau within the target (0 = the shortest "
                   "Kx, then the shortest tau; the default fits the e2e bed's model, "
                   "docs/topology.md)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str()
      ->needs(delayed_flag);
  plan->add_option("--codecs", p.codecs,
                   "\"config\": price the config's sync.codec_* as given; \"auto\": plan "
                   "with fp32, int8 and int4 on every state and keep the one that gives the "
                   "least Kx + W tau (--delay-weight; tau = 0 when blocking; the more precise "
                   "on a tie); the fragment names the codecs")
      ->check(CLI::IsMember({"config", "auto"}))
      ->capture_default_str();
  plan->add_flag("--auto", p.auto_mode,
                 "price blocking and delayed (streaming) averages with fp32, int8 and int4 "
                 "payloads, print them side by side, and choose: blocking fp32 when its Kx is "
                 "within the validated 256, else the least Kx + 8 tau (a step of delay weighed "
                 "as 8 of period, --delay-weight's default; tau = 0 when blocking)")
      ->excludes(delayed_flag)
      ->excludes(overlap_flag);
  plan->add_option("--out", p.out, "also write the config fragment to this file");
  plan->add_option("--svg", p.svg_dir,
                   "write topology.svg (sites, links, the chosen ring) and bandwidth.svg (the "
                   "bandwidth matrix as a heatmap) into this directory");

  auto sim_opts = std::make_shared<SimulateOptions>();
  SimulateOptions& s = *sim_opts;
  auto* simulate = app.add_subcommand(
      "simulate",
      "predict step time and time to N steps of DDP, Local Adam and DES-LOC on a topology "
      "(discrete-event model); what-ifs scale the links, the compute or the model");
  simulate->add_option("--topology", s.topology, "topology.toml")->required();
  simulate->add_option("-c,--config", s.config, "job config (model, periods, steps, sites)")
      ->required();
  simulate->add_option("--steps", s.steps, "steps to simulate (default: train.steps)")
      ->check(whole_in(1, kMaxSimulatedSteps, "steps to simulate"));
  simulate
      ->add_option("--methods", s.methods,
                   "comma-separated methods, of none, ddp, favg, favg_reset, local_adam, "
                   "desloc")
      ->capture_default_str();
  simulate->add_flag("--overlap", s.overlap,
                     "what-if: syncs run under any number of following steps (without it the "
                     "config's sync.overlap is modelled: \"step\" hides at most one step, "
                     "\"delayed\" up to delay + 1)");
  simulate
      ->add_option("--jitter", s.jitter,
                   "per-step compute noise at every site: the sigma of a log-normal factor "
                   "of mean 1 (e.g. 0.3; 0 = steady). Default: each site's step_jitter in the "
                   "topology, which desloc profile measures (0 where absent)")
      ->check(finite_at_least(0, "sigma of the log-normal compute noise"));
  simulate->add_option("--link-scale", s.link_scale, "what-if: multiply every bandwidth")
      ->check(finite_above(0, "factor on every bandwidth"))
      ->capture_default_str();
  simulate->add_option("--step-scale", s.step_scale, "what-if: multiply every step time")
      ->check(finite_above(0, "factor on every step time"))
      ->capture_default_str();
  simulate->add_option("--params", s.params, "what-if: model parameters (default: the config's)")
      ->check(finite_above(0, "model parameters"));

  return {{plan, [plan_opts] { return run_plan(*plan_opts); }},
          {simulate, [sim_opts] { return run_simulate(*sim_opts); }}};
}

}  // namespace desloc::cli
