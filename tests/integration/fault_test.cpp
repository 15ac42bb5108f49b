// The fault-injection suite: each scenario runs a real multi-process job over loopback
// (`desloc coordinator` plus one `desloc worker` per rank), injects one fault, and asserts that
//   1. the job finishes, or stops with its designed error, inside its deadline, and
//   2. the survivors' final validation loss is within kLossTolerance of the fault-free
//      in-process run of the same config.
// Each scenario also appends a row to <build>/fault_report.md: detection time (the fault until a
// survivor hears the epoch closed), recovery time (until it rolled back in the next epoch),
// the loss delta and the wide-area bytes re-sent by the replay.
#include "fault_env.hpp"

namespace desloc::test {
namespace {

using namespace std::chrono_literals;

INSTANTIATE_TEST_SUITE_P(Sites, FaultSuiteSites, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "Sites"; });

TEST_P(FaultSuiteSites, SiteKilledMidRunIsDroppedAndTheSurvivorsFinish) {
  const int S = GetParam();
  Job job("kill_site_" + std::to_string(S), 1, S);
  ASSERT_TRUE(job.reach(kSteps / 3)) << job.ranks[0][0].output();
  const auto killed_at = Clock::now();
  ::kill(job.ranks[1][0].pid, SIGKILL);
  EXPECT_EQ(job.ranks[1][0].wait(5s), 128 + SIGKILL);
  const auto heard = wait_for_text(job.ranks[0][0], "closed membership epoch 1", 10s);
  const auto rolled = wait_for_text(job.ranks[0][0], "rolled back to step", 30s);
  ASSERT_TRUE(heard && rolled) << job.ranks[0][0].output();
  const double val = expect_leader_finishes(job);
  expect_others_finish(job);
  EXPECT_NE(job.cluster.coordinator.output().find("opening membership epoch 2 with " +
                                                  std::to_string(S - 1) + " site(s) [" +
                                                  job.listed_without("east") + "]"),
            std::string::npos)
      << job.cluster.coordinator.output();
  const double ref = reference_val_loss(job.cfg, job.cluster.dir);
  EXPECT_NEAR(val, ref, kLossTolerance);
  EXPECT_LT(seconds(killed_at, *heard), 2.0);  // a killed process closes its sockets at once
  report_row("kill -9 a site (" + shape(S, 1) + ")", seconds(killed_at, *heard),
             seconds(killed_at, *rolled), val - ref,
             last_field(job.leader_metrics(), "recovery", "bytes_resent").value_or(-1),
             "dropped east, finished on " + std::to_string(S - 1) + " site(s)");
}

// east (site 1 of 3, one rank each) is killed a third of the way in; west and north roll back,
// go on without it and finish near the fault-free run. A row of the fault report.
void expect_the_others_finish_without_east(Job& job, const std::string& scenario,
                                           const std::string& outcome) {
  ASSERT_TRUE(job.reach(kSteps / 3)) << job.ranks[0][0].output();
  ::kill(job.ranks[1][0].pid, SIGKILL);
  EXPECT_EQ(job.ranks[1][0].wait(5s), 128 + SIGKILL);
  ASSERT_TRUE(wait_for_text(job.ranks[0][0], "rolled back to step", 30s))
      << job.ranks[0][0].output();
  const double val = expect_leader_finishes(job);
  EXPECT_EQ(job.ranks[2][0].wait(60s), 0) << job.ranks[2][0].output();
  const double ref = reference_val_loss(job.cfg, job.cluster.dir);
  EXPECT_NEAR(val, ref, kLossTolerance);
  report_row(scenario, -1, -1, val - ref,
             last_field(job.leader_metrics(), "recovery", "bytes_resent").value_or(-1), outcome);
}

// Hierarchical DES-LOC (issue 15, item 2): regions [west, east] and [north], x averaged inside
// a region every 2 steps and over all sites every 4. east dies; west is left alone in its
// region: the survivors' new epoch rebuilds the region rings from the live sites, and both
// finish, near the fault-free run.
constexpr const char* kRegionsJob = "regions = [[\"west\", \"east\"], [\"north\"]]\n";
TEST(FaultSuite, SiteKilledInsideARegionIsDroppedAndTheSurvivorsFinish) {
  Job job("kill_region", 1, 3, kRegionsJob, {}, "", "region_kx = 2\n");
  expect_the_others_finish_without_east(
      job, "kill -9 a site of a 2-site region (regions [west, east] [north], region_kx 2)",
      "dropped east, west alone in its region, finished on 2 sites");
}

// One region of three sites runs both lanes at the default transport.lanes = 2 (a reversed
// region ring beside the region ring). east dies: the survivors' epoch rebuilds the region from
// west and north alone, on one lane, and both finish near the fault-free run.
TEST(FaultSuite, SiteKilledInARegionOfThreeWithBothLanesIsDroppedAndTheSurvivorsFinish) {
  Job job("kill_region_lanes", 1, 3, "regions = [[\"west\", \"east\", \"north\"]]\n", {}, "",
          "region_kx = 2\n");
  expect_the_others_finish_without_east(
      job, "kill -9 a site of a 3-site region with both lanes (region [west, east, north])",
      "dropped east, the region's ring rebuilt on one lane, finished on 2 sites");
}

// The same loss while the job-wide level streams (delayed by 1, x in 2 fragments, int4 with
// error feedback) and the regions average at the start of their steps: the job-wide batch in
// flight when east dies is dropped with the epoch, and the survivors finish near the fault-free
// run.
TEST(FaultSuite, SiteKilledInsideARegionWhileTheJobWideAveragesStreamIsDropped) {
  Job job("kill_region_streaming", 1, 3, kRegionsJob, {}, "",
          "region_kx = 2\noverlap = \"delayed\"\ndelay = 1\nfragments = 2\ncodec_x = \"int4\"\n"
          "error_feedback = true\n");
  expect_the_others_finish_without_east(
      job,
      "kill -9 a site of a 2-site region while the job-wide averages stream (delayed, 2 "
      "fragments, int4 + EF)",
      "dropped east, west alone in its region, finished on 2 sites");
}

// east dies halfway through its region's ring at a step only the regions average (602: x is
// due every 2 steps inside regions, every 4 over all sites): west's partial region sum is
// never applied. The survivors roll back to the point kept before the last job-wide average
// (step 600): only those are held by every survivor, since north, alone in its region, may
// run up to a job-wide period ahead of west.
TEST(FaultSuite, SiteDyingHalfwayThroughARegionAverageIsSurvived) {
  Job job("mid_region", 1, 3, kRegionsJob, {{"DESLOC_INJECT_CRASH", "east:602:x"}}, "",
          "region_kx = 2\n");
  Process& east = job.ranks[1][0];
  EXPECT_EQ(east.wait(120s), 128 + SIGKILL) << east.output();
  EXPECT_NE(east.output().find("killing this process halfway through all_reduce"),
            std::string::npos)
      << east.output();
  ASSERT_TRUE(wait_for_text(job.ranks[0][0], "rolled back to step", 30s))
      << job.ranks[0][0].output();
  const double val = expect_leader_finishes(job);
  EXPECT_EQ(job.ranks[2][0].wait(60s), 0) << job.ranks[2][0].output();
  EXPECT_EQ(last_field(job.leader_metrics(), "recovery", "step").value_or(-1), 599.0);
  const double ref = reference_val_loss(job.cfg, job.cluster.dir);
  EXPECT_NEAR(val, ref, kLossTolerance);
  report_row(
      "every rank of a site dies halfway through its region's x average (regions [west, "
      "east] [north])",
      -1, -1, val - ref, last_field(job.leader_metrics(), "recovery", "bytes_resent").value_or(-1),
      "partial region average discarded, rolled back to step 599, finished on 2 sites");
}

// Every rank of east kills itself halfway through its wide-area ring of one average: the
// others hold a partial sum that must never be applied.
// `sync`: extra [sync] keys (delayed averages: the death happens on the communication thread
// while the step goes on, and surfaces at the fold or at the next epoch's notice).
// `latest_rollback`: with averages in flight across steps the failure may surface only when the
// next step that talks across sites settles the wire, so the survivors may roll back to the
// rollback point kept before that step (0: exactly the point before `step`).
void expect_death_mid_average_is_survived(const std::string& state, std::int64_t step, int R, int S,
                                          const std::string& sync = "",
                                          std::int64_t latest_rollback = 0) {
  Job job("mid_" + state + "_" + std::to_string(S) + "x" + std::to_string(R) +
              (sync.empty() ? "" : "_delayed"),
          R, S, "", {{"DESLOC_INJECT_CRASH", "east:" + std::to_string(step) + ":" + state}}, "",
          sync);
  for (int r = 0; r < R; ++r) {
    Process& p = job.ranks[1][std::size_t(r)];
    EXPECT_EQ(p.wait(120s), 128 + SIGKILL) << p.output();
    EXPECT_NE(p.output().find("killing this process halfway through all_reduce"), std::string::npos)
        << p.output();
  }
  const auto rolled = wait_for_text(job.ranks[0][0], "rolled back to step", 30s);
  ASSERT_TRUE(rolled.has_value()) << job.ranks[0][0].output();
  const double val = expect_leader_finishes(job);
  expect_others_finish(job);
  // The rollback point is the snapshot before that step (or one kept later, before the partial
  // average could be folded): the partial average was discarded.
  const double rolled_to = last_field(job.leader_metrics(), "recovery", "step").value_or(-1);
  if (latest_rollback == 0) {
    EXPECT_EQ(rolled_to, double(step - 1));
  } else {
    EXPECT_GE(rolled_to, double(step - 1));
    EXPECT_LE(rolled_to, double(latest_rollback));
  }
  const double ref = reference_val_loss(job.cfg, job.cluster.dir);
  EXPECT_NEAR(val, ref, kLossTolerance);
  report_row("every rank of a site dies halfway through its " + state +
                 (sync.empty()                                  ? ""
                  : sync.find("fragments") != std::string::npos ? " fragment (streaming)"
                                                                : " delayed") +
                 " average (" + shape(S, R) + ")",
             -1, -1, val - ref,
             last_field(job.leader_metrics(), "recovery", "bytes_resent").value_or(-1),
             "partial average discarded, rolled back to step " +
                 std::to_string(static_cast<std::int64_t>(rolled_to)) + ", finished on " +
                 std::to_string(S - 1) + " site(s)");
}

// kx = 4, so x is due every 4 steps, u every 12 and v every 24.
TEST_P(FaultSuiteSites, SiteDyingHalfwayThroughAnXAverageIsSurvived) {
  expect_death_mid_average_is_survived("x", 404, 1, GetParam());
}
TEST(FaultSuite, SiteDyingHalfwayThroughAUAverageIsSurvived) {
  expect_death_mid_average_is_survived("u", 396, 1, 3);
}
TEST(FaultSuite, SiteDyingHalfwayThroughAVAverageIsSurvivedOnEveryShardAndLane) {
  expect_death_mid_average_is_survived("v", 384, 2, 3);
}

// Delayed averages (tau = 3): at step 384 x, u and v start together and travel while the
// sites take steps 384..386; east dies halfway through v's ring. No fold of that batch may be
// applied: the survivors roll back to the state before step 384 and go on in the next epoch.
TEST(FaultSuite, SiteDyingHalfwayThroughADelayedAverageInFlightIsSurvivedOnEveryShardAndLane) {
  expect_death_mid_average_is_survived("v", 384, 2, 3, "overlap = \"delayed\"\ndelay = 3\n");
}

// Streaming (two fragments per state, tau = 3): x's fragments start every 2 steps, so at step
// 386 fragment 1 of x goes on the wire while fragment 0, started at step 384, waits for its
// fold at step 387. East dies halfway through fragment 1's ring. The partial fragment is never
// folded: the survivors roll back to the point kept before step 386 (fragment 0 in flight is
// dropped with it) or, when the failure surfaces only as step 388 settles the wire, to the one
// kept before step 388 (fragment 0 folded, fragment 1 never), and go on in the next epoch.
TEST(FaultSuite, SiteDyingHalfwayThroughAFragmentWhileAnotherAwaitsItsFoldIsSurvived) {
  expect_death_mid_average_is_survived("x", 386, 2, 3,
                                       "overlap = \"delayed\"\ndelay = 3\nfragments = 2\n", 387);
}

TEST(FaultSuite, OneRankKilledTakesItsSiteOutAndTheOthersFinishOnBothLanes) {
  Job job("kill_rank", 2, 3);
  ASSERT_TRUE(job.reach(kSteps / 3)) << job.ranks[0][0].output();
  const auto killed_at = Clock::now();
  ::kill(job.ranks[1][1].pid, SIGKILL);  // east/1 only
  const auto heard = wait_for_text(job.ranks[0][0], "closed membership epoch 1", 10s);
  const auto rolled = wait_for_text(job.ranks[0][0], "rolled back to step", 30s);
  ASSERT_TRUE(heard && rolled) << job.ranks[0][0].output();
  // east/0 lost its site: it leaves with an error saying so, within its deadline.
  const int east0 = job.ranks[1][0].wait(30s);
  EXPECT_NE(east0, 0) << job.ranks[1][0].output();
  EXPECT_NE(east0, -1) << "east/0 hung: " << job.ranks[1][0].output();
  EXPECT_NE(job.ranks[1][0].output().find("site east was dropped from the job at epoch 2"),
            std::string::npos)
      << job.ranks[1][0].output();
  const double val = expect_leader_finishes(job);
  for (auto* p : {&job.ranks[0][1], &job.ranks[2][0], &job.ranks[2][1]})
    EXPECT_EQ(p->wait(60s), 0) << p->output();
  const double ref = reference_val_loss(job.cfg, job.cluster.dir);
  EXPECT_NEAR(val, ref, kLossTolerance);
  report_row("kill -9 one rank of a site (3 sites x 2 ranks, 2 lanes)", seconds(killed_at, *heard),
             seconds(killed_at, *rolled), val - ref,
             last_field(job.leader_metrics(), "recovery", "bytes_resent").value_or(-1),
             "dropped east, finished on 2 sites");
}

TEST(FaultSuite, FrozenSiteIsDroppedAfterTheHeartbeatTimeoutAndLeavesWhenItWakes) {
  Job job("freeze_site", 1, 3);
  ASSERT_TRUE(job.reach(kSteps / 3)) << job.ranks[0][0].output();
  const auto frozen_at = Clock::now();
  ::kill(job.ranks[2][0].pid, SIGSTOP);  // north: alive but silent, like a hung host
  const auto heard = wait_for_text(job.ranks[0][0], "closed membership epoch 1", 15s);
  const auto rolled = wait_for_text(job.ranks[0][0], "rolled back to step", 30s);
  ASSERT_TRUE(heard && rolled) << job.ranks[0][0].output();
  // Detected by the coordinator's heartbeat timeout (1.5 s), not by a collective's deadline.
  EXPECT_LT(seconds(frozen_at, *heard), 1.5 + 2.0);
  ::kill(job.ranks[2][0].pid, SIGCONT);
  const int north = job.ranks[2][0].wait(30s);
  EXPECT_NE(north, 0) << job.ranks[2][0].output();
  EXPECT_NE(north, -1) << "north hung after waking: " << job.ranks[2][0].output();
  EXPECT_NE(job.ranks[2][0].output().find("dropped from the job at epoch 2"), std::string::npos)
      << job.ranks[2][0].output();
  const double val = expect_leader_finishes(job);
  EXPECT_EQ(job.ranks[1][0].wait(60s), 0) << job.ranks[1][0].output();
  const double ref = reference_val_loss(job.cfg, job.cluster.dir);
  EXPECT_NEAR(val, ref, kLossTolerance);
  report_row("SIGSTOP a site (silent past the heartbeat timeout)", seconds(frozen_at, *heard),
             seconds(frozen_at, *rolled), val - ref,
             last_field(job.leader_metrics(), "recovery", "bytes_resent").value_or(-1),
             "dropped north, finished on 2 sites");
}

// Every rank of east dies right after it received membership epoch 1, before anyone took a
// step ($DESLOC_INJECT_CRASH = east:membership). The survivors hold nothing but their start
// state, which they share as step 0, and the next epoch starts there without east. (Once the
// job ended instead: "the survivors share no rollback step", or a survivor died connecting
// its groups to the dead site.)
void expect_death_at_the_first_membership_is_survived(int R, int S) {
  Job job("die_at_membership_" + std::to_string(S) + "x" + std::to_string(R), R, S, "",
          {{"DESLOC_INJECT_CRASH", "east:membership"}}, "east");
  for (int r = 0; r < R; ++r) {
    Process& p = job.ranks[1][std::size_t(r)];
    EXPECT_EQ(p.wait(60s), 9) << p.output();
    EXPECT_NE(p.output().find("fault injection: site east dies right after membership epoch 1"),
              std::string::npos)
        << p.output();
  }
  const double val = expect_leader_finishes(job);
  expect_others_finish(job);
  const std::string coordinator = job.cluster.coordinator.output();
  EXPECT_NE(coordinator.find("opening membership epoch 2 with " + std::to_string(S - 1) +
                             " site(s) [" + job.listed_without("east") + "], resuming from step 0"),
            std::string::npos)
      << coordinator;
  const double ref = reference_val_loss(job.cfg, job.cluster.dir);
  // One site alone (of two) sees half the data for the whole run.
  if (S > 2) {
    EXPECT_NEAR(val, ref, kLossToleranceWithoutASiteFromTheStart);
  }
  report_row("every rank of a site dies right after membership epoch 1 (" + shape(S, R) + ")", -1,
             -1, val - ref, -1,
             "started from step 0 without east, finished on " + std::to_string(S - 1) + " site(s)");
}

TEST_P(FaultSuiteSites, SiteDyingRightAfterTheFirstMembershipIsDroppedAndTheOthersStartWithoutIt) {
  expect_death_at_the_first_membership_is_survived(1, GetParam());
}
TEST(FaultSuite, SiteDyingRightAfterTheFirstMembershipIsSurvivedOnEveryShardAndLane) {
  expect_death_at_the_first_membership_is_survived(2, 3);
}

// `desloc launch` with one site frozen (SIGSTOP) mid-run: the coordinator drops it after the
// heartbeat timeout and the survivors finish. Launch must then end the frozen ranks itself and
// exit 0 (the job finished without that site), not wait for them forever.
TEST(FaultSuite, LaunchEndsTheRanksOfAFrozenSiteItDroppedAndExits) {
  const fs::path dir = fresh_dir("launch_freeze");
  const fs::path cfg = write_text(dir / "job.toml", elastic_toml(dir / "out", 1, 3, ""));
  Process launch = Process::start({DESLOC_CLI, "launch", "--config", cfg.string(), "--quiet"},
                                  dir / "launch.log");
  const fs::path metrics = dir / "out" / "metrics.jsonl";
  const auto end = Clock::now() + 120s;
  while (Clock::now() < end && leader_step(metrics) < kSteps / 3) std::this_thread::sleep_for(20ms);
  ASSERT_GE(leader_step(metrics), kSteps / 3) << launch.output();
  const pid_t north = child_with_argument(launch.pid, "north");
  ASSERT_GT(north, 0) << launch.output();
  const auto frozen_at = Clock::now();
  ::kill(north, SIGSTOP);
  // The survivors need seconds for the rest of the run; launch then has its grace period.
  const int status = launch.wait(150s);
  if (status == -1) ::kill(north, SIGKILL);  // the watchdog fired: leave nothing frozen behind
  EXPECT_EQ(status, 0) << "launch hung after dropping a frozen site:\n" << launch.output();
  const std::string out = launch.output();
  EXPECT_NE(out.find("the job finished without site(s): north"), std::string::npos) << out;
  EXPECT_NE(out.find("stopping rank north/0"), std::string::npos) << out;
  EXPECT_EQ(leader_step(metrics), kSteps) << out;
  // Launch reaped it: no process of that id is left.
  EXPECT_NE(::kill(north, 0), 0);
  report_row("desloc launch, SIGSTOP a site: launch ends it once dropped", -1,
             seconds(frozen_at, Clock::now()), 0.0, -1,
             "dropped north, killed it, launch exited 0");
}

TEST(FaultSuite, BelowTheMinimumSiteCountTheJobEndsWithTheReason) {
  Job job("min_sites", 1, 3, "min_sites = 3\n");
  ASSERT_TRUE(job.reach(kSteps / 3)) << job.ranks[0][0].output();
  const auto killed_at = Clock::now();
  ::kill(job.ranks[1][0].pid, SIGKILL);
  for (auto* p : {&job.ranks[0][0], &job.ranks[2][0]}) {
    const int status = p->wait(30s);
    EXPECT_NE(status, 0) << p->output();
    EXPECT_NE(status, -1) << "a survivor hung: " << p->output();
    EXPECT_NE(p->output().find("below the job's minimum of 3"), std::string::npos) << p->output();
  }
  report_row("kill -9 a site with job.min_sites = 3", -1, seconds(killed_at, Clock::now()), 0.0, -1,
             "stopped with the designed error");
}

// Every site is lost (all ranks killed): the coordinator's recovery drops them all and ends the
// job. It must exit non-zero with the reason, not take an empty list of ranks as "every rank
// finished" (the status desloc.sbatch hands to the scheduler).
TEST(FaultSuite, AJobThatLostEverySiteEndsWithAFailureNotASuccess) {
  Job job("lose_all", 1, 3);
  ASSERT_TRUE(job.reach(kSteps / 5)) << job.ranks[0][0].output();
  for (auto& site : job.ranks) ::kill(site[0].pid, SIGKILL);
  for (auto& site : job.ranks) site[0].wait(5s);
  const int status = job.cluster.coordinator.wait(30s);
  const std::string out = job.cluster.coordinator.output();
  EXPECT_EQ(status, 1) << out;
  EXPECT_EQ(out.find("finished"), std::string::npos) << out;
  EXPECT_NE(out.find("the job ended at membership epoch 2"), std::string::npos) << out;
  report_row("kill -9 every site", -1, -1, 0.0, -1, "coordinator exited 1: the job ended");
}

// The whole job stops for longer than the heartbeat timeout and the collectives' deadline (a
// host suspend, a VM freeze: SIGSTOP of every process, coordinator first, for 8 s), then goes
// on. Nobody was silent while the coordinator could see: the coordinator tells its own pause
// from the ranks' silence, the ranks' waits tell theirs from a peer's, and the job finishes on
// every site in its first epoch, bit for bit the fault-free run.
TEST(FaultSuite, AWholeJobPausedPastEveryTimeoutGoesOnInTheSameEpoch) {
  Job job("pause_all", 1, 3);
  ASSERT_TRUE(job.reach(kSteps / 3)) << job.ranks[0][0].output();
  ::kill(job.cluster.coordinator.pid, SIGSTOP);
  for (auto& site : job.ranks) ::kill(site[0].pid, SIGSTOP);
  std::this_thread::sleep_for(8s);
  ::kill(job.cluster.coordinator.pid, SIGCONT);
  for (auto& site : job.ranks) ::kill(site[0].pid, SIGCONT);
  const double val = expect_leader_finishes(job);
  expect_others_finish(job, "");
  EXPECT_EQ(job.cluster.coordinator.wait(30s), 0) << job.cluster.coordinator.output();
  const std::string out = job.cluster.coordinator.output();
  EXPECT_NE(out.find("this coordinator did not run for"), std::string::npos) << out;
  EXPECT_EQ(out.find("closing membership epoch"), std::string::npos) << out;
  EXPECT_EQ(val, reference_val_loss(job.cfg, job.cluster.dir));
  report_row("SIGSTOP the whole job for 8 s (coordinator and every rank)", -1, -1, 0.0, 0.0,
             "no epoch closed; finished on 3 sites bit-exact");
}

// The leader's site (west, site 0) dies: the first live site's rank 0 evaluates from then on,
// in its own directory, and says so; `desloc sample` on the run directory uses the sites that
// ran to the end, not the dropped leader's last checkpoint.
TEST(FaultSuite, AfterTheLeadersSiteIsLostItsSuccessorReportsItsOwnMetricsAndTheRunSamples) {
  Job job("lose_leader", 1, 3);
  ASSERT_TRUE(job.reach(kSteps / 3)) << job.ranks[0][0].output();
  ::kill(job.ranks[0][0].pid, SIGKILL);
  EXPECT_EQ(job.ranks[0][0].wait(5s), 128 + SIGKILL);
  Process& east = job.ranks[1][0];
  EXPECT_EQ(east.wait(180s), 0) << east.output();
  EXPECT_EQ(job.ranks[2][0].wait(60s), 0) << job.ranks[2][0].output();
  const fs::path own = job.cluster.dir / "out" / "ranks" / "east-0" / "metrics.jsonl";
  EXPECT_NE(east.output().find("metrics: " + own.string()), std::string::npos) << east.output();
  ASSERT_TRUE(last_field(own, "eval", "val_loss").has_value());
  EXPECT_EQ(last_field(own, "eval", "step").value_or(0), kSteps);
  const auto sample =
      run_command(std::string(DESLOC_CLI) + " sample --checkpoint " +
                  (job.cluster.dir / "out").string() + " --prompt 'The ' --tokens 8");
  EXPECT_EQ(sample.exit_code, 0) << sample.output;
  EXPECT_NE(sample.output.find("step " + std::to_string(kSteps) + ", the mean of 2 sites"),
            std::string::npos)
      << sample.output;
  EXPECT_NE(sample.output.find("its site was dropped from the run"), std::string::npos)
      << sample.output;
  report_row("kill -9 the leader's site", -1, -1, 0.0, -1,
             "east/0 evaluated on in ranks/east-0; sample used the 2 surviving sites");
}

// A site restarted with data it cannot read fails before it registers: the job never takes it
// into an epoch, and the survivors do not recover twice more for it.
TEST(FaultSuite, ARestartedRankWithBadDataFailsBeforeItRegisters) {
  Job job("bad_data_rejoin", 1, 3);
  ASSERT_TRUE(job.reach(kSteps / 4)) << job.ranks[0][0].output();
  ::kill(job.ranks[1][0].pid, SIGKILL);
  job.ranks[1][0].wait(5s);
  ASSERT_TRUE(wait_for_text(job.ranks[0][0], "rolled back to step", 30s).has_value());
  // The same job (data.dir is each process's own) over a copy of the data with a shard cut
  // short.
  const fs::path bad = job.cluster.dir / "bad_data";
  fs::copy(DESLOC_TEST_BROWN, bad, fs::copy_options::recursive);
  for (const auto& e : fs::directory_iterator(bad))
    if (e.path().extension() == ".bin") fs::resize_file(e.path(), fs::file_size(e.path()) / 2);
  std::string toml = read_text(job.cfg);
  const auto at = toml.find("dir = ");
  toml.replace(at, toml.find('\n', at) - at, "dir = \"" + bad.string() + "\"");
  const fs::path cfg = write_text(job.cluster.dir / "bad.toml", toml);
  job.ranks[1][0] = job.cluster.worker(cfg, "east", 0);
  EXPECT_EQ(job.ranks[1][0].wait(30s), 1) << job.ranks[1][0].output();
  EXPECT_NE(job.ranks[1][0].output().find(bad.string()), std::string::npos)
      << job.ranks[1][0].output();
  const double val = expect_leader_finishes(job);
  EXPECT_EQ(job.ranks[2][0].wait(60s), 0) << job.ranks[2][0].output();
  const std::string out = job.cluster.coordinator.output();
  EXPECT_EQ(out.find("east/0 rejoins"), std::string::npos) << out;
  EXPECT_EQ(out.find("membership epoch 3"), std::string::npos) << out;
  EXPECT_NEAR(val, reference_val_loss(job.cfg, job.cluster.dir), kLossTolerance);
  report_row("restart a killed site over corrupt data", -1, -1, 0.0, -1,
             "it failed before registering; no extra epoch");
}

TEST(FaultSuite, CoordinatorKilledAndRestartedTheRanksTrainOnAndReconnect) {
  Job job("coordinator", 1, 3);
  ASSERT_TRUE(job.reach(kSteps / 4)) << job.ranks[0][0].output();
  const int port = job.cluster.port;
  const auto killed_at = Clock::now();
  ::kill(job.cluster.coordinator.pid, SIGKILL);
  job.cluster.coordinator.wait(5s);
  const auto heard = wait_for_text(job.ranks[0][0], "lost the coordinator", 10s);
  ASSERT_TRUE(heard.has_value()) << job.ranks[0][0].output();
  // Training does not wait for it.
  const std::int64_t at_kill = leader_step(job.leader_metrics());
  std::this_thread::sleep_for(1500ms);
  EXPECT_GT(leader_step(job.leader_metrics()), at_kill + 50);
  job.cluster.start(job.cfg, port);  // the same address: the ranks reconnect by themselves
  const auto back = wait_for_text(job.ranks[0][0], "reconnected to the coordinator", 30s);
  ASSERT_TRUE(back.has_value()) << job.ranks[0][0].output() << job.cluster.coordinator.output();
  const double val = expect_leader_finishes(job);
  for (auto* p : {&job.ranks[1][0], &job.ranks[2][0]}) EXPECT_EQ(p->wait(60s), 0) << p->output();
  EXPECT_EQ(job.cluster.coordinator.wait(30s), 0) << job.cluster.coordinator.output();
  EXPECT_NE(job.cluster.coordinator.output().find("rebuilt membership epoch 1 from the ranks: 3 "
                                                  "site(s) [west, east, north]"),
            std::string::npos)
      << job.cluster.coordinator.output();
  // Nothing of the training depended on the coordinator: the result is the fault-free one.
  const double ref = reference_val_loss(job.cfg, job.cluster.dir);
  EXPECT_EQ(val, ref);
  report_row("kill -9 the coordinator, restart it on the same address", seconds(killed_at, *heard),
             seconds(killed_at, *back), val - ref, 0.0,
             "ranks trained on, reconnected, membership rebuilt; finished bit-exact");
}

// A poisoned site (its x NaN, or 1000x too large, at one average): the payload guard leaves
// it out of that average on every rank, names it in the metrics, and it heals by taking the
// others' mean; the job finishes near the fault-free loss.
void expect_poison_is_rejected(const std::string& tag, const std::string& kind, int R) {
  Job job(tag, R, 3, "",
          {{"DESLOC_INJECT_POISON", "east:" + std::to_string(kSteps / 3) + ":" + kind}});
  const double val = expect_leader_finishes(job);
  for (std::size_t s = 0; s < job.ranks.size(); ++s) {
    for (int r = 0; r < R; ++r) {
      if (s != 0 || r != 0) {
        EXPECT_EQ(job.ranks[s][std::size_t(r)].wait(60s), 0);
      }
    }
  }
  std::ifstream in(job.leader_metrics());
  std::string line, rejection;
  while (std::getline(in, line))
    if (line.find("\"type\":\"rejection\"") != std::string::npos) rejection += line + "\n";
  EXPECT_NE(rejection.find("\"site\":\"east\""), std::string::npos) << rejection;
  EXPECT_NE(rejection.find(kind == "huge" ? "median" : "non-finite"), std::string::npos)
      << rejection;
  const double ref = reference_val_loss(job.cfg, job.cluster.dir);
  EXPECT_NEAR(val, ref, kLossTolerance);
  report_row(kind == "huge" ? "one site sends x scaled 1000x (payload guard)"
                            : "one site sends a NaN in x (payload guard)",
             -1, -1, val - ref, -1, "east left out of that average and healed; finished");
}

TEST(FaultSuite, NonFinitePayloadFromOneSiteIsLeftOutAndTheJobFinishes) {
  expect_poison_is_rejected("poison_nan", "nan", 1);
}

TEST(FaultSuite, OutlierPayloadFromOneSiteIsLeftOutOnEveryShardAndLane) {
  expect_poison_is_rejected("poison_huge", "huge", 2);
}

TEST(FaultSuite, WholeJobRestartResumesFromTheNewestCheckpointEverySiteHoldsIntact) {
  Job job("restart", 1, 3);
  // Checkpoints every 250 steps: let every site write 250, 500 and 750, then lose everything.
  ASSERT_TRUE(job.reach(900)) << job.ranks[0][0].output();
  for (auto& site : job.ranks) ::kill(site[0].pid, SIGKILL);
  ::kill(job.cluster.coordinator.pid, SIGKILL);
  for (auto& site : job.ranks) site[0].wait(5s);
  job.cluster.coordinator.wait(5s);
  // West's newest checkpoint is torn (a crash mid-copy, a bad disk): half of it is left.
  const fs::path torn = job.cluster.dir / "out" / "checkpoints" / "step_00000750.ckpt";
  ASSERT_TRUE(fs::exists(torn));
  fs::resize_file(torn, fs::file_size(torn) / 2);
  const auto restarted_at = Clock::now();
  job.start({"--resume"});
  const double val = expect_leader_finishes(job);
  for (auto* p : {&job.ranks[1][0], &job.ranks[2][0]}) EXPECT_EQ(p->wait(60s), 0) << p->output();
  const std::string out = job.ranks[0][0].output();
  EXPECT_NE(out.find("resuming from checkpoint step 500"), std::string::npos) << out;
  EXPECT_NE(out.find("west/0 has it but rejected it"), std::string::npos) << out;
  // Resuming is bit-exact: the restarted job ends exactly where the fault-free run does.
  const double ref = reference_val_loss(job.cfg, job.cluster.dir);
  EXPECT_EQ(val, ref);
  report_row("whole job killed, newest checkpoint torn on one site, restarted with --resume", -1,
             seconds(restarted_at, Clock::now()), val - ref, 0.0,
             "resumed from step 500 (750 torn on west), finished bit-exact");
}

}  // namespace
}  // namespace desloc::test
