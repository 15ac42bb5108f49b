// Question: does `desloc plan` (and `plan --delayed`) choose a plan for a decentralised job of
// 1024 sites with regions in under 2 s on this machine, and how does its time grow from 64 sites
// (issue 43)?
//
// Synthetic topologies of 64 to 1024 sites in regions of 32 (64: 8 of 8): 100 Gbit and 0.5 ms
// inside a region, 1 to 25 Gbit and 20 ms between regions, a 350M-parameter model (1.4 GB
// states), 1 s compute steps, 10^6 steps. Two measurements per size:
//   - the planner in the library: make_plan (blocking, then delayed: streaming when fragments
//     help), propose_regions and plan_regions (the hierarchical plan of each mode), on a
//     topology already in memory. Validated before timing: the ring visits every site once,
//     the proposed regions are the generated ones, the delayed hierarchical plan's Kx is a
//     multiple of the regions' and its overhead within the target and their share.
//   - the whole `desloc plan` command on files (the topology written with to_toml, its links as
//     [links] matrices from 32 sites on, and a job config naming the sites, whose regions the
//     plan proposes): parsing, the checks, the plan and its printing.
// Each is warmed up and repeated: median [min-max], against the 2 s target, and the growth
// exponent from the size before (time ~ n^e).
//
//   bench_plan_scale [--repeats 3] [--max-sites 1024] [--desloc build/src/desloc]
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "desloc/topology/planner.hpp"
#include "desloc/topology/regions.hpp"
#include "desloc/topology/topology.hpp"
#include "harness.hpp"
#include "synthetic_topology.hpp"

