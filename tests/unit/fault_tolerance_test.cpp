// The fault tolerance of one rank, without a network: which failures a new membership epoch can
// mend, which rollback points are kept before which steps, where the rank rolls back, when it
// gives up, and the retried start. The coordinator's side is tested in membership_test; the
// whole path, with the state transfer, in the fault suite.
#include "train/fault_tolerance.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "desloc/core/error.hpp"

using namespace desloc;
using train::FaultTolerance;

namespace {

// A run whose state before step t is x = {t - 1} (or `x` when set), and what the fault
// tolerance asked of it.
struct FakeRun final : FaultTolerance::Run {
  std::int64_t step = 0;
  std::uint64_t wire = 0;
  std::optional<float> x;
  std::vector<std::int64_t> reused;  // per capture: the step of the state given for reuse, or -1
  std::vector<const float*> buffers;  // per capture: where its x went
  int released = 0, bound = 0;

  train::TrainState capture(train::TrainState reuse) override {
    reused.push_back(reuse.replicas.empty() ? -1 : reuse.step);
    reuse.step = step;
    reuse.tokens_seen = static_cast<std::uint64_t>(step) * 10;
    reuse.replicas.resize(1);
    reuse.replicas[0].x.assign(1, x.value_or(float(step)));  // fits: the same memory
    buffers.push_back(reuse.replicas[0].x.data());
    return reuse;
  }
  std::uint64_t wire_bytes() override { return wire; }
  // No site joins in these tests: the transfer runs in the fault suite.
  train::SiteReplica& replica() override { throw Error("no state transfer here"); }
  train::SharedState shared() override { return {}; }
  void transferred(std::int64_t, bool, std::uint64_t, double) override {}
  void release_groups() override { ++released; }
  void bind_groups() override { ++bound; }
};

// A rank whose coordinator answers every recovery with `resume` and records what was offered.
struct FakeRank {
  train::RankContext ctx;
  std::vector<std::vector<std::int64_t>> offers;
  std::int64_t resume = 0;
  bool closed = false;
  FakeRank() {
    ctx.name = "east/0";
    ctx.epoch = 4;
    ctx.recovery_pending = [this] { return closed; };
    ctx.recover = [this](std::span<const std::int64_t> points, const std::string&) {
      offers.emplace_back(points.begin(), points.end());
      return resume;
    };
  }
};

// Run `run` to just before step t (state of t - 1, `wire` bytes sent) and call before_step.
void reach(FaultTolerance& ft, FakeRun& run, std::int64_t t, std::uint64_t wire,
           bool talks = true) {
  run.step = t - 1;
  run.wire = wire;
  ft.before_step(t, talks);
}

}  // namespace

TEST(FaultTolerance, OnlyTransportTimeoutAndPeerFailuresAreRecoverable) {
  EXPECT_TRUE(FaultTolerance::recoverable(TransportError("ucx")));
  EXPECT_TRUE(FaultTolerance::recoverable(TimeoutError("deadline")));
  EXPECT_TRUE(FaultTolerance::recoverable(PeerFailure("west/0 left")));
  EXPECT_FALSE(FaultTolerance::recoverable(DeviceError("cudaMalloc: out of memory")));
  EXPECT_FALSE(FaultTolerance::recoverable(DataError("bad shard")));
  EXPECT_FALSE(FaultTolerance::recoverable(ConfigError("bad key")));
  EXPECT_FALSE(FaultTolerance::recoverable(Error("loss is not finite")));
}

// Points before steps that talk across sites only, the two newest, the start's among them until
// two others replace it; the rollback restores the chosen one and releases and rebinds the groups.
TEST(FaultTolerance, KeepsTheTwoNewestPointsAndRollsBackToTheChosenOne) {
  FakeRank rank;
  FakeRun run;
  FaultTolerance ft(rank.ctx, run, false);
  ft.started(0);
  reach(ft, run, 4, 100);
  reach(ft, run, 6, 180, false);  // a step inside the site: no point
  reach(ft, run, 8, 250);
  run.wire = 400;
  rank.resume = 3;
  const auto back = ft.recover(8, "ring broke");
  ASSERT_EQ(rank.offers.size(), 1u);
  EXPECT_EQ(rank.offers[0], (std::vector<std::int64_t>{3, 7}));
  EXPECT_EQ(back.step, 3);
  ASSERT_TRUE(back.state.has_value());
  EXPECT_EQ(back.state->replicas[0].x, std::vector<float>{3.0f});
  EXPECT_EQ(back.state->tokens_seen, 30u);
  EXPECT_EQ(back.bytes_resent, 300u);
  EXPECT_EQ(run.released, 1);
  EXPECT_EQ(run.bound, 1);
  // The newer point is gone: after a rollback to 3 it describes a future that did not happen.
  ft.recover(5, "again");
  EXPECT_EQ(rank.offers[1], (std::vector<std::int64_t>{3}));
}

