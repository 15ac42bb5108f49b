// Elastic recovery's decisions on one rank, without a network: which failures a new membership
// epoch can mend, which rollback points are kept, where the rank rolls back, and when it gives
// up. The coordinator's side is tested in membership_test; the whole path in the fault suite.
#include "cluster/recovery.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "desloc/core/error.hpp"

using namespace desloc;

namespace {

train::TrainState state_at(std::int64_t step) {
  train::TrainState s;
  s.step = step;
  s.tokens_seen = static_cast<std::uint64_t>(step) * 10;
  s.replicas.push_back({{float(step)}, {0.5f}, {0.25f}, step, {}});
  return s;
}

// A rank whose coordinator answers every recovery with `resume` and records what was offered.
struct FakeRank {
  train::RankContext ctx;
  std::vector<std::vector<std::int64_t>> offers;
  std::int64_t resume = 0;
  FakeRank() {
    ctx.name = "east/0";
    ctx.recover = [this](std::span<const std::int64_t> points, const std::string&) {
      offers.emplace_back(points.begin(), points.end());
      return resume;
    };
  }
};

}  // namespace

TEST(Recovery, OnlyTransportTimeoutAndPeerFailuresAreRecoverable) {
  EXPECT_TRUE(cluster::Recovery::recoverable(TransportError("ucx")));
  EXPECT_TRUE(cluster::Recovery::recoverable(TimeoutError("deadline")));
  EXPECT_TRUE(cluster::Recovery::recoverable(PeerFailure("west/0 left")));
  EXPECT_FALSE(cluster::Recovery::recoverable(DeviceError("cudaMalloc: out of memory")));
  EXPECT_FALSE(cluster::Recovery::recoverable(DataError("bad shard")));
  EXPECT_FALSE(cluster::Recovery::recoverable(ConfigError("bad key")));
  EXPECT_FALSE(cluster::Recovery::recoverable(Error("loss is not finite")));
}

TEST(Recovery, KeepsTheTwoNewestPointsAndRollsBackToTheChosenOne) {
  FakeRank rank;
  cluster::Recovery rec(rank.ctx);
  rec.keep(state_at(0), 0);
  rec.keep(state_at(3), 100);
  rec.keep(state_at(7), 250);
  rank.resume = 3;
  const auto back = rec.recover(8, "ring broke", 400);
  ASSERT_EQ(rank.offers.size(), 1u);
  EXPECT_EQ(rank.offers[0], (std::vector<std::int64_t>{3, 7}));
  EXPECT_EQ(back.step, 3);
  ASSERT_TRUE(back.state.has_value());
  EXPECT_EQ(back.state->replicas[0].x, std::vector<float>{3.0f});
  EXPECT_EQ(back.state->tokens_seen, 30u);
  EXPECT_EQ(back.bytes_resent, 300u);
  // The newer point is gone: after a rollback to 3 it describes a future that did not happen.
  rank.resume = 3;
  rec.recover(5, "again", 400);
  EXPECT_EQ(rank.offers[1], (std::vector<std::int64_t>{3}));
}

// spare() hands out the point keep() would drop, so the next one is captured into its buffers;
// the points kept, offered and restored are the same as without it.
TEST(Recovery, TheSparePointIsTheOneKeepWouldDrop) {
  FakeRank rank;
  cluster::Recovery rec(rank.ctx);
  EXPECT_TRUE(rec.spare(1).replicas.empty());  // nothing kept yet
  rec.keep(state_at(0), 0);
  EXPECT_TRUE(rec.spare(3).replicas.empty());  // one point: keep() drops none
  rec.keep(state_at(3), 100);
  EXPECT_TRUE(rec.spare(3).replicas.empty());  // a replay of step 3 replaces it, drops none
  train::TrainState spare = rec.spare(7);
  ASSERT_EQ(spare.step, 0);  // the oldest
  const float* buffer = spare.replicas[0].x.data();
  spare.step = 7;
  spare.tokens_seen = 70;
  spare.replicas[0].x.assign(1, 7.0f);  // fits: the same memory
  EXPECT_EQ(spare.replicas[0].x.data(), buffer);
  rec.keep(std::move(spare), 250);
  rank.resume = 7;
  const auto back = rec.recover(8, "ring broke", 400);
  EXPECT_EQ(rank.offers[0], (std::vector<std::int64_t>{3, 7}));
  ASSERT_TRUE(back.state.has_value());
  EXPECT_EQ(back.state->replicas[0].x, std::vector<float>{7.0f});
  EXPECT_EQ(back.bytes_resent, 150u);
}

TEST(Recovery, AReplayedStepReplacesThePointOfTheSameStep) {
  FakeRank rank;
  cluster::Recovery rec(rank.ctx);
  rec.keep(state_at(3), 0);
  auto replay = state_at(3);
  replay.replicas[0].x = {42.0f};
  rec.keep(replay, 0);
  rank.resume = 3;
  EXPECT_EQ(rec.recover(4, "x", 0).state->replicas[0].x, std::vector<float>{42.0f});
  EXPECT_EQ(rank.offers[0], (std::vector<std::int64_t>{3}));
}

TEST(Recovery, AStepThatFailsInThreeFreshEpochsEndsTheRank) {
  FakeRank rank;
  cluster::Recovery rec(rank.ctx);
  rec.keep(state_at(3), 0);
  rank.resume = 3;
  for (int i = 0; i < cluster::Recovery::kMaxFailuresOfOneStep; ++i)
    EXPECT_NO_THROW(rec.recover(4, "poisoned", 0));
  try {
    rec.recover(4, "poisoned", 0);
    FAIL() << "a fourth failure of step 4 must end the rank";
  } catch (const PeerFailure& e) {
    EXPECT_NE(e.message().find("step 4 failed 4 times"), std::string::npos) << e.message();
  }
}

TEST(Recovery, AResumeStepThisRankDoesNotHoldIsAPeerFailureNamingItsPoints) {
  FakeRank rank;
  cluster::Recovery rec(rank.ctx);
  rec.keep(state_at(3), 0);
  rank.resume = 11;
  try {
    rec.recover(4, "x", 0);
    FAIL();
  } catch (const PeerFailure& e) {
    EXPECT_NE(e.message().find("resumes at step 11, which this rank holds no snapshot of ([3])"),
              std::string::npos)
        << e.message();
  }
}

TEST(Recovery, AJoiningSiteGetsNoStateToRestore) {
  FakeRank rank;
  rank.ctx.recover = [&](std::span<const std::int64_t>, const std::string&) {
    rank.ctx.joining = true;
    return std::int64_t{9};
  };
  cluster::Recovery rec(rank.ctx);
  const auto back = rec.recover(1, "x", 0);
  EXPECT_EQ(back.step, 9);
  EXPECT_FALSE(back.state.has_value());
}