namespace {
using namespace desloc;
using bench::BenchError;
namespace fs = std::filesystem;

constexpr double kStateBytes = 4.0 * 350e6;
constexpr double kTargetSeconds = 2.0;

topology::PlanRequest request(topology::PlanMode mode) {
  topology::PlanRequest r;
  r.state_bytes = kStateBytes;
  r.steps = 1000000;
  r.lanes = 2;
  r.mode = mode;
  return r;
}

// What one call of the library planner computes, as `desloc plan` does it: the flat plan, the
// proposed regions and the hierarchical plan beside it.
struct Planned {
  topology::Plan flat;
  topology::RegionProposal proposal;
  topology::RegionPlan regions;
};

Planned plan_once(const topology::Topology& t, topology::PlanMode mode) {
  Planned p;
  p.flat = topology::make_plan(t, request(mode));
  p.proposal = topology::propose_regions(t);
  p.regions = topology::plan_regions(t, p.flat, p.proposal.regions);
  return p;
}

void validate(const topology::Topology& t, const Planned& p, int regions, int per_region,
              const std::string& what) {
  const std::set<std::string> ring(p.flat.chosen.order.begin(), p.flat.chosen.order.end());
  if (ring.size() != t.sites.size() || p.flat.chosen.order.size() != t.sites.size())
    throw BenchError(what + ": the ring does not visit every site once");
  if (p.proposal.regions.size() != std::size_t(regions))
    throw BenchError(fmt::format("{}: {} regions proposed, {} generated", what,
                                 p.proposal.regions.size(), regions));
  for (const auto& g : p.proposal.regions)
    if (g.size() != std::size_t(per_region))
      throw BenchError(what + ": a proposed region is not one of the generated ones");
  if (!(p.flat.kx > 0) || !(p.flat.overhead <= p.flat.request.target_overhead + 1e-9))
    throw BenchError(fmt::format("{}: Kx {} at {:.2f}%", what, p.flat.kx, 100 * p.flat.overhead));
  if (p.flat.request.mode == topology::PlanMode::kDelayed) {
    if (!p.regions.plan)
      throw BenchError(what + ": no hierarchical delayed plan: " +
                       fmt::format("{}", fmt::join(p.regions.explanation, "; ")));
    const topology::Plan& h = *p.regions.plan;
    if (h.kx % p.regions.region_kx != 0 ||
        h.overhead > h.request.target_overhead + p.regions.region_overhead + 1e-9)
      throw BenchError(fmt::format("{}: hierarchical Kx {} (regions {}) at {:.2f}%", what, h.kx,
                                   p.regions.region_kx, 100 * h.overhead));
  }
}

// The job config `desloc plan` reads: the model of kStateBytes and the sites (the plan
// proposes the regions from the bandwidth matrix).
std::string job_toml(const topology::Topology& t, const fs::path& dir) {
  std::vector<std::string> sites;
  for (const auto& s : t.sites) sites.push_back("\"" + s.name + "\"");
  // 24 layers of d 1024, vocabulary 50304, context 1024: about 350M parameters.
  return fmt::format(
      "[model]\nvocab = 50304\ncontext = 1024\nlayers = 24\nheads = 16\nd_model = 1024\n"
      "[data]\ndir = \"{}\"\n[train]\nsteps = 1000000\nout_dir = \"{}\"\n"
      "[sync]\nmethod = \"desloc\"\nkx = 64\n[job]\nsites = [{}]\n[transport]\nlanes = 2\n",
      (dir / "data").string(), (dir / "out").string(), fmt::join(sites, ", "));
}

double growth(double before_ms, double now_ms, std::size_t n_before, std::size_t n) {
  return std::log(now_ms / before_ms) / std::log(double(n) / double(n_before));
}

int run(int argc, char** argv) {
  int repeats = 3;
  int max_sites = 1024;
  std::string desloc = (fs::path(argv[0]).parent_path() / ".." / "src" / "desloc").string();
  bench::Flags("bench_plan_scale [--repeats N] [--max-sites N] [--desloc PATH]")
      .add("--repeats", repeats)
      .add("--max-sites", max_sites)
      .add("--desloc", desloc)
      .parse(argc, argv);
  if (repeats < 1) throw BenchError("--repeats must be positive");
  if (!fs::exists(desloc)) throw BenchError("no desloc program at " + desloc + " (--desloc)");
  const fs::path dir = fs::temp_directory_path() / fmt::format("bench_plan_scale.{}", getpid());
  fs::create_directories(dir);
  std::printf("bench_plan_scale: %d repeats, load %s\n", repeats, bench::load_average().c_str());
  bench::Table table({"sites", "mode", "plan (library) ms", "vs 2 s", "growth", "desloc plan ms",
                      "vs 2 s", "growth", "Kx", "tau", "fragments", "regions Kx / job Kx"});
  std::size_t n_before = 0;
  double lib_before[2] = {0, 0}, cli_before[2] = {0, 0};
  for (const auto& [regions, per] : {std::pair{8, 8}, std::pair{4, 32}, std::pair{8, 32},
                                     std::pair{16, 32}, std::pair{32, 32}}) {
    if (regions * per > max_sites) continue;
    const topology::Topology t = bench::grouped_topology(regions, per, 1.0);
    const std::size_t n = t.sites.size();
    const fs::path topo = dir / fmt::format("topology{}.toml", n);
    const fs::path job = dir / fmt::format("job{}.toml", n);
    std::ofstream(topo) << topology::to_toml(t);
    std::ofstream(job) << job_toml(t, dir);
    for (const auto mode : {topology::PlanMode::kBlocking, topology::PlanMode::kDelayed}) {
      const bool delayed = mode == topology::PlanMode::kDelayed;
      const std::string what = fmt::format("{} sites, {}", n, delayed ? "delayed" : "blocking");
      Planned p = plan_once(t, mode);
      validate(t, p, regions, per, what);
      const bench::Stats lib =
          bench::summarize(bench::time_ms([&] { p = plan_once(t, mode); }, 1, repeats));
      const std::string command =
          fmt::format("{} plan --topology {} --config {}{} > {} 2>&1", desloc, topo.string(),
                      job.string(), delayed ? " --delayed" : "", (dir / "out.txt").string());
      const bench::Stats cli = bench::summarize(bench::time_ms(
          [&] {
            if (std::system(command.c_str()) != 0) {
              std::ifstream out(dir / "out.txt");
              throw BenchError(what + ": `" + command + "` failed:\n" +
                               std::string(std::istreambuf_iterator<char>(out), {}));
            }
          },
          1, repeats));
      const topology::Plan& shown = delayed && p.regions.plan ? *p.regions.plan : p.flat;
      table.add(
          {std::to_string(n), delayed ? "delayed" : "blocking", bench::fmt_stats(lib, 0),
           bench::fmt(lib.median / 1e3 / kTargetSeconds, 3) + "x",
           n_before ? bench::fmt(growth(lib_before[delayed], lib.median, n_before, n), 2) : "-",
           bench::fmt_stats(cli, 0), bench::fmt(cli.median / 1e3 / kTargetSeconds, 3) + "x",
           n_before ? bench::fmt(growth(cli_before[delayed], cli.median, n_before, n), 2) : "-",
           std::to_string(shown.kx), std::to_string(shown.delay), std::to_string(shown.fragments),
           fmt::format("{} / {}", p.regions.region_kx, p.regions.kx)});
      lib_before[delayed] = lib.median;
      cli_before[delayed] = cli.median;
    }
    n_before = n;
  }
  table.print();
  fs::remove_all(dir);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_plan_scale: %s\n", e.what());
    return 1;
  }
}
