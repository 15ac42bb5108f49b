// The payload guard: a site whose contribution is NaN/Inf or whose norm is absurdly large is
// left out of the average and receives the others' mean; normal drift between sites never is.
// Checked on the decision rule alone, on the VirtualAverager, and over UCX (S sites x R ranks
// as threads) against the ring-ordered VirtualAverager bit for bit, with injected bad sites.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/sync/averager.hpp"
#include "desloc/sync/collective_averager.hpp"
#include "desloc/sync/payload_guard.hpp"
#include "desloc/sync/sync_engine.hpp"
#include "desloc/transport/ring_order.hpp"
#include "desloc/transport/ucx_collective.hpp"
#include "test_support.hpp"

using namespace desloc;
using desloc::SyncMethod;
using namespace std::chrono_literals;
using optim::StateKind;
using test_support::Watchdog;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Site s, element i: a small positive integer, so every ring sum is exact in float.
float healthy(int s, std::size_t i) { return float(i % 97) + float(s) + 1.0f; }

// The mean the healthy sites must reach, computed without the averagers: the sum of the kept
// sites' integers (exact), divided once in float as a correctly rounded mean.
std::vector<float> mean_of_kept(int S, std::size_t n, const std::vector<int>& bad) {
  std::vector<float> out(n);
  const int kept = S - static_cast<int>(bad.size());
  for (std::size_t i = 0; i < n; ++i) {
    double sum = 0.0;
    for (int s = 0; s < S; ++s)
      if (std::find(bad.begin(), bad.end(), s) == bad.end()) sum += double(healthy(s, i));
    out[i] = static_cast<float>(sum) / static_cast<float>(kept);
  }
  return out;
}

std::vector<sync::Rejection> judge(std::vector<sync::PayloadHealth> h, std::size_t n = 4096,
                                   sync::PayloadGuard g = {}) {
  return sync::judge_payloads(h, n, g, 5, StateKind::kX);
}

sync::PayloadHealth norm(double x) { return {0.0, x * x}; }

std::vector<int> sites_of(const std::vector<sync::Rejection>& r) {
  std::vector<int> out;
  for (const auto& x : r) out.push_back(x.site);
  return out;
}

}  // namespace

TEST(PayloadGuard, MeasuresNonFiniteAndSumOfSquares) {
  std::vector<float> v = {3.0f, kNaN, 4.0f, -kInf, 0.0f, 1.0f, kInf};
  const sync::PayloadHealth h = sync::measure_payload(v);
  EXPECT_EQ(h.nonfinite, 3.0);
  EXPECT_EQ(h.sum_squares, 26.0);
  // Large finite values do not overflow: squares are taken in double.
  std::vector<float> big(5, 3e38f);
  EXPECT_EQ(sync::measure_payload(big).nonfinite, 0.0);
  EXPECT_TRUE(std::isfinite(sync::measure_payload(big).sum_squares));
  EXPECT_EQ(sync::measure_payload({}).sum_squares, 0.0);
}

