// Re-planning while training (issue 15, item 5): period switches in the schedule, and the
// replanner's rule on hand-computed measurements.
#include <gtest/gtest.h>

#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/sync/replanner.hpp"
#include "desloc/sync/sync_policy.hpp"

using namespace desloc;
using sync::Periods;
using sync::PeriodSwitch;
using sync::Replanner;
using sync::ReplanOptions;
using sync::SyncMeasure;
using sync::SyncPolicy;

namespace {
using V = std::vector<std::int64_t>;
V steps_where(const SyncPolicy& p, std::int64_t upto, bool sync::SyncDecision::*field) {
  V out;
  for (std::int64_t t = 0; t <= upto; ++t)
    if (p.at(t).*field) out.push_back(t);
  return out;
}
SyncMeasure took(double state_s, double compute_s = 0.05) { return {state_s, compute_s, 1e6}; }
}  // namespace

TEST(PeriodSwitch, NewPeriodsCountFromTheAverageTheySwitchAt) {
  SyncPolicy p({.method = SyncMethod::kDesloc, .kx = 4, .switches = {{.after = 8, .kx = 6}}});
  EXPECT_EQ(steps_where(p, 40, &sync::SyncDecision::x), (V{4, 8, 14, 20, 26, 32, 38}));
  EXPECT_EQ(steps_where(p, 40, &sync::SyncDecision::u), (V{26}));  // 3 x 6 after step 8
  EXPECT_EQ(steps_where(p, 50, &sync::SyncDecision::v), (V{44}));  // 6 x 6 after step 8
  EXPECT_EQ(p.schedule_at(8).kx, 4);
  EXPECT_EQ(p.schedule_at(9).kx, 6);
  // A switch back, with its own ku and kv.
  p.add_switch({.after = 20, .kx = 2, .ku = 4, .kv = 8});
  EXPECT_EQ(steps_where(p, 30, &sync::SyncDecision::x), (V{4, 8, 14, 20, 22, 24, 26, 28, 30}));
  EXPECT_EQ(steps_where(p, 30, &sync::SyncDecision::u), (V{24, 28}));
  EXPECT_EQ(steps_where(p, 30, &sync::SyncDecision::v), (V{28}));
  // A rollback to a state captured at step 19 undoes the switch decided at 20; one captured at
  // 20 restores it.
  const std::vector<PeriodSwitch> at_20 = p.switches();
  p.restore_switches({at_20.begin(), at_20.end() - 1});
  EXPECT_EQ(p.switches().size(), 1u);
  EXPECT_EQ(p.schedule_at(21).kx, 6);
  p.restore_switches(at_20);
  EXPECT_EQ(p.schedule_at(21).kx, 2);
}

TEST(PeriodSwitch, OtherMethodsSwitchXAndAverageTheMomentsWithIt) {
  const SyncPolicy p(
      {.method = SyncMethod::kLocalAdam, .kx = 3, .switches = {{.after = 6, .kx = 5}}});
  EXPECT_EQ(steps_where(p, 20, &sync::SyncDecision::x), (V{3, 6, 11, 16}));
  EXPECT_EQ(steps_where(p, 20, &sync::SyncDecision::v), (V{3, 6, 11, 16}));
}

TEST(PeriodSwitch, RefusedOffAParameterAverageOutOfOrderOrPastTheLimit) {
  SyncPolicy p({.method = SyncMethod::kDesloc, .kx = 4});
  EXPECT_THROW(p.add_switch({.after = 6, .kx = 8}), Error);  // no x average at 6
  p.add_switch({.after = 8, .kx = 2});
  EXPECT_THROW(p.add_switch({.after = 8, .kx = 4}), Error);  // not after the last one
  EXPECT_THROW(p.add_switch({.after = 10, .kx = 0}), Error);
  for (std::int64_t a = 10; p.switches().size() < sync::kMaxPeriodSwitches; a += 2)
    p.add_switch({.after = a, .kx = 2});
  EXPECT_THROW(p.add_switch({.after = 1000, .kx = 2}), Error);
  // A checkpoint's switches must begin with the config's.
  SyncPolicy configured(
      {.method = SyncMethod::kDesloc, .kx = 4, .switches = {{.after = 8, .kx = 2}}});
  EXPECT_THROW(configured.restore_switches({{.after = 4, .kx = 2}}), DataError);
  configured.restore_switches({});  // an older checkpoint: the config's switches stay
  EXPECT_EQ(configured.switches().size(), 1u);
}

