// Multi-process jobs end to end over loopback: `desloc launch` reproduces the in-process
// `desloc train` of the same config step for step, bit for bit, in every sync mode and shape
// (sites of one or several ranks, alike or not, regions, lanes, codecs, switches). Its faults:
// launch_faults_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cluster_env.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/sync/shard_map.hpp"
#include "desloc/train/checkpoint.hpp"
#include "desloc/transport/ring_order.hpp"
#include "test_env.hpp"

namespace desloc::test {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Loss of site s at every step, from the in-process run's loss_by_site arrays.
std::vector<std::string> site_column(const std::vector<std::string>& arrays, std::size_t s) {
  std::vector<std::string> out;
  for (const auto& a : arrays) {
    std::vector<std::string> items;
    std::stringstream ss(a.substr(1, a.size() - 2));
    for (std::string item; std::getline(ss, item, ',');) items.push_back(item);
    out.push_back(items.at(s));
  }
  return out;
}

// `launch_sync`: [sync] keys only the launched job has (overlap = "step", while the in-process
// reference blocks: the comparison also shows that overlapping changes no number); `both_sync`:
// keys both have. `batches`: each site's batch, in [[job.site]] tables (unequal sites, weighted
// by their tokens), instead of the shorthand.
void expect_launch_matches_train(const std::string& tag, const std::vector<std::string>& sites,
                                 int ranks, const std::string& launch_sync = "",
                                 const std::string& both_sync = "",
                                 const std::string& transport = "", const std::string& job = "",
                                 fs::path* dir_out = nullptr, const std::vector<int>& batches = {},
                                 const std::vector<int>& site_ranks = {}) {
  const fs::path dir = fresh_dir(tag);
  // Each site's ranks ([[job.site]] tables with `batches`; `ranks` each unless given).
  const std::vector<int> R =
      site_ranks.empty() ? std::vector<int>(sites.size(), ranks) : site_ranks;
  const sync::ShardMap map(R);
  int world = 0;
  for (const int r : R) world += r;
  if (dir_out != nullptr) *dir_out = dir;
  std::string names;
  for (const auto& s : sites) names += (names.empty() ? "\"" : ", \"") + s + "\"";
  // 12 steps with kx = 2: x every 2 steps, u every 6, v every 12; the last step syncs all.
  // [transport] is the last table: `transport` lines join it.
  std::string toml = with_steps(multi_site_toml(dir / "launch", names, ranks), 12) + transport;
  toml.replace(toml.find("[job]\n"), 6, "[job]\n" + job);
  // 7 validation batches: the launched ranks share them unevenly (3 ranks: 3, 2, 2; 4: 2, 2,
  // 2, 1), and the losses gathered back must sum to the in-process run's.
  toml.replace(toml.find("eval_batches = 2"), 16, "eval_batches = 7");
  toml.replace(toml.find("[sync]\n"), 7, "[sync]\n" + both_sync);
  if (!batches.empty()) {
    const std::string shorthand =
        "sites = [" + names + "]\nranks_per_site = " + std::to_string(ranks) + "\n";
    toml.erase(toml.find(shorthand), shorthand.size());
    toml.replace(toml.find("\nbatch = 4\n"), 11, "\n");
    for (std::size_t s = 0; s < sites.size(); ++s)
      toml += "[[job.site]]\nname = \"" + sites[s] + "\"\nranks = " + std::to_string(R[s]) +
              "\nbatch = " + std::to_string(batches.at(s)) + "\n";
  }
  const fs::path cfg = write_text(dir / "job.toml", toml);
  std::string launched_toml = toml;
  launched_toml.replace(launched_toml.find("[sync]\n"), 7, "[sync]\n" + launch_sync);
  const fs::path launch_cfg = write_text(dir / "launch.toml", launched_toml);

  const auto reference = run_command(std::string(DESLOC_CLI) + " train --no-progress --config " +
                                     cfg.string() + " --out-dir " + (dir / "train").string());
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const auto launched =
      run_command(std::string(DESLOC_CLI) + " launch --config " + launch_cfg.string());
  ASSERT_EQ(launched.exit_code, 0) << launched.output;
  EXPECT_NE(launched.output.find("all " + std::to_string(world) + " ranks finished"),
            std::string::npos)
      << launched.output;

  // Step for step: every rank's site loss equals the in-process site's, as printed floats
  // that round-trip (%.9g), and the leader's validation losses are equal.
  const auto ref_losses = train_field(dir / "train" / "metrics.jsonl", "loss_by_site");
  // Fragments of x (and of u and v, which take x's count here): each rank encodes its block of
  // every fragment.
  int fragments = 1;
  if (const auto at = both_sync.find("fragments = "); at != std::string::npos)
    fragments = std::stoi(both_sync.substr(at + 12));
  ASSERT_EQ(ref_losses.size(), 12u);
  for (std::size_t s = 0; s < sites.size(); ++s)
    for (int r = 0; r < R[s]; ++r) {
      const fs::path rank_dir =
          s == 0 && r == 0 ? dir / "launch"
                           : dir / "launch" / "ranks" / (sites[s] + "-" + std::to_string(r));
      const auto got = train_field(rank_dir / "metrics.jsonl", "loss_by_site");
      std::vector<std::string> want;
      for (const auto& l : site_column(ref_losses, s)) want.push_back("[" + l + "]");
      EXPECT_EQ(got, want) << sites[s] << "/" << r;

      // The final state of the site: x, u, v and the optimizer step, bit for bit.
      const auto ref = train::load_checkpoint(
          train::checkpoint_path((dir / "train" / "checkpoints").string(), 12));
      const auto mine =
          train::load_checkpoint(train::checkpoint_path((rank_dir / "checkpoints").string(), 12));
      ASSERT_EQ(mine.sites.size(), 1u);
      const auto& a = ref.sites.at(s);
      const auto& b = mine.sites[0];
      const std::size_t bytes = a.params.size() * sizeof(float);
      ASSERT_EQ(b.params.size(), a.params.size());
      EXPECT_EQ(0, std::memcmp(a.params.data(), b.params.data(), bytes))
          << sites[s] << "/" << r << " x";
      EXPECT_EQ(0, std::memcmp(a.u.data(), b.u.data(), bytes)) << sites[s] << "/" << r << " u";
      EXPECT_EQ(0, std::memcmp(a.v.data(), b.v.data(), bytes)) << sites[s] << "/" << r << " v";
      EXPECT_EQ(a.optim_t, b.optim_t);
      if (both_sync.find("codec_x") != std::string::npos) {  // compression took part
        ASSERT_FALSE(ref.codec_ref[0].empty());
        EXPECT_NE(ref.codec_ref[0], ref.sites[0].params);  // x moved on after its last mean
        EXPECT_TRUE(std::any_of(a.codec_feedback[0].begin(), a.codec_feedback[0].end(),
                                [](float e) { return e != 0.0f; }));
      }
      // Compressed states: the shared references whole; the error feedback on the range this
      // rank encodes of each fragment (its segments, sync::ShardMap; the other ranks of its
      // site keep the rest).
      for (std::size_t k = 0; k < 3; ++k) {
        ASSERT_EQ(mine.codec_ref[k].size(), ref.codec_ref[k].size()) << "state " << k;
        EXPECT_TRUE(mine.codec_ref[k] == ref.codec_ref[k])
            << sites[s] << "/" << r << " reference " << k;
        ASSERT_EQ(b.codec_feedback[k].size(), a.codec_feedback[k].size()) << "state " << k;
        for (int f = 0; f < fragments; ++f) {
          const transport::Range part = transport::block(a.codec_feedback[k].size(), fragments, f);
          const transport::Range mine_of = map.owned(part.count, R[s], r);
          const auto lo = std::ptrdiff_t(part.offset + mine_of.offset);
          const auto hi = lo + std::ptrdiff_t(mine_of.count);
          EXPECT_TRUE(std::equal(a.codec_feedback[k].begin() + lo, a.codec_feedback[k].begin() + hi,
                                 b.codec_feedback[k].begin() + lo))
              << sites[s] << "/" << r << " feedback " << k << ", fragment " << f;
        }
      }
    }
  const auto val = train_field(dir / "train" / "metrics.jsonl", "val_loss");
  EXPECT_EQ(val.size(), 2u);  // steps 10 and 12
  EXPECT_EQ(train_field(dir / "launch" / "metrics.jsonl", "val_loss"), val);
  EXPECT_EQ(train_field(dir / "launch" / "metrics.jsonl", "val_bpb"),
            train_field(dir / "train" / "metrics.jsonl", "val_bpb"));
  // Issue 18, item 12: the summaries report the same quantity, site 0's train loss, named.
  auto summary = [](const std::string& out) {
    const auto at = out.find("final train loss ");
    return at == std::string::npos ? std::string("(none)")
                                   : out.substr(at, out.find(", val loss", at) - at);
  };
  EXPECT_EQ(summary(launched.output), summary(reference.output)) << launched.output;
  EXPECT_NE(summary(reference.output).find("(site " + sites[0] + ")"), std::string::npos)
      << reference.output;
}

TEST(Launch, ThreeSitesOfOneRankReproduceTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch3x1", {"west", "east", "north"}, 1);
}

TEST(Launch, TwoSitesOfTwoRanksReproduceTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch2x2", {"west", "east"}, 2);
}

// Issue 17, item 0 (Open MPI): the same job started by `mpirun` (a coordinator, and the four
// workers taking their identity from OMPI_COMM_WORLD_RANK/SIZE) ends bit-identical to `desloc
// launch`: every rank's losses and its final x, u and v.
// Three sites use both wide-area lanes (transport.lanes = 2 by default): half of every shard
// goes round the reversed ring, and the in-process run sums it in that order too.
TEST(Launch, ThreeSitesOfTwoRanksWithBothLanesReproduceTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch3x2", {"west", "east", "north"}, 2);
}

// Hierarchical DES-LOC (issue 15, item 2): x averaged inside each region every step and over
// all four sites every 2 (u: 3 and 6, v: 6 and 12); each region is a ring of its own over its
// sites' rank-r ranks. The launched ranks equal the in-process run bit for bit, blocking and
// with the averages overlapping the step, with one rank per site and with two.
constexpr const char* kRegions = "regions = [[\"west\", \"east\"], [\"north\", \"south\"]]\n";
TEST(Launch, HierarchicalDeslocReproducesTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch4x1_regions", {"west", "east", "north", "south"}, 1, "",
                              "region_kx = 1\n", "", kRegions);
}