TEST(PayloadGuard, DecisionRule) {
  // Non-finite: rejected at any world size, two sites included.
  auto r = judge({{1.0, 4.0}, norm(2.0)});
  ASSERT_EQ(sites_of(r), std::vector<int>{0});
  EXPECT_NE(r[0].reason.find("non-finite"), std::string::npos) << r[0].reason;
  EXPECT_EQ(r[0].step, 5);
  EXPECT_EQ(r[0].state, StateKind::kX);
  // Two sites: a 1000x norm cannot be attributed to either side.
  EXPECT_TRUE(judge({norm(1.0), norm(1000.0)}).empty());
  // Three sites: the 1000x one goes, with the figures in the reason.
  r = judge({norm(1.0), norm(1000.0), norm(1.02)});
  ASSERT_EQ(sites_of(r), std::vector<int>{1});
  EXPECT_NE(r[0].reason.find("median 1.02"), std::string::npos) << r[0].reason;
  // DES-LOC drift (a few percent) and minibatch noise (2x) never trip it, nor does 9.9x.
  EXPECT_TRUE(judge({norm(1.0), norm(1.05), norm(0.96), norm(1.01)}).empty());
  EXPECT_TRUE(judge({norm(1.0), norm(2.0), norm(0.5)}).empty());
  EXPECT_TRUE(judge({norm(1.0), norm(9.9), norm(1.0)}).empty());
  // Small norms are not rejected: their pull on the mean is bounded.
  EXPECT_TRUE(judge({norm(1.0), norm(1e-6), norm(1.0)}).empty());
  // The lower median stays healthy with half the sites inflated.
  EXPECT_EQ(sites_of(judge({norm(1000.0), norm(1.0), norm(1000.0), norm(1.1)})),
            (std::vector<int>{0, 2}));
  // Non-finite sites do not count toward the three, nor toward the median.
  EXPECT_EQ(sites_of(judge({{2.0, 0.0}, norm(1.0), norm(500.0)})), std::vector<int>{0});
  EXPECT_EQ(sites_of(judge({{2.0, 0.0}, norm(1.0), norm(500.0), norm(1.0)})),
            (std::vector<int>{0, 2}));
  // Off switches: factor 0, short vectors, a zero median, the guard disabled.
  sync::PayloadGuard g;
  g.outlier_factor = 0.0;
  EXPECT_TRUE(judge({norm(1.0), norm(1000.0), norm(1.0)}, 4096, g).empty());
  EXPECT_TRUE(judge({norm(1.0), norm(1000.0), norm(1.0)}, 1000).empty());
  EXPECT_TRUE(judge({norm(0.0), norm(5.0), norm(0.0)}).empty());
  g = {};
  g.enabled = false;
  EXPECT_TRUE(judge({{1.0, 0.0}, norm(1.0), norm(1.0)}, 4096, g).empty());
  g = {};
  g.outlier_factor = 3.0;
  EXPECT_EQ(sites_of(judge({norm(1.0), norm(3.5), norm(1.0)}, 4096, g)), std::vector<int>{1});
}