// A new point is captured into the buffers of the one it makes room for, so a point kept
// before every cross-site step is copied into memory already mapped; the points kept, offered
// and restored are the same as without it.
TEST(FaultTolerance, ANewPointReusesTheBuffersOfTheOneItDrops) {
  FakeRank rank;
  FakeRun run;
  FaultTolerance ft(rank.ctx, run, false);
  ft.started(0);
  reach(ft, run, 4, 100);
  reach(ft, run, 4, 100);  // a replay of step 4 replaces the point of step 3, drops none
  reach(ft, run, 8, 250);
  EXPECT_EQ(run.reused, (std::vector<std::int64_t>{-1, -1, -1, 0}));
  EXPECT_EQ(run.buffers[3], run.buffers[0]);
  run.wire = 400;
  rank.resume = 7;
  const auto back = ft.recover(8, "ring broke");
  EXPECT_EQ(rank.offers[0], (std::vector<std::int64_t>{3, 7}));
  ASSERT_TRUE(back.state.has_value());
  EXPECT_EQ(back.state->replicas[0].x, std::vector<float>{7.0f});
  EXPECT_EQ(back.bytes_resent, 150u);
}

TEST(FaultTolerance, AReplayedStepReplacesThePointOfTheSameStep) {
  FakeRank rank;
  FakeRun run;
  FaultTolerance ft(rank.ctx, run, false);
  reach(ft, run, 4, 0);
  run.x = 42.0f;
  reach(ft, run, 4, 0);
  rank.resume = 3;
  EXPECT_EQ(ft.recover(4, "x").state->replicas[0].x, std::vector<float>{42.0f});
  EXPECT_EQ(rank.offers[0], (std::vector<std::int64_t>{3}));
}

TEST(FaultTolerance, AStepThatFailsInThreeFreshEpochsEndsTheRank) {
  FakeRank rank;
  FakeRun run;
  FaultTolerance ft(rank.ctx, run, false);
  reach(ft, run, 4, 0);
  rank.resume = 3;
  for (int i = 0; i < FaultTolerance::kMaxFailuresOfOneStep; ++i)
    EXPECT_NO_THROW(ft.recover(4, "poisoned"));
  try {
    ft.recover(4, "poisoned");
    FAIL() << "a fourth failure of step 4 must end the rank";
  } catch (const PeerFailure& e) {
    EXPECT_NE(e.message().find("step 4 failed 4 times"), std::string::npos) << e.message();
  }
}

TEST(FaultTolerance, AResumeStepThisRankDoesNotHoldIsAPeerFailureNamingItsPoints) {
  FakeRank rank;
  FakeRun run;
  FaultTolerance ft(rank.ctx, run, false);
  reach(ft, run, 4, 0);
  rank.resume = 11;
  try {
    ft.recover(4, "x");
    FAIL();
  } catch (const PeerFailure& e) {
    EXPECT_NE(e.message().find("resumes at step 11, which this rank holds no snapshot of ([3])"),
              std::string::npos)
        << e.message();
  }
}

TEST(FaultTolerance, AJoiningSiteGetsNoStateToRestore) {
  FakeRank rank;
  FakeRun run;
  rank.ctx.recover = [&](std::span<const std::int64_t>, const std::string&) {
    rank.ctx.joining = true;
    return std::int64_t{9};
  };
  FaultTolerance ft(rank.ctx, run, false);
  const auto back = ft.recover(1, "x");
  EXPECT_EQ(back.step, 9);
  EXPECT_FALSE(back.state.has_value());
}

// The coordinator closed the epoch: the step does not start, and the loop recovers.
TEST(FaultTolerance, AClosedEpochEndsTheStepBeforeItStarts) {
  FakeRank rank;
  FakeRun run;
  FaultTolerance ft(rank.ctx, run, false);
  reach(ft, run, 2, 0);
  rank.closed = true;
  try {
    reach(ft, run, 3, 0);
    FAIL();
  } catch (const PeerFailure& e) {
    EXPECT_NE(e.message().find("east/0: the coordinator closed membership epoch 4"),
              std::string::npos)
        << e.message();
  }
}

// A start that failed on a peer is agreed again in the next epoch (every survivor offers step
// 0), at most kMaxFailuresOfOneStep times; a failure no epoch mends, or a rejoining site's,
// ends the rank.
TEST(FaultTolerance, AStartThatFailedOnAPeerIsRetriedInTheNextEpoch) {
  FakeRank rank;
  FakeRun run;
  FaultTolerance ft(rank.ctx, run, false);
  EXPECT_TRUE(ft.retry_start(PeerFailure("west/0 left"), 1));
  EXPECT_EQ(rank.offers, (std::vector<std::vector<std::int64_t>>{{0}}));
  EXPECT_EQ(run.released, 1);
  EXPECT_EQ(run.bound, 1);
  EXPECT_FALSE(ft.retry_start(DataError("bad shard"), 1));
  EXPECT_FALSE(ft.retry_start(PeerFailure("west/0 left"), FaultTolerance::kMaxFailuresOfOneStep));
  rank.ctx.joining = true;
  FaultTolerance rejoining(rank.ctx, run, false);
  EXPECT_TRUE(rejoining.rejoining());
  EXPECT_FALSE(rejoining.retry_start(PeerFailure("west/0 left"), 1));
  EXPECT_FALSE(FaultTolerance(rank.ctx, run, true).rejoining());  // resuming its own checkpoint
}