TEST(Launch, HierarchicalDeslocOfTwoRanksOverlappingReproducesTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch4x2_regions", {"west", "east", "north", "south"}, 2,
                              "overlap = \"step\"\n", "region_kx = 1\n", "", kRegions);
}

// A region of three sites runs both lanes at the default transport.lanes = 2, as the job-wide
// ring does: half of every shard round the region's reversed ring, summed in that order in one
// process too.
TEST(Launch, ARegionOfThreeSitesWithBothLanesReproducesTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch4x1_region_lanes", {"west", "east", "north", "south"}, 1, "",
                              "region_kx = 1\n", "",
                              "regions = [[\"west\", \"east\", \"north\"], [\"south\"]]\n");
}

// Regions with the slow level compressed (x in int4, u in int8, with error feedback) and the
// outer step on every job-wide average, two ranks per site: the region rings stay fp32, and the
// launched ranks (overlapping each step's averages) equal the blocking in-process run.
TEST(Launch, HierarchicalDeslocWithCodecsAndTheOuterStepReproducesTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch4x2_regions_int4_outer", {"west", "east", "north", "south"}, 2,
                              "overlap = \"step\"\n",
                              "region_kx = 1\ncodec_x = \"int4\"\ncodec_u = \"int8\"\n"
                              "error_feedback = true\nouter = \"nesterov\"\n",
                              "", kRegions);
}

