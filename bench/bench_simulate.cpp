// Question: does `desloc simulate` predict a job of 1024 sites in under a second (issue 15,
// item 6), flat, hierarchical (regions) and re-planned (period switches)?
//
// Synthetic topologies of 64, 256 and 1024 sites in regions of 32 (64: 8 of 8): 100 Gbit and
// 0.5 ms inside a region, 1 to 25 Gbit and 20 ms between regions, a 13B model's 52 GB states,
// 0.5 s compute steps, 10000 steps. Before timing, every prediction is validated against what
// the schedule implies: the count of averages and the bytes a site sends. Then each is timed:
// its first call on a fresh copy of the topology (which builds the link index, as one `desloc
// simulate` run does) and then warmup, repeats, median [min-max], set against the 1 s target.
//
//   bench_simulate [--steps 10000] [--repeats 5] [--max-sites 1024]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "desloc/core/sync_schedule.hpp"
#include "desloc/topology/simulator.hpp"
#include "desloc/topology/topology.hpp"
#include "harness.hpp"
#include "synthetic_topology.hpp"

namespace {
using namespace desloc;
using bench::BenchError;

struct Case {
  std::string name;
  topology::SimJob job;
};

// What the schedule implies: averages (per state, on the job-wide ring or inside regions) and
// the bytes site 0 sends, counted step by step with the trainer's own due rule.
void validate(const topology::Topology& t, const topology::SimJob& job,
              const topology::SimResult& r, const std::string& what) {
  const double n = double(t.sites.size());
  std::int64_t syncs = 0;
  double bytes = 0;
  const double m = job.regions.empty() ? 0.0 : double(job.regions[0].size());
  for (std::int64_t step = 1; step <= job.steps; ++step) {
    const SyncDecision d = job.schedule_at(step).at(step);
    const int states = int(d.x) + int(d.u) + int(d.v);
    syncs += states;
    bytes += states * job.state_bytes * 2.0 * (n - 1) / n;
    if (!job.regions.empty()) {
      const SyncDecision rd = job.region_schedule.at(step);
      const int only = int(rd.x && !d.x) + int(rd.u && !d.u) + int(rd.v && !d.v);
      syncs += only * std::int64_t(job.regions.size());
      bytes += only * job.state_bytes * 2.0 * (m - 1) / m;
    }
  }
  if (r.syncs != syncs || std::abs(r.bytes_per_site - bytes) > 1e-6 * bytes ||
      !std::isfinite(r.total_s) || r.total_s < double(job.steps) * 0.5)
    throw BenchError(what + ": the prediction does not match the schedule (" +
                     std::to_string(r.syncs) + " averages, expected " + std::to_string(syncs) +
                     "; " + std::to_string(r.bytes_per_site) + " bytes, expected " +
                     std::to_string(bytes) + ")");
}

int run(int argc, char** argv) {
  std::int64_t steps = 10000;
  int repeats = 5;
  int max_sites = 1024;
  bench::Flags("bench_simulate [--steps N] [--repeats N] [--max-sites N]")
      .add("--steps", steps)
      .add("--repeats", repeats)
      .add("--max-sites", max_sites)
      .parse(argc, argv);
  if (steps < 1 || repeats < 1) throw BenchError("--steps and --repeats must be positive");
  std::printf("bench_simulate: %lld steps, %d repeats, load %s\n", static_cast<long long>(steps),
              repeats, bench::load_average().c_str());
  bench::Table table({"sites", "job", "build ms", "first ms", "predict ms", "vs 1 s target",
                      "predicted", "averages"});
  for (const auto& [regions, per] : {std::pair{8, 8}, std::pair{8, 32}, std::pair{32, 32}}) {
    if (regions * per > max_sites) continue;
    double t0 = bench::now_s();
    const topology::Topology t = bench::grouped_topology(regions, per, 0.5);
    const double build_ms = 1e3 * (bench::now_s() - t0);
    topology::SimJob flat;
    flat.steps = steps;
    flat.state_bytes = 4.0 * 13e9;
    flat.schedule = {SyncMethod::kDesloc, 256, 768, 1536, 0, 0, 0};
    flat.lanes = 2;
    topology::SimJob hier = flat;
    hier.lanes = 1;  // regions run one lane; the job-wide ring too, to compare like with like
    for (int g = 0; g < regions; ++g) {
      hier.regions.emplace_back();
      for (int s = 0; s < per; ++s)
        hier.regions.back().push_back(t.sites[std::size_t(g * per + s)].name);
    }
    hier.region_schedule = {SyncMethod::kDesloc, 16, 48, 96, 0, 0, 0};
    topology::SimJob replanned = flat;
    SyncSchedule after = flat.schedule;
    after.kx = 1024;
    after.ku = 3072;
    after.kv = 6144;
    after.phase_x = after.phase_u = after.phase_v = 2560;
    replanned.switches.emplace_back(2560, after);
    for (const Case& c :
         {Case{"flat desloc kx 256", flat}, Case{"regions (kx 16 inside, 256 across)", hier},
          Case{"re-planned (kx 256 -> 1024 after 2560)", replanned}}) {
      const std::string what = std::to_string(t.sites.size()) + " sites, " + c.name;
      topology::Topology fresh;  // no link index yet: the first call builds it
      fresh.sites = t.sites;
      fresh.links = t.links;
      fresh.source = t.source;
      t0 = bench::now_s();
      const topology::SimResult first = topology::simulate(fresh, c.job);
      const double first_ms = 1e3 * (bench::now_s() - t0);
      validate(t, c.job, first, what);
      topology::SimResult r;
      const bench::Stats s =
          bench::summarize(bench::time_ms([&] { r = topology::simulate(t, c.job); }, 1, repeats));
      table.add({std::to_string(t.sites.size()), c.name, bench::fmt(build_ms, 0),
                 bench::fmt(first_ms, 1), bench::fmt_stats(s, 1),
                 bench::fmt(s.median / 1e3, 3) + "x", bench::fmt(r.total_s / 3600, 1) + " h",
                 std::to_string(r.syncs)});
    }
  }
  table.print();
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_simulate: %s\n", e.what());
    return 1;
  }
}
