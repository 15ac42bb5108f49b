// The fault-injection suite's rejoin scenarios: a site killed mid-run comes back as fresh
// processes and rejoins from a peer (fault_env.hpp: the job, the reference, the report rows).
#include "fault_env.hpp"

namespace desloc::test {
namespace {

using namespace std::chrono_literals;

INSTANTIATE_TEST_SUITE_P(Sites, FaultSuiteSites, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "Sites"; });

// When east (one rank) was killed, when the leader heard of it, when east was restarted as a
// fresh process and when it rejoined from a peer.
struct Rejoin {
  Clock::time_point killed, heard, restarted, rejoined;
};
// A quarter of the way in, east's rank `victim` is killed, which takes its site out (its other
// ranks leave once it is dropped); once the survivors rolled back, every rank of east comes
// back (fresh processes, no state) and rejoins at the next epoch.
void kill_and_rejoin_east(Job& job, Rejoin& at, std::size_t victim = 0) {
  ASSERT_TRUE(job.reach(kSteps / 4)) << job.ranks[0][0].output();
  std::vector<Process>& east = job.ranks[1];
  at.killed = Clock::now();
  ::kill(east[victim].pid, SIGKILL);
  east[victim].wait(5s);
  const auto heard = wait_for_text(job.ranks[0][0], "closed membership epoch 1", 10s);
  ASSERT_TRUE(heard.has_value()) << job.ranks[0][0].output();
  at.heard = *heard;
  ASSERT_TRUE(wait_for_text(job.ranks[0][0], "rolled back to step", 30s).has_value());
  for (std::size_t r = 0; r < east.size(); ++r)
    if (r != victim) {
      EXPECT_NE(east[r].wait(30s), 0) << east[r].output();
    }
  at.restarted = Clock::now();
  for (std::size_t r = 0; r < east.size(); ++r)
    east[r] = job.cluster.worker(job.cfg, "east", static_cast<int>(r), {}, {"--threads", "1"});
  at.rejoined = at.restarted;
  for (Process& p : east) {
    const auto rejoined = wait_for_text(p, "rejoined at step", 60s);
    ASSERT_TRUE(rejoined.has_value()) << p.output() << job.cluster.coordinator.output();
    at.rejoined = std::max(at.rejoined, *rejoined);
  }
}

// The survivors of a loss open the next epoch's ports for every site of the job, not just for
// themselves: a rejoin grows the world back (with 3 sites, from one lane to two; with 2, from no
// wide-area ring to one), and a port opened for the shrunken world killed a survivor.
TEST_P(FaultSuiteSites, KilledSiteRestartsRejoinsFromAPeerAndTheJobFinishesOnAllSites) {
  const int S = GetParam();
  Job job("rejoin_" + std::to_string(S), 1, S);
  Rejoin at;
  kill_and_rejoin_east(job, at);
  if (HasFatalFailure()) return;
  const double val = expect_leader_finishes(job);
  expect_others_finish(job, "");
  EXPECT_NE(
      job.cluster.coordinator.output().find("opening membership epoch 3 with " + std::to_string(S) +
                                            " site(s) [" + job.listed_without("") + "]"),
      std::string::npos)
      << job.cluster.coordinator.output();
  // East's metrics keep its first life and go on from the step it rejoined at.
  const fs::path east = job.cluster.dir / "out" / "ranks" / "east-0" / "metrics.jsonl";
  EXPECT_EQ(leader_step(east), kSteps);
  const auto state_bytes = last_field(east, "rejoin", "state_bytes");
  ASSERT_TRUE(state_bytes.has_value());
  EXPECT_EQ(*state_bytes, 3.0 * 4.0 * last_field(east, "run", "parameters").value_or(0));
  const double ref = reference_val_loss(job.cfg, job.cluster.dir);
  EXPECT_NEAR(val, ref, kLossTolerance);
  report_row("kill -9 a site, restart it: rejoins from its ring predecessor (" + shape(S, 1) + ")",
             seconds(at.killed, at.heard), seconds(at.restarted, at.rejoined), val - ref,
             *state_bytes,
             "dropped east, east rejoined at epoch 3, finished on " + std::to_string(S) + " sites");
}

// Kills east's rank `victim` and restarts east (kill_and_rejoin_east); every site then finishes
// every step near the fault-free in-process run. A row of the fault report, with the state
// east/0 received.
void expect_the_job_finishes_after_east_rejoins(Job& job, std::size_t victim,
                                                const std::string& scenario,
                                                const std::string& outcome) {
  Rejoin at;
  kill_and_rejoin_east(job, at, victim);
  if (::testing::Test::HasFatalFailure()) return;
  const double val = expect_leader_finishes(job);
  expect_others_finish(job, "");
  for (std::size_t r = 0; r < job.ranks[1].size(); ++r) {
    const fs::path east =
        job.cluster.dir / "out" / "ranks" / ("east-" + std::to_string(r)) / "metrics.jsonl";
    EXPECT_EQ(leader_step(east), kSteps) << east;
  }
  const double ref = reference_val_loss(job.cfg, job.cluster.dir);
  EXPECT_NEAR(val, ref, kLossTolerance);
  const fs::path east0 = job.cluster.dir / "out" / "ranks" / "east-0" / "metrics.jsonl";
  report_row(scenario, seconds(at.killed, at.heard), seconds(at.restarted, at.rejoined), val - ref,
             last_field(east0, "rejoin", "state_bytes").value_or(-1), outcome);
}

// Unequal sites (issue 38): east trains on twice west's batch and four times north's, so it
// weighs most in every average. Killed, the survivors roll back and average by their own
// tokens (west 4, north 2); restarted, east rejoins from a peer and the averages weigh all three
// again. The job finishes on every site near the fault-free in-process run of the same tables.
TEST(FaultSuite, TheHeaviestOfUnequalSitesKilledAndRestartedRejoinsAndTheJobFinishes) {
  Job job("rejoin_unequal", 1, 3, "", {}, "", "", {4, 8, 2});
  expect_the_job_finishes_after_east_rejoins(
      job, 0,
      "kill -9 the heaviest of unequal sites (batches 4, 8, 2), restart it: rejoins (" +
          shape(3, 1) + ")",
      "dropped east, east rejoined, finished on 3 sites, token-weighted");
}

// Sites of unequal rank counts (issue 38): west 1, east 3, north 2 ranks, each averaging the
// wide-area segments its ranks own (west's one rank all of them). East, the site of the most
// ranks, loses a rank: the whole site goes, the survivors roll back and average over their
// own segments' rings; its three ranks restart, rejoin (each receiving its segments from
// west's one rank or north's two) and the job finishes on every site near the fault-free
// in-process run of the same tables. Then the single-rank site (west 2, east 1, north 3),
// whose one rank receives every segment of x, u and v.
TEST(FaultSuite, TheSiteWithTheMostRanksKilledAndRestartedRejoinsAndTheJobFinishes) {
  Job job("rejoin_most_ranks", 1, 3, "", {}, "", "", {4, 2, 4}, {1, 3, 2});
  expect_the_job_finishes_after_east_rejoins(
      job, 1, "kill -9 a rank of the site of most ranks (1, 3, 2 ranks), restart it: rejoins",
      "dropped east (3 ranks), east rejoined, finished on 3 sites");
}
TEST(FaultSuite, TheSingleRankSiteKilledAndRestartedRejoinsAndTheJobFinishes) {
  Job job("rejoin_single_rank", 1, 3, "", {}, "", "", {4, 4, 4}, {2, 1, 3});
  expect_the_job_finishes_after_east_rejoins(
      job, 0, "kill -9 the single-rank site (2, 1, 3 ranks), restart it: rejoins",
      "dropped east (1 rank), east rejoined, finished on 3 sites");
  const fs::path east = job.cluster.dir / "out" / "ranks" / "east-0" / "metrics.jsonl";
  EXPECT_EQ(last_field(east, "rejoin", "state_bytes").value_or(0),
            3.0 * 4.0 * last_field(east, "run", "parameters").value_or(-1));
}

// Re-planning (issue 15, item 5) and a rejoin: every rank switches kx 4 -> 8 after step 200
// (injected, as a drift would decide it); east is then killed and restarted as a fresh process
// that knows nothing of the switch. It must receive the switches with the state from its donor:
// otherwise it would average every 4 steps while the others average every 8, and the job could
// not go on. All three sites finish, and every site's averages after the rejoin fall every 8
// steps counted from 200.
TEST(FaultSuite, ASiteRejoiningAfterAReplanReceivesTheSwitchAndKeepsTheNewPeriod) {
  // A drift of 10^5 never happens: loopback's sub-millisecond averages vary by 2-4x from one to
  // the next, and the test wants exactly the injected decision.
  Job job("rejoin_replan", 1, 3, "", {{"DESLOC_INJECT_REPLAN", "200:8"}}, "",
          "replan = true\nreplan_drift = 100000\n");
  ASSERT_TRUE(job.reach(kSteps / 4)) << job.ranks[0][0].output();
  ASSERT_NE(job.ranks[0][0].output().find("re-planned after step 200: kx 4 -> 8"),
            std::string::npos)
      << job.ranks[0][0].output();
  ::kill(job.ranks[1][0].pid, SIGKILL);
  job.ranks[1][0].wait(5s);
  ASSERT_TRUE(wait_for_text(job.ranks[0][0], "rolled back to step", 30s).has_value())
      << job.ranks[0][0].output();
  job.ranks[1][0] = job.cluster.worker(job.cfg, "east", 0, {}, {"--threads", "1"});
  ASSERT_TRUE(wait_for_text(job.ranks[1][0], "rejoined at step", 60s).has_value())
      << job.ranks[1][0].output() << job.cluster.coordinator.output();
  const double val = expect_leader_finishes(job);
  for (auto* p : {&job.ranks[1][0], &job.ranks[2][0]}) EXPECT_EQ(p->wait(60s), 0) << p->output();
  const fs::path east = job.cluster.dir / "out" / "ranks" / "east-0" / "metrics.jsonl";
  const auto rejoined_at = last_field(east, "rejoin", "step");
  ASSERT_TRUE(rejoined_at.has_value());
  for (const fs::path& metrics : {job.leader_metrics(), east}) {
    std::ifstream in(metrics);
    int checked = 0;
    for (std::string line; std::getline(in, line);) {
      if (line.find("\"type\":\"train\"") == std::string::npos) continue;
      const std::int64_t t = std::atoll(line.c_str() + line.find("\"step\":") + 7);
      if (t <= *rejoined_at) continue;
      const auto at = line.find("\"synced\":\"") + 10;
      const bool x = line.substr(at, line.find('"', at) - at).find('x') != std::string::npos;
      EXPECT_EQ(x, (t - 200) % 8 == 0) << metrics << " step " << t;
      ++checked;
    }
    EXPECT_EQ(checked, kSteps - static_cast<int>(*rejoined_at)) << metrics;
  }
  const double ref = reference_val_loss(job.cfg, job.cluster.dir);
  EXPECT_NEAR(val, ref, kLossTolerance);
  report_row("re-plan kx 4 -> 8 at step 200, then kill -9 a site and restart it", -1, -1, val - ref,
             last_field(east, "rejoin", "state_bytes").value_or(-1),
             "east rejoined with the switch, every site averaged every 8 steps after it");
}

}  // namespace
}  // namespace desloc::test