// Every sync feature that composes with regions at once: the job-wide level streams (delayed
// by 1, x in 2 fragments, int4 with error feedback, the outer step at each fragment's fold)
// while the regions average whole fp32 states at the start of their steps; two ranks per site.
TEST(Launch, HierarchicalStreamingDeslocWithEveryFeatureReproducesTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch4x2_regions_streaming", {"west", "east", "north", "south"}, 2,
                              "",
                              "region_kx = 1\noverlap = \"delayed\"\ndelay = 1\nfragments = 2\n"
                              "codec_x = \"int4\"\nerror_feedback = true\nouter = \"nesterov\"\n",
                              "", kRegions);
}

// Capacity-weighted lanes (issue 15, item 3): 70% of every shard round the ring, 30% round the
// reversed ring; the in-process run splits and sums alike.
TEST(Launch, WeightedLanesReproduceTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch3x2_share", {"west", "east", "north"}, 2, "", "",
                              "lane_share = 0.7\n");
}

// Period switches (issue 15, item 5: what a re-plan records, and what `desloc train` replays):
// kx 2 until step 4, then 3 counted from step 4 (x at 7 and 10), then 2 again from step 10.
// The launched ranks switch at the same averages as the in-process run: equal bit for bit.
constexpr const char* kSwitches = "switches = [{ after = 4, kx = 3 }, { after = 10, kx = 2 }]\n";
TEST(Launch, PeriodSwitchesReproduceTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch3x1_switch", {"west", "east", "north"}, 1, "", kSwitches);
  // The switches took effect: the averages fell where they say (u on its own period from 4).
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path metrics = fs::temp_directory_path() /
                           ("desloc_launch3x1_switch_" + std::to_string(::getpid()) + "_" +
                            info->test_suite_name() + "_" + info->name()) /
                           "launch" / "metrics.jsonl";
  EXPECT_EQ(train_field(metrics, "synced"),
            (std::vector<std::string>{"\"\"", "\"x\"", "\"\"", "\"x\"", "\"\"", "\"\"", "\"x\"",
                                      "\"\"", "\"\"", "\"x\"", "\"\"", "\"x\""}));
}

