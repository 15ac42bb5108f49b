// Hierarchical DES-LOC's averagers: RegionalAverager routes each due state to the job-wide
// averager or to the regions' (GroupedAverager) by the levels the sync engine gives it from the
// job-wide schedule in force, stop requests travel
// only with job-wide exchanges, and the regions' guard names sites by their job-wide index.
#include "desloc/sync/regional_averager.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/core/sync_schedule.hpp"

namespace desloc::sync {
namespace {

constexpr std::size_t kN = 8;

struct World {
  std::vector<std::vector<float>> replicas;  // site w holds w + 1 + i / 16
  std::vector<std::span<float>> views;
  VirtualAverager global{4, SumOrder::kRing};
  GroupedAverager regions{{{0, 1}, {2, 3}}, 4, ShardMap::even(1), PayloadGuard{}};
  RegionalAverager avg{global, regions};
  SyncSchedule job_wide{SyncMethod::kDesloc, 4, 12, 24, 0, 0, 0};
  World() {
    for (int w = 0; w < 4; ++w) {
      replicas.emplace_back(kN);
      for (std::size_t i = 0; i < kN; ++i) replicas.back()[i] = float(w + 1) + float(i) / 16;
    }
    views.assign(replicas.begin(), replicas.end());
  }
  // As the sync engine opens a step: its number, then which averages span every site.
  void begin(std::int64_t t) {
    avg.begin_step(t);
    avg.set_levels(job_wide.at(t));
  }
  bool control(std::int64_t t, bool stop) {
    begin(t);
    const DueAverage d{optim::StateKind::kX, views, nullptr};
    return avg.exchange_control(std::span(&d, 1), stop);
  }
  void average_x() { avg.average(optim::StateKind::kX, views); }
};

TEST(RegionalAverager, AStepDueOnlyInsideRegionsMixesEachRegionAlone) {
  World w;
  EXPECT_FALSE(w.control(2, true)) << "a stop request waits for a job-wide exchange";
  w.average_x();
  for (std::size_t i = 0; i < kN; ++i) {
    EXPECT_EQ(w.replicas[0][i], 1.5f + float(i) / 16);  // (1 + 2) / 2
    EXPECT_EQ(w.replicas[1][i], w.replicas[0][i]);
    EXPECT_EQ(w.replicas[2][i], 3.5f + float(i) / 16);  // (3 + 4) / 2
    EXPECT_EQ(w.replicas[3][i], w.replicas[2][i]);
  }
  // Bytes: each region's 2-site ring sends the payload once per replica, as region_wire.
  const Traffic t = w.avg.traffic(3);
  EXPECT_EQ(t.region_wire[static_cast<std::size_t>(optim::StateKind::kX)], kN * sizeof(float));
  EXPECT_EQ(t.wire[static_cast<std::size_t>(optim::StateKind::kX)], 0u);
}

TEST(RegionalAverager, AJobWideStepMixesEverySiteAndCarriesTheStopRequest) {
  World w;
  EXPECT_TRUE(w.control(4, true));
  w.average_x();
  for (std::size_t i = 0; i < kN; ++i)
    for (int s = 0; s < 4; ++s) EXPECT_EQ(w.replicas[std::size_t(s)][i], 2.5f + float(i) / 16);
  const Traffic t = w.avg.traffic(0);
  EXPECT_EQ(t.region_wire[static_cast<std::size_t>(optim::StateKind::kX)], 0u);
  EXPECT_EQ(t.wire[static_cast<std::size_t>(optim::StateKind::kX)],
            kN * sizeof(float) * 3 / 2);  // 2(M - 1) / M of the payload over 4 sites
}

TEST(RegionalAverager, TheRegionsGuardNamesTheRejectedSiteByItsJobWideIndex) {
  World w;
  w.replicas[3][5] = std::numeric_limits<float>::quiet_NaN();
  w.control(2, false);
  w.average_x();
  ASSERT_EQ(w.avg.rejections().size(), 1u);
  EXPECT_EQ(w.avg.rejections()[0].site, 3);
  EXPECT_EQ(w.avg.rejections()[0].step, 2);
  // Site 3 was left out of its region's mean: it takes site 2's value.
  EXPECT_EQ(w.replicas[3][0], 3.0f);
  EXPECT_EQ(w.replicas[0][0], 1.5f);
}

// The exchange in two halves (delayed averages: the second runs on the communication thread):
// the same answers, with the rejections in the answer instead of rejections().
TEST(RegionalAverager, TheExchangeInTwoHalvesAnswersAsTheWholeOne) {
  World w;
  w.replicas[3][5] = std::numeric_limits<float>::quiet_NaN();
  const DueAverage d{optim::StateKind::kX, w.views, nullptr};
  w.begin(2);  // only inside the regions: no stop agreed
  w.avg.open_control(std::span(&d, 1), true);
  Averager::ControlAnswer a = w.avg.close_control();
  EXPECT_FALSE(a.stop);
  EXPECT_TRUE(w.avg.rejections().empty());
  ASSERT_EQ(a.rejections.size(), 1u);
  EXPECT_EQ(a.rejections[0].site, 3);
  w.avg.record_rejections(a.rejections);
  w.average_x();
  ASSERT_EQ(w.avg.rejections().size(), 1u);
  EXPECT_EQ(w.replicas[3][0], 3.0f);  // left out of its region's mean, as with the whole exchange
  w.avg.clear_rejections();
  w.begin(4);  // job-wide: the stop travels
  w.avg.open_control(std::span(&d, 1), true);
  a = w.avg.close_control();
  EXPECT_TRUE(a.stop);
  EXPECT_TRUE(a.rejections.empty());
  EXPECT_FALSE(a.measure.has_value());
}

// The levels follow what the engine says, not a schedule of the averager's own: after a period
// switch to kx = 2 (a re-plan), step 2 is job-wide; and a step whose levels were never given
// is an error, not a guess.
TEST(RegionalAverager, TheLevelsOfAStepAreTheOnesTheEngineGives) {
  World w;
  w.job_wide = SyncSchedule{SyncMethod::kDesloc, 2, 6, 12, 0, 0, 0};
  w.control(2, false);
  w.average_x();
  for (std::size_t i = 0; i < kN; ++i)
    for (int s = 0; s < 4; ++s) EXPECT_EQ(w.replicas[std::size_t(s)][i], 2.5f + float(i) / 16);
  w.avg.begin_step(3);
  EXPECT_THROW(w.average_x(), Error);
}

}  // namespace
}  // namespace desloc::sync