TEST(PayloadGuard, EveryRejectedSiteThrowsNamingThem) {
  sync::PayloadGuard g;
  g.site_names = {"east", "west"};
  const auto r = judge({{1.0, 0.0}, {3.0, 0.0}}, 4096, g);
  try {
    sync::enforce_rejections(r, 2, g, true);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string m = e.message();
    for (const char* part :
         {"step 5", "'x'", "east: 1 of 4096 values non-finite", "west: 3 of 4096"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " in " << m;
  }
  EXPECT_EQ(sync::enforce_rejections({r.data(), 1}, 2, g, false), 1);
  EXPECT_EQ(g.site_name(1), "west");
  EXPECT_EQ(g.site_name(4), "site 4");
}

// An injected bad site in the in-process averager, both sum orders: the healthy sites get the
// mean of the healthy inputs exactly, the bad one heals to it, and the record names it.
class VirtualGuardTest : public ::testing::TestWithParam<std::tuple<sync::SumOrder, int, int>> {};

TEST_P(VirtualGuardTest, BadSiteIsLeftOutAndHeals) {
  const auto [order, S, R] = GetParam();
  constexpr std::size_t kN = 4099;
  const int bad = S / 2;
  for (const float poison : {kNaN, kInf, 1000.0f}) {
    std::vector<std::vector<float>> data(static_cast<std::size_t>(S), std::vector<float>(kN));
    for (int s = 0; s < S; ++s)
      for (std::size_t i = 0; i < kN; ++i) data[std::size_t(s)][i] = healthy(s, i);
    if (std::isnan(poison) || std::isinf(poison))
      data[std::size_t(bad)][kN - 3] = poison;  // one element, in the last shard
    else
      for (float& x : data[std::size_t(bad)]) x *= poison;
    const bool rejected = S >= 3 || !std::isfinite(poison);
    std::vector<std::span<float>> views(data.begin(), data.end());
    sync::VirtualAverager avg(S, order, R);
    avg.begin_step(42);
    avg.average(StateKind::kU, views);
    const std::vector<float> want = rejected ? mean_of_kept(S, kN, {bad}) : std::vector<float>{};
    for (int s = 0; s < S; ++s) {
      if (rejected) {
        ASSERT_EQ(data[std::size_t(s)], want) << "site " << s << " poison " << poison;
      }
      ASSERT_EQ(data[std::size_t(s)], data[0]);
    }
    if (rejected) {
      ASSERT_EQ(avg.rejections().size(), 1u);
      EXPECT_EQ(avg.rejections()[0].site, bad);
      EXPECT_EQ(avg.rejections()[0].step, 42);
      EXPECT_EQ(avg.rejections()[0].state, StateKind::kU);
    } else {
      EXPECT_TRUE(avg.rejections().empty());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OrdersSitesShards, VirtualGuardTest,
                         ::testing::Values(std::make_tuple(sync::SumOrder::kExact, 2, 1),
                                           std::make_tuple(sync::SumOrder::kExact, 3, 1),
                                           std::make_tuple(sync::SumOrder::kExact, 5, 1),
                                           std::make_tuple(sync::SumOrder::kRing, 2, 1),
                                           std::make_tuple(sync::SumOrder::kRing, 3, 2),
                                           std::make_tuple(sync::SumOrder::kRing, 4, 3)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == sync::SumOrder::kRing
                                                  ? "ring"
                                                  : "exact") +
                                  std::to_string(std::get<1>(info.param)) + "x" +
                                  std::to_string(std::get<2>(info.param));
                         });

// Sites that drift apart as DES-LOC replicas do (a few percent per element, a few percent in
// norm) are never rejected, and the guard then changes no bit of the result.
TEST(VirtualGuard, NormalDivergenceIsNeverRejected) {
  std::mt19937 rng(7);
  std::normal_distribution<float> base(0.0f, 0.02f), drift(0.0f, 0.05f);
  std::uniform_real_distribution<float> scale(0.9f, 1.1f);
  constexpr std::size_t kN = 20'000;
  for (int trial = 0; trial < 50; ++trial) {
    const int S = 3 + trial % 5;
    std::vector<float> x(kN);
    for (float& e : x) e = base(rng);
    std::vector<std::vector<float>> a(static_cast<std::size_t>(S)), b;
    for (int s = 0; s < S; ++s) {
      const float k = scale(rng);
      a[std::size_t(s)].resize(kN);
      for (std::size_t i = 0; i < kN; ++i) a[std::size_t(s)][i] = k * x[i] * (1.0f + drift(rng));
    }
    b = a;
    std::vector<std::span<float>> va(a.begin(), a.end()), vb(b.begin(), b.end());
    sync::VirtualAverager guarded(S, sync::SumOrder::kRing, 2, 2),
        plain(S, sync::SumOrder::kRing, 2, 2);
    sync::PayloadGuard off;
    off.enabled = false;
    plain.set_payload_guard(off);
    guarded.average(StateKind::kX, va);
    plain.average(StateKind::kX, vb);
    ASSERT_TRUE(guarded.rejections().empty()) << guarded.rejections()[0].reason;
    ASSERT_EQ(a, b);
  }
}

TEST(VirtualGuard, EverySiteBadThrows) {
  std::vector<float> a(8, kNaN), b(8, 1.0f);
  b[3] = kInf;
  std::vector<std::span<float>> views{a, b};
  sync::VirtualAverager avg(2, sync::SumOrder::kRing);
  avg.begin_step(9);
  try {
    avg.average(StateKind::kV, views);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string m = e.message();
    for (const char* part : {"step 9", "'v'", "site 0: 8 of 8 values non-finite", "site 1: 1 of 8"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " in " << m;
  }
  EXPECT_EQ(avg.rejections().size(), 2u);
}

namespace {

enum class Poison { kNone, kNaNOneRank, kInfAllRanks, kTimes1000 };

struct WorldResult {
  std::vector<std::vector<float>> data;                // per rank (s * R + r)
  std::vector<std::vector<sync::Rejection>> rejected;  // per rank
  double seconds_per_average = 0.0;                    // rank 0's median over `repeats`
};

// S sites x R ranks (two lanes when L = 2 and S >= 3) over UCX loopback, each rank averaging
// `input(s, r)` once per repeat as state kU at step 11 (chunk headers on the WAN groups).
template <class Input>
WorldResult run_world(int S, int R, int L, Input input, bool guard_on, int repeats = 1) {
  test_support::WorldOptions world;
  world.collective.deadline = 20s;
  world.collective.chunk_bytes = 4096;
  world.two_lanes = transport::effective_lanes(L, S) == 2;
  WorldResult out;
  out.data.resize(std::size_t(S * R));
  out.rejected.resize(std::size_t(S * R));
  test_support::run_world(S, R, world, [&](int s, int r, test_support::Groups& groups) {
    const auto me = static_cast<std::size_t>(s * R + r);
    sync::CollectiveAverager avg(*groups.wan, groups.site.get(), groups.reverse.get());
    sync::PayloadGuard g;
    g.enabled = guard_on;
    g.site_names = {"east", "west", "north"};
    avg.set_payload_guard(g);
    std::vector<double> times;
    std::vector<float> mine;
    for (int rep = 0; rep < repeats; ++rep) {
      mine = input(s, r);
      std::span<float> one(mine);
      avg.begin_step(11);
      const auto t0 = std::chrono::steady_clock::now();
      avg.average(StateKind::kU, std::span<const std::span<float>>(&one, 1));
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    if (me == 0) out.seconds_per_average = times[times.size() / 2];
    out.data[me] = std::move(mine);
    out.rejected[me] = avg.rejections();
  });
  return out;
}

}  // namespace

// The injected bad site over UCX: every rank of every site takes the same decision (even when
// only one rank of the bad site holds the bad value), the result equals the ring-ordered
// VirtualAverager on the same contributions bit for bit, and the closed-form mean of the
// healthy sites; the bad site heals to it.
class NetworkedGuardTest
    : public ::testing::TestWithParam<std::tuple<int, int, int, Poison, std::size_t>> {};

TEST_P(NetworkedGuardTest, BadSiteIsLeftOutOnEveryRankAndMatchesTheVirtualAverager) {
  const auto [S, R, L, poison, n] = GetParam();
  Watchdog watchdog(90s);
  const int bad = S - 1;
  // What rank r of site s contributes (its whole replica; only its shard travels).
  auto input = [bad, R = R, poison = poison, n = n](int s, int r) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = healthy(s, i);
    if (s != bad) return v;
    const transport::Range last = transport::block(n, R, R - 1);
    switch (poison) {
      case Poison::kNone:
        break;
      case Poison::kNaNOneRank:  // only the last rank's copy (its own shard) is bad
        if (r == R - 1 && last.count > 0) v[last.offset + last.count - 1] = kNaN;
        break;
      case Poison::kInfAllRanks:
        v[n / 2] = -kInf;
        break;
      case Poison::kTimes1000:
        for (float& x : v) x *= 1000.0f;
        break;
    }
    return v;
  };
  const WorldResult got = run_world(S, R, L, input, true);

  // Reference: the site's contribution is each rank's own shard.
  std::vector<std::vector<float>> ref(static_cast<std::size_t>(S), std::vector<float>(n));
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < R; ++r) {
      const auto v = input(s, r);
      const transport::Range b = transport::block(n, R, r);
      std::copy_n(v.begin() + std::ptrdiff_t(b.offset), b.count,
                  ref[std::size_t(s)].begin() + std::ptrdiff_t(b.offset));
    }
  std::vector<std::span<float>> views(ref.begin(), ref.end());
  sync::VirtualAverager virt(S, sync::SumOrder::kRing, R, L);
  virt.begin_step(11);
  virt.average(StateKind::kU, views);

  const bool nan_lands = poison == Poison::kNaNOneRank && transport::block(n, R, R - 1).count > 0;
  const bool excluded = poison == Poison::kInfAllRanks || nan_lands ||
                        (poison == Poison::kTimes1000 && S >= 3 && n >= 1024);
  const std::vector<int> bad_sites = excluded ? std::vector<int>{bad} : std::vector<int>{};
  ASSERT_EQ(sites_of(virt.rejections()), bad_sites);
  const std::vector<float> want = mean_of_kept(S, n, bad_sites);
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < R; ++r) {
      const auto me = std::size_t(s * R + r);
      ASSERT_EQ(0, std::memcmp(got.data[me].data(), ref[std::size_t(s)].data(), n * sizeof(float)))
          << "site " << s << " rank " << r;
      if (poison != Poison::kTimes1000 || excluded) {
        ASSERT_EQ(got.data[me], want) << "site " << s << " rank " << r;
      }
      ASSERT_EQ(got.rejected[me].size(), virt.rejections().size()) << "site " << s << " rank " << r;
      for (std::size_t k = 0; k < got.rejected[me].size(); ++k) {
        EXPECT_EQ(got.rejected[me][k].site, virt.rejections()[k].site);
        EXPECT_EQ(got.rejected[me][k].step, 11);
        EXPECT_EQ(got.rejected[me][k].reason, virt.rejections()[k].reason);
      }
    }
}

std::string networked_case_name(
    const ::testing::TestParamInfo<std::tuple<int, int, int, Poison, std::size_t>>& info) {
  static const char* const kNames[] = {"none", "nan_one_rank", "inf", "x1000"};
  return std::to_string(std::get<0>(info.param)) + "x" + std::to_string(std::get<1>(info.param)) +
         "_lanes" + std::to_string(std::get<2>(info.param)) + "_" +
         kNames[static_cast<int>(std::get<3>(info.param))] + "_n" +
         std::to_string(std::get<4>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    SitesRanksLanesPoison, NetworkedGuardTest,
    ::testing::Values(std::make_tuple(2, 1, 1, Poison::kNaNOneRank, std::size_t{4099}),
                      std::make_tuple(2, 2, 1, Poison::kTimes1000, std::size_t{4099}),
                      std::make_tuple(2, 3, 1, Poison::kInfAllRanks, std::size_t{5}),
                      std::make_tuple(3, 1, 1, Poison::kTimes1000, std::size_t{4099}),
                      std::make_tuple(3, 2, 1, Poison::kNaNOneRank, std::size_t{4099}),
                      std::make_tuple(3, 2, 2, Poison::kTimes1000, std::size_t{4099}),
                      std::make_tuple(3, 3, 1, Poison::kNaNOneRank, std::size_t{2}),
                      std::make_tuple(4, 2, 2, Poison::kInfAllRanks, std::size_t{1003}),
                      std::make_tuple(5, 1, 2, Poison::kTimes1000, std::size_t{4099}),
                      std::make_tuple(3, 2, 1, Poison::kNone, std::size_t{4099})),
    networked_case_name);

TEST(NetworkedGuard, EverySiteBadThrowsOnEveryRank) {
  Watchdog watchdog(60s);
  auto input = [](int, int) { return std::vector<float>(64, kNaN); };
  try {
    run_world(3, 2, 1, input, true);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string m = e.message();
    for (const char* part :
         {"step 11", "'u'", "east: 64 of 64 values non-finite", "north: 64 of 64"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " in " << m;
  }
}

// Not a pass/fail check: what the guard's extra exchange costs per average over loopback.
TEST(NetworkedGuard, CostOfTheHealthExchange) {
  Watchdog watchdog(120s);
  for (const std::size_t n : {std::size_t{1024}, std::size_t{1} << 20}) {
    auto input = [n](int s, int) {
      std::vector<float> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = healthy(s, i);
      return v;
    };
    const double off = run_world(3, 2, 1, input, false, 15).seconds_per_average;
    const double on = run_world(3, 2, 1, input, true, 15).seconds_per_average;
    std::printf(
        "[ cost     ] 3 sites x 2 ranks, %zu floats: %.1f us without the guard, %.1f us "
        "with it (+%.1f us)\n",
        n, off * 1e6, on * 1e6, (on - off) * 1e6);
  }
  std::vector<float> big(std::size_t{1} << 24, 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  const auto h = sync::measure_payload(big);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(h.sum_squares, double(big.size()));
  std::printf("[ cost     ] measure_payload: %.2f GB/s over 64 MiB\n", 64.0 * 1.048576e-3 / s);
}

// The control exchange: a step where x, u and v are all due (and a stop request rides along)
// costs one all-gather inside the site and one over the WAN per rank, not one pair per state
// plus a stop all-reduce; every rank learns of the one rank that asked to stop, and every rank
// takes the same decision on the poisoned site's u that the VirtualAverager takes.
TEST(NetworkedGuard, OneControlExchangeCarriesEveryDueStateAndTheStopRequest) {
  Watchdog watchdog(90s);
  constexpr int S = 3, R = 2;
  constexpr std::size_t n = 2048;
  const sync::SyncPolicy policy(
      {.method = SyncMethod::kDesloc, .sites = S, .kx = 2, .ku = 2, .kv = 2});
  ASSERT_TRUE(policy.at(2).x && policy.at(2).u && policy.at(2).v);
  test_support::WorldOptions world;
  world.collective.deadline = 20s;
  struct Seen {
    bool stop = false;
    std::uint64_t wan_gathers = 0, site_gathers = 0, wan_reduces = 0;
    std::vector<sync::Rejection> rejected;
    std::vector<float> u;
  };
  std::vector<Seen> seen(std::size_t(S * R));
  auto value = [](int s, std::size_t i, int k) {
    return 0.01f * float(k + 1) * healthy(s, i) + (k == 2 ? 1.0f : 0.0f);  // v > 0
  };
  test_support::run_world(S, R, world, [&](int s, int r, test_support::Groups& groups) {
    sync::CollectiveAverager avg(*groups.wan, groups.site.get());
    sync::PayloadGuard g;
    g.site_names = {"east", "west", "north"};
    avg.set_payload_guard(g);
    optim::Optimizer opt(optim::OptimizerConfig{}, n);
    std::vector<float> x(n), grad(n);
    for (std::size_t i = 0; i < n; ++i) {
      x[i] = value(s, i, 0);
      opt.state().u[i] = value(s, i, 1) * (s == 2 ? 1e4f : 1.0f);  // north's u is absurd
      opt.state().v[i] = value(s, i, 2);
    }
    std::vector<sync::Replica> replicas{{x, grad, &opt}};
    sync::SyncEngine engine(policy);
    engine.begin(2, avg);
    const bool stop = engine.finish(replicas, /*stop=*/s == 1 && r == 1);
    auto& me = seen[std::size_t(s * R + r)];
    me.stop = stop;
    me.wan_gathers = groups.wan->bytes()[transport::CollectiveOp::kAllGather].calls;
    me.site_gathers = groups.site->bytes()[transport::CollectiveOp::kAllGather].calls;
    me.wan_reduces = groups.wan->bytes()[transport::CollectiveOp::kAllReduce].calls;
    me.rejected = avg.rejections();
    me.u = opt.state().u;
  });
  for (std::size_t i = 0; i < seen.size(); ++i) {
    SCOPED_TRACE("rank " + std::to_string(i));
    EXPECT_TRUE(seen[i].stop);
    EXPECT_EQ(seen[i].wan_gathers, 1u);       // the control exchange only
    EXPECT_EQ(seen[i].site_gathers, 1u + 3);  // it, then the shards of x, u and v
    EXPECT_EQ(seen[i].wan_reduces, 3u);       // x, u, v
    ASSERT_EQ(seen[i].rejected.size(), 1u);
    EXPECT_EQ(seen[i].rejected[0].site, 2);
    EXPECT_EQ(seen[i].rejected[0].state, StateKind::kU);
    EXPECT_EQ(seen[i].u, seen[0].u);
  }
  // The healthy sites' mean, as the ring-ordered VirtualAverager computes it.
  std::vector<std::vector<float>> u(S, std::vector<float>(n));
  for (int s = 0; s < S; ++s)
    for (std::size_t i = 0; i < n; ++i)
      u[std::size_t(s)][i] = value(s, i, 1) * (s == 2 ? 1e4f : 1.0f);
  std::vector<std::span<float>> views(u.begin(), u.end());
  sync::VirtualAverager virt(S, sync::SumOrder::kRing, R);
  virt.set_payload_guard(sync::PayloadGuard{});
  virt.begin_step(2);
  virt.average(StateKind::kU, views);
  EXPECT_EQ(seen[0].u, u[0]);
}

// With delayed averages the control exchange's wide-area half runs on the communication thread
// (Averager::open_control / close_control): the step that starts the averages waits for no
// WAN round trip, and what the exchange decided (the stop agreement, the guard's rejection)
// arrives on every rank at the step the batch is settled, here its fold two steps later. The
// folded moments equal the in-process engine's (VirtualAverager) bit for bit.
TEST(NetworkedGuard, ADelayedBatchsControlAnswerArrivesWhereItIsSettled) {
  Watchdog watchdog(90s);
  constexpr int S = 3, R = 2;
  constexpr std::size_t n = 2048;
  const sync::SyncPolicy policy(
      {.method = SyncMethod::kDesloc, .sites = S, .kx = 4, .ku = 4, .kv = 4});
  sync::StepOptions opts;
  opts.overlap = sync::Overlap::kDelayed;
  opts.delay.fill(2);
  auto value = [](int s, std::size_t i, int k) {
    return 0.01f * float(k + 1) * healthy(s, i) + (k == 2 ? 1.0f : 0.0f);  // v > 0
  };
  struct Site {
    optim::Optimizer opt{optim::OptimizerConfig{}, n};
    std::vector<float> x = std::vector<float>(n), grad = std::vector<float>(n);
    explicit Site(int s, decltype(value)& v) {
      for (std::size_t i = 0; i < n; ++i) {
        x[i] = v(s, i, 0);
        opt.state().u[i] = v(s, i, 1) * (s == 2 ? 1e4f : 1.0f);  // north's u is absurd
        opt.state().v[i] = v(s, i, 2);
      }
    }
  };
  struct Seen {
    std::vector<int> stop_at;              // steps whose finish() reported the stop
    std::vector<std::size_t> rejected_by;  // rejections() after each step 4..6
    std::vector<sync::Rejection> rejected;
    std::uint64_t wan_gathers = 0;
    std::vector<std::vector<float>> x, u, v;  // per replica
  };
  const auto run = [&](sync::Averager& avg, std::span<sync::Replica> replicas, bool stop) {
    Seen me;
    sync::SyncEngine engine(policy, opts);
    for (std::int64_t t = 4; t <= 6; ++t) {
      engine.begin(t, avg, replicas, stop);
      if (engine.finish(replicas, stop)) me.stop_at.push_back(int(t));
      me.rejected_by.push_back(avg.rejections().size());
    }
    me.rejected = avg.rejections();
    for (const sync::Replica& w : replicas) {
      me.x.emplace_back(w.x.begin(), w.x.end());
      me.u.push_back(w.opt->state().u);
      me.v.push_back(w.opt->state().v);
    }
    return me;
  };
  test_support::WorldOptions world;
  world.collective.deadline = 20s;
  std::vector<Seen> seen(std::size_t(S * R));
  test_support::run_world(S, R, world, [&](int s, int r, test_support::Groups& groups) {
    sync::CollectiveAverager avg(*groups.wan, groups.site.get());
    sync::PayloadGuard g;
    g.site_names = {"east", "west", "north"};
    avg.set_payload_guard(g);
    Site site(s, value);
    std::vector<sync::Replica> replicas{{site.x, site.grad, &site.opt}};
    Seen me = run(avg, replicas, /*stop=*/s == 1 && r == 1);
    me.wan_gathers = groups.wan->bytes()[transport::CollectiveOp::kAllGather].calls;
    seen[std::size_t(s * R + r)] = std::move(me);
  });
  // In one process: the three sites as replicas of one engine.
  std::vector<std::unique_ptr<Site>> sites;
  std::vector<sync::Replica> replicas;
  for (int s = 0; s < S; ++s) {
    sites.push_back(std::make_unique<Site>(s, value));
    replicas.push_back({sites.back()->x, sites.back()->grad, &sites.back()->opt});
  }
  sync::VirtualAverager virt(S, sync::SumOrder::kRing, R);
  virt.set_payload_guard(sync::PayloadGuard{});
  const Seen one = run(virt, replicas, /*stop=*/false);
  for (std::size_t i = 0; i < seen.size(); ++i) {
    SCOPED_TRACE("rank " + std::to_string(i));
    EXPECT_EQ(seen[i].stop_at, std::vector<int>({6}));  // settled at the fold, not at step 4
    EXPECT_EQ(seen[i].rejected_by, std::vector<std::size_t>({0, 0, 1}));
    ASSERT_EQ(seen[i].rejected.size(), 1u);
    EXPECT_EQ(seen[i].rejected[0].site, 2);
    EXPECT_EQ(seen[i].rejected[0].state, StateKind::kU);
    EXPECT_EQ(seen[i].rejected[0].step, 4);
    EXPECT_EQ(seen[i].wan_gathers, 1u);  // the control exchange, on the thread
    // Each site keeps its own progress: rank (s, r) holds replica s of the in-process run.
    const std::size_t site = i / R;
    EXPECT_EQ(seen[i].x[0], one.x[site]);
    EXPECT_EQ(seen[i].u[0], one.u[site]);
    EXPECT_EQ(seen[i].v[0], one.v[site]);
  }
  EXPECT_EQ(one.rejected_by, std::vector<std::size_t>({0, 0, 1}));
  EXPECT_TRUE(one.stop_at.empty());
  EXPECT_NE(one.u[0], Site(0, value).opt.state().u);  // the fold happened
}