// The launched ranks also run sync.replan (which starts after the configured switches and, at a
// drift of 10^5, decides nothing on loopback): the same bits.
TEST(Launch, TwoSitesOfTwoRanksOverlappingWithPeriodSwitchesReproduceTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch2x2_switch", {"west", "east"}, 2,
                              "overlap = \"step\"\nreplan = true\nreplan_drift = 100000\n",
                              kSwitches);
}

// The same with delayed averages, whose control exchange's wide-area half (the re-planning
// measurements with it) runs on the communication thread and is taken when its batch settles.
TEST(Launch, DelayedAveragesWithPeriodSwitchesAndReplanningReproduceTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch3x1_delayed_switch", {"west", "east", "north"}, 1,
                              "replan = true\nreplan_drift = 100000\n",
                              std::string(kSwitches) + "overlap = \"delayed\"\ndelay = 1\n");
}

// Each site's rank 0 holds, at `step`, the final x, u and v of that site in the in-process
// run in `train_dir`, bit for bit; `rank_dirs[s]` is site s's rank-0 directory. Returns the
// rank checkpoints, for the caller's further checks.
std::vector<train::Checkpoint> expect_sites_equal_the_in_process_run(
    const fs::path& train_dir, const std::vector<fs::path>& rank_dirs,
    const std::vector<std::string>& sites, std::int64_t step) {
  const auto ref =
      train::load_checkpoint(train::checkpoint_path((train_dir / "checkpoints").string(), step));
  std::vector<train::Checkpoint> out;
  for (std::size_t s = 0; s < sites.size(); ++s) {
    out.push_back(train::load_checkpoint(
        train::checkpoint_path((rank_dirs[s] / "checkpoints").string(), step)));
    const auto& mine = out.back();
    EXPECT_EQ(mine.sites.size(), 1u) << sites[s];
    if (mine.sites.size() != 1u) continue;
    const auto& a = ref.sites.at(s);
    const auto& b = mine.sites[0];
    const std::size_t bytes = a.params.size() * sizeof(float);
    EXPECT_EQ(b.params.size(), a.params.size()) << sites[s];
    if (b.params.size() != a.params.size()) continue;
    EXPECT_EQ(0, std::memcmp(a.params.data(), b.params.data(), bytes)) << sites[s] << " x";
    EXPECT_EQ(0, std::memcmp(a.u.data(), b.u.data(), bytes)) << sites[s] << " u";
    EXPECT_EQ(0, std::memcmp(a.v.data(), b.v.data(), bytes)) << sites[s] << " v";
  }
  return out;
}

// Re-planning (issue 15, item 5): a switch decided while training is part of the training
// state. A launched job with sync.replan re-plans after step 4 (injected: every rank decides
// kx 2 -> 3 there, as a drift would make it), and is cut back to its step-8 checkpoints (kx 3
// already in force) and resumed: the ranks keep kx 3 from the checkpoints (x at 10, not at 12)
// and end equal, bit for bit, to `desloc train` replaying the switch from sync.switches.
TEST(Launch, AReplannedSwitchSurvivesAResumeAndMatchesItsReplayBitForBit) {
  const fs::path dir = fresh_dir("replan_resume");
  const std::vector<std::string> sites = {"west", "east", "north"};
  std::string toml =
      with_steps(multi_site_toml(dir / "launch", "\"west\", \"east\", \"north\"", 1), 12);
  toml.replace(toml.find("checkpoint_every = 0"), 20, "checkpoint_every = 4");
  std::string launched = toml;
  // No drift on loopback may decide anything but the injected switch.
  launched.replace(launched.find("[sync]\n"), 7, "[sync]\nreplan = true\nreplan_drift = 100000\n");
  const fs::path launch_cfg = write_text(dir / "launch.toml", launched);
  std::string reference = toml;
  reference.replace(reference.find("[sync]\n"), 7, "[sync]\nswitches = [{ after = 4, kx = 3 }]\n");
  const fs::path train_cfg = write_text(dir / "train.toml", reference);

  ::setenv("DESLOC_INJECT_REPLAN", "4:3", 1);
  const auto first =
      run_command(std::string(DESLOC_CLI) + " launch --config " + launch_cfg.string());
  ::unsetenv("DESLOC_INJECT_REPLAN");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("re-planned after step 4: kx 2 -> 3"), std::string::npos)
      << first.output;
  std::vector<fs::path> rank_dirs = {dir / "launch"};
  for (std::size_t s = 1; s < sites.size(); ++s)
    rank_dirs.push_back(dir / "launch" / "ranks" / (sites[s] + "-0"));
  for (const fs::path& d : rank_dirs) {
    const auto ck = train::load_checkpoint(train::checkpoint_path((d / "checkpoints").string(), 8));
    ASSERT_EQ(ck.switches.size(), 1u) << d;
    EXPECT_EQ(ck.switches[0], (sync::PeriodSwitch{4, 3, 9, 18})) << d;
    fs::remove(train::checkpoint_path((d / "checkpoints").string(), 12));
  }
  const auto resumed =
      run_command(std::string(DESLOC_CLI) + " launch --resume --config " + launch_cfg.string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("trained steps 8..12"), std::string::npos) << resumed.output;
  const auto replay = run_command(std::string(DESLOC_CLI) + " train --no-progress --config " +
                                  train_cfg.string() + " --out-dir " + (dir / "train").string());
  ASSERT_EQ(replay.exit_code, 0) << replay.output;
  EXPECT_EQ(train_field(dir / "launch" / "metrics.jsonl", "synced"),
            (std::vector<std::string>{"\"\"", "\"x\"", "\"\"", "\"x\"", "\"\"", "\"\"", "\"x\"",
                                      "\"\"", "\"\"", "\"x\"", "\"\"", "\"\""}));
  expect_sites_equal_the_in_process_run(dir / "train", rank_dirs, sites, 12);
  // The config's spelling: ku and kv left at 3 and 6 kx.
  const auto ref =
      train::load_checkpoint(train::checkpoint_path((dir / "train" / "checkpoints").string(), 12));
  ASSERT_EQ(ref.switches.size(), 1u);
  EXPECT_EQ(ref.switches[0], (sync::PeriodSwitch{4, 3, 0, 0}));
}

