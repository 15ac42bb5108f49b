// The fault-injection suite's scaffolding (fault_test.cpp, fault_rejoin_test.cpp): a real
// multi-process job over loopback (`desloc coordinator` plus one `desloc worker` per rank), the
// fault-free in-process reference, and the rows of <build>/fault_report.md.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "cluster_env.hpp"
#include "test_env.hpp"

namespace desloc::test {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Losing one of three sites a quarter to a third into a run leaves the survivors with two
// thirds of the data for the rest of it: the final loss moved by -0.009 to +0.032 nats in the
// release build and up to +0.056 under ASan+UBSan (other rounding, an earlier kill). A broken
// recovery (a partial or stale average applied, a blown-up step) costs far more or fails
// outright: before the momentum bound (docs/sync.md) one such run reached a loss of 877.
constexpr double kLossTolerance = 0.08;
// Without one of three sites from the first step on, the survivors see two thirds of the data
// for the whole run: +0.068 (3 x 1 rank) and +0.093 (3 x 2 ranks, 2 lanes) in the release
// build. A broken start (a stale or partial state) fails outright or costs far more.
constexpr double kLossToleranceWithoutASiteFromTheStart = 0.15;
constexpr int kSteps = 1500;

// The sites of a job of `count` sites (2 to 4), in ring order. Every scenario runs at the
// default transport.lanes (2): with 3 sites or more both rings carry data, and a job that
// shrinks to 2 sites and grows back changes its lane count.
inline std::vector<std::string> site_names(int count) {
  const std::vector<std::string> all{"west", "east", "north", "south"};
  return {all.begin(), all.begin() + count};
}

inline std::string shape(int sites, int ranks) {
  return std::to_string(sites) + " sites x " + std::to_string(ranks) + " rank" +
         (ranks > 1 ? "s" : "") + ", " + (sites >= 3 ? "2 lanes" : "1 lane");
}

// `batches`: each site's batch per rank, as [[job.site]] tables (sites that differ), instead of
// the shorthand's data.batch = 4 for every site.
inline std::string elastic_toml(const fs::path& out, int ranks, int sites,
                                const std::string& extra_job, const std::string& extra_sync = "",
                                const std::vector<int>& batches = {},
                                const std::vector<int>& site_ranks = {}) {
  std::string toml = tiny_job_toml(out);
  auto set = [&](const std::string& key, const std::string& value) {
    const auto at = toml.find(key + " = ");
    const auto end = toml.find('\n', at);
    toml.replace(at, end - at, key + " = " + value);
  };
  set("steps", std::to_string(kSteps));
  set("eval_every", "500");
  set("checkpoint_every", "250");
  // 32 batches (4096 tokens): on 2 (256 tokens) the validation loss alone varied by more than
  // the tolerance between machines (+0.084 for the x-average death on an AMD EPYC host,
  // +0.046 on 4096 tokens).
  set("eval_batches", "32");
  std::string names, tables;
  for (const auto& s : site_names(sites)) names += (names.empty() ? "\"" : ", \"") + s + "\"";
  std::string shorthand =
      "sites = [" + names + "]\nranks_per_site = " + std::to_string(ranks) + "\n";
  if (!batches.empty()) {
    toml.replace(toml.find("\nbatch = 4\n"), 11, "\n");
    shorthand.clear();
    for (int i = 0; i < sites; ++i)
      tables += "[[job.site]]\nname = \"" + site_names(sites)[std::size_t(i)] + "\"\nranks = " +
                std::to_string(site_ranks.empty() ? ranks : site_ranks.at(std::size_t(i))) +
                "\nbatch = " + std::to_string(batches.at(std::size_t(i))) + "\n";
  }
  return toml + "[sync]\nmethod = \"desloc\"\nkx = 4\n" + extra_sync + "[job]\n" + shorthand +
         "token = \"fault-suite\"\nrendezvous_timeout_s = 30\nheartbeat_ms = 200\n"
         "heartbeat_timeout_ms = 1500\nrecovery_timeout_s = 10\n" +
         extra_job + "[transport]\ndeadline_s = 5\n" + tables;
}

// The last value of a numeric field in a metrics file's records of type `type`.
inline std::optional<double> last_field(const fs::path& metrics, const std::string& type,
                                        const std::string& field) {
  std::ifstream in(metrics);
  std::optional<double> v;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"type\":\"" + type + "\"") == std::string::npos) continue;
    const auto at = line.find("\"" + field + "\":");
    if (at == std::string::npos) continue;
    v = std::atof(line.c_str() + at + field.size() + 3);
  }
  return v;
}

// Steps the leader has logged so far.
inline std::int64_t leader_step(const fs::path& metrics) {
  return static_cast<std::int64_t>(last_field(metrics, "train", "step").value_or(0));
}

// Polls `p`'s log until it contains `needle`; the time it appeared, or nullopt at the limit.
inline std::optional<Clock::time_point> wait_for_text(const Process& p, const std::string& needle,
                                                      std::chrono::milliseconds limit) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (p.output().find(needle) != std::string::npos) return Clock::now();
    std::this_thread::sleep_for(10ms);
  }
  return std::nullopt;
}