// DES-LOC at kx 8, ku 24, kv 48: one cycle of 6 parameter averages carries 1+1+2+1+1+3 = 9
// state averages.
TEST(Replanner, OverheadCountsTheStatesOfOneCycle) {
  const Periods p{8, 24, 48};
  EXPECT_DOUBLE_EQ(sync::replan_overhead(SyncMethod::kDesloc, p, 1.0, 0.1, 0.0), 9.0 / 4.8);
  // overlap = "step": each sync hides one step (0.1 s) of its states' time.
  EXPECT_DOUBLE_EQ(sync::replan_overhead(SyncMethod::kDesloc, p, 1.0, 0.1, 1.0),
                   (9.0 - 6 * 0.1) / 4.8);
  // Hidden entirely: no overhead.
  EXPECT_DOUBLE_EQ(sync::replan_overhead(SyncMethod::kDesloc, p, 0.01, 0.1, 1.0), 0.0);
  EXPECT_DOUBLE_EQ(sync::replan_overhead(SyncMethod::kLocalAdam, {8, 8, 8}, 1.0, 0.1, 0.0),
                   3.0 / 0.8);
  EXPECT_DOUBLE_EQ(sync::replan_overhead(SyncMethod::kFavg, {8, 8, 8}, 1.0, 0.1, 0.0), 1.0 / 0.8);
}

// A link 10x slower: after two slow averages in a row the period grows 10x, keeping the
// overhead the first averages measured; restored, it comes back.
TEST(Replanner, ATenfoldSlowerLinkStretchesThePeriodTenfoldAndBack) {
  Replanner r(SyncMethod::kDesloc, {8, 24, 48}, ReplanOptions{.syncs = 2, .max_kx = 100000});
  EXPECT_FALSE(r.observe(took(5.0)));  // the first average: connections opening, ignored
  EXPECT_FALSE(r.observe(took(0.1)));
  EXPECT_FALSE(r.observe(took(0.4, 0.5)));  // an outlier: the median of 3 sets the reference
  EXPECT_FALSE(r.observe(took(0.1)));       // the reference: 0.1 s, overhead 9 x 0.1 / (48 x 0.05)
  EXPECT_DOUBLE_EQ(r.target(), 0.9 / 2.4);
  EXPECT_FALSE(r.observe(took(1.0)));  // one slow average is not yet a drift
  EXPECT_FALSE(r.observe(took(0.12)));
  EXPECT_FALSE(r.observe(took(1.0)));
  const auto d = r.observe(took(1.0));
  ASSERT_TRUE(d);
  EXPECT_GE(d->periods.kx, 80);
  EXPECT_LE(d->periods.kx, 81);
  EXPECT_EQ(d->periods.ku, 3 * d->periods.kx);
  EXPECT_EQ(d->periods.kv, 6 * d->periods.kx);
  EXPECT_LE(d->overhead, d->target);
  EXPECT_NEAR(d->overhead_before, 10.0 * d->target, 1e-9);
  EXPECT_NEAR(d->predicted_step_s, 0.05 * (1.0 + d->overhead), 1e-12);
  EXPECT_DOUBLE_EQ(d->compute_seconds, 0.05);
  EXPECT_NE(d->reason.find("kx 8"), std::string::npos) << d->reason;
  // The new periods' own reference (3 averages), the target kept: a fast burst before it is
  // complete changes nothing.
  EXPECT_FALSE(r.observe(took(1.0)));
  EXPECT_FALSE(r.observe(took(0.1)));
  EXPECT_FALSE(r.observe(took(1.0)));
  EXPECT_DOUBLE_EQ(r.target(), 0.9 / 2.4);
  EXPECT_FALSE(r.observe(took(0.1)));
  const auto back = r.observe(took(0.1));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->periods, (Periods{8, 24, 48}));
}

TEST(Replanner, AnExplicitTargetAndTheBoundsDecideThePeriod) {
  // 5% of compute: blocking DES-LOC needs 1.5 x 1.0 / (kx x 0.05) <= 0.05, kx >= 600.
  Replanner r(SyncMethod::kDesloc, {8, 24, 48},
              ReplanOptions{.target = 0.05, .syncs = 1, .min_kx = 1, .max_kx = 500});
  for (int i = 0; i < 4; ++i) r.observe(took(0.1));
  const auto d = r.observe(took(1.0));
  ASSERT_TRUE(d);
  EXPECT_EQ(d->periods.kx, 500);  // capped at train.steps
  EXPECT_EQ(r.plan(1.0, 0.05, 0.05).kx, 500);
  Replanner open(SyncMethod::kDesloc, {8, 24, 48}, ReplanOptions{.max_kx = 100000});
  EXPECT_EQ(open.plan(1.0, 0.05, 0.05).kx, 600);
  // A delay of 3 steps needs kx >= 4, however fast the link.
  Replanner delayed(SyncMethod::kDesloc, {8, 24, 48}, ReplanOptions{.min_kx = 4});
  EXPECT_EQ(delayed.plan(1e-6, 0.05, 0.05).kx, 4);
}