// Re-planning with regions: the job-wide periods switch (injected: kx 2 -> 4 after step 4, with
// u and v at 12 and 24) while the regions keep theirs (1, 3, 6), and every level routes by the
// periods in force. Every site ends equal, bit for bit, to `desloc train` replaying the switch.
TEST(Launch, ARePlannedSwitchWithRegionsMatchesItsReplayBitForBit) {
  const fs::path dir = fresh_dir("replan_regions");
  const std::vector<std::string> sites = {"west", "east", "north", "south"};
  std::string toml = with_steps(
      multi_site_toml(dir / "launch", "\"west\", \"east\", \"north\", \"south\"", 1), 12);
  toml.replace(toml.find("[job]\n"), 6, std::string("[job]\n") + kRegions);
  toml.replace(toml.find("[sync]\n"), 7, "[sync]\nregion_kx = 1\n");
  std::string launched = toml;
  launched.replace(launched.find("[sync]\n"), 7, "[sync]\nreplan = true\nreplan_drift = 100000\n");
  const fs::path launch_cfg = write_text(dir / "launch.toml", launched);
  std::string reference = toml;
  reference.replace(reference.find("[sync]\n"), 7, "[sync]\nswitches = [{ after = 4, kx = 4 }]\n");
  const fs::path train_cfg = write_text(dir / "train.toml", reference);

  ::setenv("DESLOC_INJECT_REPLAN", "4:4", 1);
  const auto run = run_command(std::string(DESLOC_CLI) + " launch --config " + launch_cfg.string());
  ::unsetenv("DESLOC_INJECT_REPLAN");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("re-planned after step 4: kx 2 -> 4"), std::string::npos) << run.output;
  const auto replay = run_command(std::string(DESLOC_CLI) + " train --no-progress --config " +
                                  train_cfg.string() + " --out-dir " + (dir / "train").string());
  ASSERT_EQ(replay.exit_code, 0) << replay.output;
  EXPECT_EQ(train_field(dir / "launch" / "metrics.jsonl", "synced"),
            train_field(dir / "train" / "metrics.jsonl", "synced"));
  // Each level by the periods in force (the byte counts are the run's totals so far): after the
  // switch, step 6 averages inside the regions only (it was job-wide at kx 2) and step 8 over
  // every site.
  for (const fs::path& run : {dir / "launch", dir / "train"}) {
    const auto job_wide = train_field(run / "metrics.jsonl", "bytes_sent");
    const auto region = train_field(run / "metrics.jsonl", "region_bytes_sent");
    ASSERT_EQ(job_wide.size(), 12u) << run;
    ASSERT_EQ(region.size(), 12u) << run;
    EXPECT_NE(job_wide[3], job_wide[2]) << run << ": step 4";
    EXPECT_EQ(job_wide[5], job_wide[4]) << run << ": step 6";
    EXPECT_NE(region[5], region[4]) << run << ": step 6";
    EXPECT_NE(job_wide[7], job_wide[6]) << run << ": step 8";
  }
  std::vector<fs::path> rank_dirs = {dir / "launch"};
  for (std::size_t s = 1; s < sites.size(); ++s)
    rank_dirs.push_back(dir / "launch" / "ranks" / (sites[s] + "-0"));
  for (const auto& mine :
       expect_sites_equal_the_in_process_run(dir / "train", rank_dirs, sites, 12)) {
    ASSERT_EQ(mine.switches.size(), 1u);
    EXPECT_EQ(mine.switches[0], (sync::PeriodSwitch{4, 4, 12, 24}));
  }
}