inline double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A negative time or byte count is printed as "-" (not applicable to the scenario).
inline void report_row(const std::string& scenario, double detect_s, double recover_s,
                       double loss_delta, double bytes_resent, const std::string& outcome) {
  const fs::path path = fs::path(DESLOC_CLI).parent_path().parent_path() / "fault_report.md";
  const bool fresh = !fs::exists(path);
  std::ofstream out(path, std::ios::app);
  if (fresh)
    out << "| scenario | detection (s) | recovery (s) | loss delta (nats) | bytes re-sent | "
           "outcome |\n|---|---|---|---|---|---|\n";
  auto cell = [](double v, const char* format) {
    if (v < 0) return std::string("-");
    char buf[64];
    std::snprintf(buf, sizeof buf, format, v);
    return std::string(buf);
  };
  char delta[32];
  std::snprintf(delta, sizeof delta, "%+.4f", loss_delta);
  const std::string row = "| " + scenario + " | " + cell(detect_s, "%.2f") + " | " +
                          cell(recover_s, "%.2f") + " | " + delta + " | " +
                          cell(bytes_resent, "%.0f") + " | " + outcome + " |\n";
  out << row;
  std::printf("fault report: %s", row.c_str());
}

// The fault-free reference: the same job in-process (the multi-process run reproduces it bit
// for bit while no fault happens; launch_test checks that).
inline double reference_val_loss(const fs::path& cfg, const fs::path& dir) {
  const auto r = run_command(std::string(DESLOC_CLI) + " train --no-progress --config " +
                             cfg.string() + " --out-dir " + (dir / "reference").string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const auto v = last_field(dir / "reference" / "metrics.jsonl", "eval", "val_loss");
  EXPECT_TRUE(v.has_value());
  return v.value_or(0.0);
}

struct Job {
  Cluster cluster;
  fs::path cfg;
  std::vector<std::vector<Process>> ranks;  // [site][rank]
  std::vector<std::string> sites;
  int R = 1;
  std::vector<int> site_ranks;  // each site's ranks ([[job.site]] tables; R each when empty)
  std::vector<std::pair<std::string, std::string>> env;  // for every rank of env_site
  std::string env_site;                                  // "" = every site

  Job(const std::string& tag, int ranks_per_site, int site_count, const std::string& extra_job = "",
      std::vector<std::pair<std::string, std::string>> rank_env = {},
      std::string rank_env_site = "", const std::string& extra_sync = "",
      const std::vector<int>& batches = {}, const std::vector<int>& ranks_of_sites = {})
      : cluster{fresh_dir(tag), {}, 0},
        sites(site_names(site_count)),
        R(ranks_per_site),
        site_ranks(ranks_of_sites.empty() ? std::vector<int>(std::size_t(site_count), R)
                                          : ranks_of_sites),
        env(std::move(rank_env)),
        env_site(std::move(rank_env_site)) {
    cfg = write_text(cluster.dir / "job.toml",
                     elastic_toml(cluster.dir / "out", R, site_count, extra_job, extra_sync,
                                  batches, ranks_of_sites));
    start({});
  }
  int S() const { return static_cast<int>(sites.size()); }
  // The sites in ring order but `gone`, as the coordinator lists an epoch's.
  std::string listed_without(const std::string& gone) const {
    std::string out;
    for (const auto& s : sites)
      if (s != gone) out += (out.empty() ? "" : ", ") + s;
    return out;
  }
  // The coordinator and every rank (again, after a whole-job failure, with --resume).
  void start(const std::vector<std::string>& worker_args) {
    cluster.port = 0;
    cluster.start(cfg);
    ranks.clear();
    for (std::size_t i = 0; i < sites.size(); ++i) {
      const std::string& s = sites[i];
      ranks.emplace_back();
      for (int r = 0; r < site_ranks[i]; ++r)
        ranks.back().push_back(cluster.worker(
            cfg, s, r, env_site.empty() || env_site == s ? env : decltype(env){}, worker_args));
    }
  }
  fs::path leader_metrics() const { return cluster.dir / "out" / "metrics.jsonl"; }
  // Blocks until the leader reached `step` (or 120 s passed).
  bool reach(std::int64_t step) const {
    const auto end = Clock::now() + 120s;
    while (Clock::now() < end) {
      if (leader_step(leader_metrics()) >= step) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
  ~Job() {
    for (auto& site : ranks)
      for (auto& p : site)
        if (p.status == -1) p.wait(0ms);  // kills a straggler
    ::kill(cluster.coordinator.pid, SIGTERM);
    cluster.coordinator.wait(10s);
  }
};

// A survivor (site 0 rank 0) finishes every step; returns its final validation loss.
inline double expect_leader_finishes(Job& job) {
  Process& leader = job.ranks[0][0];
  const int status = leader.wait(180s);
  EXPECT_EQ(status, 0) << leader.output();
  EXPECT_EQ(leader_step(job.leader_metrics()), kSteps) << leader.output();
  return last_field(job.leader_metrics(), "eval", "val_loss").value_or(1e9);
}

// Every rank of every site but `skip` (and the leader, which expect_leader_finishes waits for)
// finishes with status 0.
inline void expect_others_finish(Job& job, const std::string& skip = "east") {
  for (std::size_t s = 0; s < job.ranks.size(); ++s)
    for (std::size_t r = 0; r < job.ranks[s].size(); ++r)
      if (job.sites[s] != skip && (s != 0 || r != 0)) {
        EXPECT_EQ(job.ranks[s][r].wait(60s), 0) << job.ranks[s][r].output();
      }
}

// The scenarios that change the world's size, at 2, 3 and 4 sites: each count gives the
// survivors another ring, and 3 or more sites another lane count after a loss.
class FaultSuiteSites : public ::testing::TestWithParam<int> {};

}  // namespace desloc::test