TEST(Replanner, ADriftThatFlipsDirectionOrAResetStartsOver) {
  Replanner r(SyncMethod::kFavg, {10, 10, 10}, ReplanOptions{.syncs = 2});
  r.observe(took(1.0));
  for (int i = 0; i < 3; ++i) r.observe(took(0.2));
  EXPECT_FALSE(r.observe(took(1.0)));
  EXPECT_FALSE(r.observe(took(0.05)));  // faster now: a new run
  EXPECT_FALSE(r.observe(took(1.0)));
  r.reset({10, 10, 10});  // a rollback: measure afresh, the first average ignored again
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(r.observe(took(1.0)));  // the reference is 1.0 now
  EXPECT_FALSE(r.observe(took(1.0)));
  EXPECT_TRUE(r.observe(took(0.1)) || r.observe(took(0.1)));  // 10x faster, twice: kx 1
  EXPECT_FALSE(r.observe({0.0, 0.05, 0.0}));                  // nothing measured: ignored
}

// Ku and Kv that are no multiples of Kx (the config allows it): the overhead prices each
// state's averages on their own, and a plan rounds the ratios to whole multiples, the same on
// every rank whatever the periods in force when it was built.
TEST(Replanner, RatiosThatAreNoMultiplesArePricedPerStateAndPlannedAsWholeMultiples) {
  EXPECT_DOUBLE_EQ(sync::replan_overhead(SyncMethod::kDesloc, {8, 20, 48}, 1.0, 0.1, 0.0),
                   (1.0 / 8 + 1.0 / 20 + 1.0 / 48) / 0.1);
  EXPECT_DOUBLE_EQ(sync::replan_overhead(SyncMethod::kDesloc, {8, 20, 48}, 1.0, 0.1, 1.0),
                   0.9 * (1.0 / 8 + 1.0 / 20 + 1.0 / 48) / 0.1);
  const Replanner r(SyncMethod::kDesloc, {8, 20, 48}, ReplanOptions{.max_kx = 100000});
  for (const double s : {0.01, 0.3, 7.0}) {
    const Periods p = r.plan(s, 0.05, 0.2);
    EXPECT_EQ(p.ku, 3 * p.kx) << s;  // 20 / 8 = 2.5 rounds to 3
    EXPECT_EQ(p.kv, 6 * p.kx) << s;
    EXPECT_LE(sync::replan_overhead(SyncMethod::kDesloc, p, s, 0.05, 0.0), 0.2) << s;
    if (p.kx > 1) {  // the smallest that fits
      const Periods shorter{p.kx - 1, 3 * (p.kx - 1), 6 * (p.kx - 1)};
      EXPECT_GT(sync::replan_overhead(SyncMethod::kDesloc, shorter, s, 0.05, 0.0), 0.2) << s;
    }
  }
}

// With regions, a plan keeps each job-wide period a multiple of its region period, and kx longer
// than the region's: region periods 4, 8, 24 under 8, 24, 48 (ratios 3 and 6) allow kx in
// multiples of 8 only (kx = 4j gives ku = 12j, a multiple of 8 for even j).
TEST(Replanner, WithRegionsAPlanKeepsEveryPeriodAMultipleOfItsRegionPeriod) {
  const Replanner r(SyncMethod::kDesloc, {8, 24, 48}, ReplanOptions{.max_kx = 100000},
                    Periods{4, 8, 24});
  EXPECT_EQ(r.kx_step(), 8);
  EXPECT_EQ(r.plan(1e-6, 0.05, 0.05).kx, 8) << "not 1, nor the region's own 4";
  for (const double s : {0.01, 0.3, 7.0}) {
    const Periods p = r.plan(s, 0.05, 0.2);
    EXPECT_EQ(p.kx % 4, 0) << s;
    EXPECT_EQ(p.ku % 8, 0) << s;
    EXPECT_EQ(p.kv % 24, 0) << s;
    EXPECT_LE(sync::replan_overhead(SyncMethod::kDesloc, p, s, 0.05, 0.0), 0.2) << s;
    if (p.kx > 8) {  // the smallest multiple that fits
      const Periods shorter{p.kx - 8, 3 * (p.kx - 8), 6 * (p.kx - 8)};
      EXPECT_GT(sync::replan_overhead(SyncMethod::kDesloc, shorter, s, 0.05, 0.0), 0.2) << s;
    }
  }
  const Replanner favg(SyncMethod::kFavg, {6, 6, 6}, ReplanOptions{.max_kx = 100000},
                       Periods{3, 3, 3});
  EXPECT_EQ(favg.kx_step(), 3);
  EXPECT_EQ(favg.plan(1e-6, 0.05, 0.05).kx, 6);
}

// A switch every rank made keeps the target; a new epoch or a resume forgets it (every rank
// resets at the same step).
TEST(Replanner, AResetKeepsTheTargetOnlyWhenAsked) {
  Replanner r(SyncMethod::kDesloc, {8, 24, 48}, ReplanOptions{.max_kx = 100000});
  for (int i = 0; i < 4; ++i) r.observe(took(0.1));
  const double target = r.target();
  ASSERT_GT(target, 0.0);
  r.reset({16, 48, 96}, true);
  EXPECT_DOUBLE_EQ(r.target(), target);
  EXPECT_EQ(r.periods(), (Periods{16, 48, 96}));
  r.reset({16, 48, 96});
  EXPECT_DOUBLE_EQ(r.target(), 0.0);
}