// The averages of x, u and v run on a communication thread during the forward and backward
// pass (sync.overlap = "step"): still the blocking in-process run, bit for bit, with one rank
// per site and with two (whose intra-site all-gather completes on the main thread).
TEST(Launch, OverlappedAveragesReproduceTheBlockingInProcessRunBitForBit) {
  expect_launch_matches_train("launch3x1_overlap", {"west", "east", "north"}, 1,
                              "overlap = \"step\"\n");
}

TEST(Launch, TwoSitesOfTwoRanksOverlappingReproduceTheBlockingInProcessRunBitForBit) {
  expect_launch_matches_train("launch2x2_overlap", {"west", "east"}, 2, "overlap = \"step\"\n");
}

// Delayed averages (sync.overlap = "delayed"): x folded one step after it started, u four
// steps after (u's average at step 6 is still waiting when x's at step 8 starts), v seven
// (the one started at the last step is drained before the final checkpoint). The launched
// ranks fold the same averages at the same steps as the in-process run: equal bit for bit.
constexpr const char* kDelayedSync = "overlap = \"delayed\"\ndelay = 1\ndelay_u = 4\ndelay_v = 7\n";
TEST(Launch, DelayedAveragesReproduceTheInProcessRunBitForBit) {
  fs::path dir;
  expect_launch_matches_train("launch3x1_delayed", {"west", "east", "north"}, 1, "", kDelayedSync,
                              "", "", &dir);
  // Every step records the process's CPU, and the communication threads' CPU and wall time on
  // the wire grow as their batches end: the last step's totals are positive on every rank, and
  // the control exchanges' share of the wire time is no more than all of it.
  const fs::path out = dir / "launch";
  for (const fs::path& metrics : {out / "metrics.jsonl", out / "ranks" / "east-0" / "metrics.jsonl",
                                  out / "ranks" / "north-0" / "metrics.jsonl"}) {
    const auto cpu = train_field(metrics, "cpu_ms");
    const auto comm = train_field(metrics, "comm_cpu_ms");
    const auto wire = train_field(metrics, "wire_ms");
    const auto control = train_field(metrics, "control_ms");
    ASSERT_EQ(cpu.size(), 12u) << metrics;
    ASSERT_EQ(comm.size(), 12u) << metrics;
    ASSERT_EQ(wire.size(), 12u) << metrics;
    ASSERT_EQ(control.size(), 12u) << metrics;
    EXPECT_TRUE(std::all_of(cpu.begin(), cpu.end(), [](const std::string& c) {
      return std::stod(c) > 0;
    })) << metrics;
    EXPECT_GT(std::stod(comm.back()), 0.0) << metrics;
    EXPECT_GE(std::stod(comm.back()), std::stod(comm.front())) << metrics;
    EXPECT_GT(std::stod(wire.back()), 0.0) << metrics;
    EXPECT_GE(std::stod(wire.back()), std::stod(wire.front())) << metrics;
    // The control exchanges are a part of the wire time, and each takes a round trip at least.
    EXPECT_GT(std::stod(control.back()), 0.0) << metrics;
    EXPECT_LE(std::stod(control.back()), std::stod(wire.back())) << metrics;
  }
}

TEST(Launch, TwoSitesOfTwoRanksWithDelayedAveragesReproduceTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch2x2_delayed", {"west", "east"}, 2, "", kDelayedSync);
}

// Streaming DES-LOC: each state's average cut into two fragments staggered over its period
// (x's fragments on alternate steps, u's three steps apart, v's six), each folded in tau steps
// after it started, so fragments of one state wait for their folds together. The launched
// ranks equal the in-process run bit for bit.
constexpr const char* kStreamingSync =
    "overlap = \"delayed\"\ndelay = 1\ndelay_u = 4\ndelay_v = 7\nfragments = 2\n";
TEST(Launch, StreamingFragmentsReproduceTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch3x1_streaming", {"west", "east", "north"}, 1, "",
                              kStreamingSync);
}

// u and v cut 6 and 12 times (Ku / Kx and Kv / Kx times x's 2): a fragment of every state at
// every step, up to four of u's waiting for their folds at once.
TEST(Launch, TwoSitesOfTwoRanksStreamingFragmentsReproduceTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch2x2_streaming", {"west", "east"}, 2, "",
                              std::string(kStreamingSync) + "fragments_u = 6\nfragments_v = 12\n");
}

// Compressed averages (sync.codec_*, issue 14): every site's difference from the shared
// reference, encoded, all-gathered, decoded and summed in site order, with error feedback.
// x in int8, u in int4, v in int2 (blocks of 32); the launched ranks equal the in-process
// run bit for bit, references and error feedback included.
constexpr const char* kCodecSync =
    "codec_x = \"int8\"\ncodec_u = \"int4\"\ncodec_v = \"int2\"\ncodec_block = 32\n"
    "error_feedback = true\n";
TEST(Launch, CompressedAveragesReproduceTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch3x1_codec", {"west", "east", "north"}, 1, "", kCodecSync);
}

TEST(Launch, TwoSitesOfTwoRanksCompressedAndOverlappedReproduceTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch2x2_codec", {"west", "east"}, 2, "overlap = \"step\"\n",
                              kCodecSync);
}

// Streaming and compressed at once: fragments of every state folded tau steps late, each
// fragment its own block of the references and the feedback.
TEST(Launch, StreamingCompressedFragmentsReproduceTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch3x1_codec_streaming", {"west", "east", "north"}, 1, "",
                              std::string(kStreamingSync) + kCodecSync);
}

// Streaming DiLoCo: the outer Nesterov step on each fragment at its delayed fold. The outer
// state (reference and momentum) is every rank's own copy, stepped at the same folds.
TEST(Launch, StreamingWithTheOuterStepReproducesTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch3x1_outer_streaming", {"west", "east", "north"}, 1, "",
                              std::string(kStreamingSync) + "outer = \"nesterov\"\n");
}
TEST(Launch, TwoSitesOfTwoRanksStreamingWithTheOuterStepReproduceTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch2x2_outer_streaming", {"west", "east"}, 2, "",
                              std::string(kStreamingSync) + "outer = \"nesterov\"\n");
}

// Unequal sites (issue 38): [[job.site]] tables give the sites batches of 2, 5 and 3 sequences
// per rank, and every average weighs each site by its tokens. The launched ranks scale their
// shards as the in-process averager scales its replicas: equal bit for bit, blocking against
// step-overlapped with int4 + error feedback, delayed streaming fragments with int4 + error
// feedback and the outer step, and two ranks a site.
TEST(Launch, UnequalBatchesOverlappedAndCompressedReproduceTheInProcessRunBitForBit) {
  fs::path dir;
  expect_launch_matches_train("launch3x1_unequal_codec", {"west", "east", "north"}, 1,
                              "overlap = \"step\"\n",
                              "codec_x = \"int4\"\ncodec_u = \"int4\"\ncodec_v = \"int4\"\n"
                              "codec_block = 32\nerror_feedback = true\n",
                              "", "", &dir, {2, 5, 3});
  // Each average's control exchange says how long every site waited there for the slowest
  // (its compute since the exchange before, less theirs): every rank records the same three
  // figures, one of them 0, at the 6 steps with averages (x every 2 of 12 steps).
  std::vector<std::string> seen;
  for (const fs::path& metrics :
       {dir / "launch" / "metrics.jsonl", dir / "launch" / "ranks" / "north-0" / "metrics.jsonl"}) {
    std::vector<std::string> waits;
    for (const std::string& w : train_field(metrics, "wait_ms_by_site"))
      if (w != "[]") waits.push_back(w);
    ASSERT_EQ(waits.size(), 6u) << metrics;
    for (const std::string& w : waits) {
      std::vector<double> ms;
      std::stringstream in(w.substr(1, w.size() - 2));
      for (std::string item; std::getline(in, item, ',');) ms.push_back(std::stod(item));
      ASSERT_EQ(ms.size(), 3u) << w;
      EXPECT_EQ(*std::min_element(ms.begin(), ms.end()), 0.0) << w;
    }
    if (!seen.empty()) {
      EXPECT_EQ(waits, seen) << metrics;
    }
    seen = waits;
  }
}
TEST(Launch, UnequalBatchesStreamingCompressedWithTheOuterStepReproduceTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch3x1_unequal_streaming", {"west", "east", "north"}, 1, "",
                              std::string(kStreamingSync) + kCodecSync + "outer = \"nesterov\"\n",
                              "", "", nullptr, {2, 5, 3});
}
// Regions of unequal sites: each region weighs its own sites by their tokens (the region of
// three on both lanes), while the job-wide level streams (delayed, 2 fragments, int4 + error
// feedback, the outer step at each fold).
TEST(Launch, StreamingRegionsOfUnequalBatchesReproduceTheInProcessRunBitForBit) {
  expect_launch_matches_train(
      "launch4x1_regions_unequal", {"west", "east", "north", "south"}, 1, "",
      "region_kx = 1\noverlap = \"delayed\"\ndelay = 1\nfragments = 2\n"
      "codec_x = \"int4\"\nerror_feedback = true\nouter = \"nesterov\"\n",
      "", "regions = [[\"west\", \"east\", \"north\"], [\"south\"]]\n", nullptr, {2, 5, 3, 4});
}
TEST(Launch, TwoSitesOfTwoRanksWithUnequalBatchesReproduceTheInProcessRunBitForBit) {
  expect_launch_matches_train("launch2x2_unequal", {"west", "east"}, 2, "", kDelayedSync, "", "",
                              nullptr, {4, 1});
}

// Sites of unequal rank counts (1, 2 and 3 ranks; batches 3, 2 and 4): the wide-area shard
// map cuts each state into segments, and a rank of a site with fewer ranks runs the rings of
// several of them, one after the other. The launched ranks equal the in-process run bit for
// bit: blocking in fp32 (2, 3 and 1 ranks); blocking against step-overlapped with int4 + error
// feedback; delayed streaming
// fragments with int4 + error feedback and the outer step; regions of sites of 3 and 1 ranks
// and of 2 and 1, the job-wide ring of four on both lanes.
TEST(Launch, SitesOfTwoThreeAndOneRanksBlockingReproduceTheInProcessRun) {
  expect_launch_matches_train("launch231", {"west", "east", "north"}, 1, "", "", "", "", nullptr,
                              {4, 2, 3}, {2, 3, 1});
}
TEST(Launch, SitesOfOneTwoAndThreeRanksOverlappedAndCompressedReproduceTheInProcessRun) {
  expect_launch_matches_train("launch123_codec", {"west", "east", "north"}, 1,
                              "overlap = \"step\"\n",
                              "codec_x = \"int4\"\ncodec_u = \"int4\"\ncodec_v = \"int4\"\n"
                              "codec_block = 32\nerror_feedback = true\n",
                              "", "", nullptr, {3, 2, 4}, {1, 2, 3});
}
TEST(Launch, SitesOfThreeOneAndTwoRanksStreamingWithTheOuterStepReproduceTheInProcessRun) {
  expect_launch_matches_train("launch312_streaming", {"west", "east", "north"}, 1, "",
                              std::string(kStreamingSync) + kCodecSync + "outer = \"nesterov\"\n",
                              "", "", nullptr, {2, 5, 3}, {3, 1, 2});
}
TEST(Launch, RegionsOfSitesWithUnequalRankCountsReproduceTheInProcessRun) {
  expect_launch_matches_train("launch4_regions_ranks", {"west", "east", "north", "south"}, 1, "",
                              "region_kx = 1\noverlap = \"delayed\"\ndelay = 1\n", "",
                              "regions = [[\"west\", \"east\"], [\"north\", \"south\"]]\n", nullptr,
                              {2, 3, 2, 4}, {3, 1, 2, 1});
}

// `desloc profile` of sites of unequal rank counts (west 3 ranks, east 1): rank 0 of each site
// measures the links over segment 0's ring while the other ranks time their step and say Bye,
// so none of them leaving is a loss, and the topology records each site's step and batch.
TEST(Launch, ProfileOfSitesOfUnequalRankCountsMeasuresEverySite) {
  const fs::path dir = fresh_dir("profile_unequal");
  std::string toml = multi_site_toml(dir / "out", "\"west\", \"east\"", 1);
  const std::string shorthand = "sites = [\"west\", \"east\"]\nranks_per_site = 1\n";
  toml.erase(toml.find(shorthand), shorthand.size());
  toml.replace(toml.find("\nbatch = 4\n"), 11, "\n");
  toml +=
      "[[job.site]]\nname = \"west\"\nranks = 3\nbatch = 6\n"
      "[[job.site]]\nname = \"east\"\nranks = 1\nbatch = 2\n";
  const fs::path cfg = write_text(dir / "job.toml", toml);
  const auto profiled = run_command(std::string(DESLOC_CLI) + " profile --config " + cfg.string() +
                                    " --out " + (dir / "topology.toml").string());
  ASSERT_EQ(profiled.exit_code, 0) << profiled.output;
  EXPECT_EQ(profiled.output.find("disconnected"), std::string::npos) << profiled.output;
  std::ifstream in(dir / "topology.toml");
  const std::string topology((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  for (const char* want :
       {"name = \"west\"", "name = \"east\"", "batch = 6", "batch = 2", "[[link]]"})
    EXPECT_NE(topology.find(want), std::string::npos) << want << "\n" << topology;
}

}  // namespace
}  // namespace desloc::test
