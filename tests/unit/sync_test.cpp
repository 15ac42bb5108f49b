// SyncPolicy schedules, the exact virtual-worker average, the outer optimizer, the order of
// the DES-LOC step on a hand-computed two-worker quadratic, and [sync] config errors.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/sync/averager.hpp"
#include "desloc/sync/compression.hpp"
#include "desloc/sync/outer_optimizer.hpp"
#include "desloc/sync/regional_averager.hpp"
#include "desloc/sync/sync_engine.hpp"
#include "desloc/sync/sync_policy.hpp"
#include "desloc/sync/synced_step.hpp"
#include "desloc/train/config.hpp"
#include "desloc/transport/ring_order.hpp"

using namespace desloc;
using desloc::SyncMethod;
using optim::StateKind;
using sync::SyncConfig;
using sync::SyncPolicy;

namespace {
std::vector<std::int64_t> steps_where(const SyncPolicy& p, std::int64_t upto,
                                      bool sync::SyncDecision::*field) {
  std::vector<std::int64_t> out;
  for (std::int64_t t = 0; t <= upto; ++t)
    if (p.at(t).*field) out.push_back(t);
  return out;
}
using V = std::vector<std::int64_t>;
}  // namespace

TEST(SyncPolicy, DeslocDefaultsAreThreeAndSixKx) {
  const SyncPolicy p({.method = SyncMethod::kDesloc, .kx = 4});
  EXPECT_EQ(steps_where(p, 24, &sync::SyncDecision::x), (V{4, 8, 12, 16, 20, 24}));
  EXPECT_EQ(steps_where(p, 24, &sync::SyncDecision::u), (V{12, 24}));
  EXPECT_EQ(steps_where(p, 24, &sync::SyncDecision::v), (V{24}));
  EXPECT_TRUE(steps_where(p, 24, &sync::SyncDecision::grad).empty());
}

TEST(SyncPolicy, PhasesShiftEachState) {
  const SyncPolicy p({.method = SyncMethod::kDesloc,
                      .kx = 4,
                      .ku = 6,
                      .kv = 8,
                      .phase_x = 1,
                      .phase_u = 2,
                      .phase_v = 7});
  EXPECT_EQ(steps_where(p, 24, &sync::SyncDecision::x), (V{1, 5, 9, 13, 17, 21}));
  EXPECT_EQ(steps_where(p, 24, &sync::SyncDecision::u), (V{2, 8, 14, 20}));
  EXPECT_EQ(steps_where(p, 24, &sync::SyncDecision::v), (V{7, 15, 23}));
}

TEST(SyncPolicy, FamilyMembers) {
  const SyncPolicy ddp({.method = SyncMethod::kDdp});
  EXPECT_EQ(steps_where(ddp, 3, &sync::SyncDecision::grad), (V{1, 2, 3}));
  EXPECT_FALSE(ddp.at(2).x);
  const SyncPolicy favg({.method = SyncMethod::kFavg, .kx = 3});
  EXPECT_EQ(steps_where(favg, 9, &sync::SyncDecision::x), (V{3, 6, 9}));
  EXPECT_TRUE(steps_where(favg, 9, &sync::SyncDecision::u).empty());
  const SyncPolicy reset({.method = SyncMethod::kFavgReset, .kx = 3});
  EXPECT_EQ(steps_where(reset, 9, &sync::SyncDecision::reset_uv), (V{3, 6, 9}));
  const SyncPolicy local({.method = SyncMethod::kLocalAdam, .kx = 5});
  EXPECT_EQ(steps_where(local, 10, &sync::SyncDecision::v), (V{5, 10}));
  EXPECT_EQ(steps_where(local, 10, &sync::SyncDecision::u), (V{5, 10}));
  const SyncPolicy none({.method = SyncMethod::kNone, .kx = 1});
  EXPECT_FALSE(none.at(1).any());
}

TEST(SyncPolicy, TrafficPerStepMatchesThePaper) {
  // DES-LOC at Ku = 3Kx, Kv = 6Kx sends 1.5/Kx model sizes per step: 170x less than DDP at
  // Kx = 256 and half of Local Adam's 3/Kx.
  const SyncPolicy desloc({.method = SyncMethod::kDesloc, .kx = 256});
  const SyncPolicy local({.method = SyncMethod::kLocalAdam, .kx = 256});
  const SyncPolicy ddp({.method = SyncMethod::kDdp});
  EXPECT_NEAR(desloc.state_syncs_per_step(), 1.5 / 256, 1e-12);
  EXPECT_NEAR(ddp.state_syncs_per_step() / desloc.state_syncs_per_step(), 170.67, 0.01);
  EXPECT_NEAR(local.state_syncs_per_step() / desloc.state_syncs_per_step(), 2.0, 1e-12);
}

TEST(VirtualAverager, ExactMeanForWorldSizesAndLengths) {
  for (int M : {1, 2, 3, 5}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001}}) {
      std::vector<std::vector<float>> data(static_cast<std::size_t>(M), std::vector<float>(n));
      // Replica w holds i + w: the mean is i + (M-1)/2, exactly representable.
      for (int w = 0; w < M; ++w)
        for (std::size_t i = 0; i < n; ++i) data[w][i] = float(i) + float(w);
      std::vector<std::span<float>> views(data.begin(), data.end());
      sync::VirtualAverager avg(M);
      avg.average(StateKind::kU, views);
      for (int w = 0; w < M; ++w)
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_EQ(data[w][i], float(i) + float(M - 1) / 2.0f) << M << " " << n;
      // Ring all-reduce: 2(M-1)/M of the payload on the wire, per worker.
      const std::uint64_t payload = M > 1 ? n * 4 : 0;
      EXPECT_EQ(avg.traffic(0).payload[2], payload);
      EXPECT_EQ(avg.traffic(M - 1).wire[2],
                M > 1 ? n * 4 * 2 * std::uint64_t(M - 1) / std::uint64_t(M) : 0);
      EXPECT_EQ(avg.traffic(0).payload[1], 0u);
    }
  }
}

// sync.weights = "tokens": sites of 3, 1 and 2 units of tokens per step. Each contribution is
// scaled by w * kept / W before the sum (1.5, 0.5 and 1, exact here), so the mean is the
// weighted one, exactly, in either sum order; equal weights change no bit; a site the payload
// guard leaves out takes its weight out of the divisor.
TEST(VirtualAverager, TokenWeightsGiveTheMeanOverEveryToken) {
  for (const sync::SumOrder order : {sync::SumOrder::kExact, sync::SumOrder::kRing}) {
    std::vector<std::vector<float>> r{std::vector<float>(5, 1.0f), std::vector<float>(5, 4.0f),
                                      std::vector<float>(5, 7.0f)};
    std::vector<std::span<float>> views(r.begin(), r.end());
    sync::VirtualAverager avg(3, order, 2);
    avg.set_weights({3, 1, 2});
    avg.average(StateKind::kX, views);
    for (const auto& x : r) EXPECT_EQ(x, std::vector<float>(5, 3.5f));  // (3 + 4 + 14) / 6
  }
  auto messy = [](int site, std::size_t i) {
    const auto h = static_cast<std::uint32_t>((i * 2654435761u) ^ (unsigned(site + 1) * 40503u));
    return std::ldexp(static_cast<float>(h % 100003) - 50001.0f, -int(h % 7) - 14);
  };
  std::vector<std::vector<float>> plain(3, std::vector<float>(101)), alike;
  for (int s = 0; s < 3; ++s)
    for (std::size_t i = 0; i < 101; ++i) plain[std::size_t(s)][i] = messy(s, i);
  alike = plain;
  std::vector<std::span<float>> pv(plain.begin(), plain.end()), av(alike.begin(), alike.end());
  sync::VirtualAverager unweighted(3, sync::SumOrder::kRing, 2, 2);
  sync::VirtualAverager equal(3, sync::SumOrder::kRing, 2, 2);
  equal.set_weights({4096, 4096, 4096});
  unweighted.average(StateKind::kU, pv);
  equal.average(StateKind::kU, av);
  EXPECT_EQ(0, std::memcmp(plain[0].data(), alike[0].data(), 101 * sizeof(float)));

  // Site 1's NaN leaves it out: (3 * 1 + 2 * 7) / 5, not / 6.
  std::vector<std::vector<float>> g{std::vector<float>(4, 1.0f), std::vector<float>(4, 4.0f),
                                    std::vector<float>(4, 7.0f)};
  g[1][2] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::span<float>> gv(g.begin(), g.end());
  sync::VirtualAverager guarded(3, sync::SumOrder::kRing);
  guarded.set_weights({3, 1, 2});
  guarded.average(StateKind::kX, gv);
  ASSERT_EQ(guarded.rejections().size(), 1u);
  for (const auto& x : g)
    for (float v : x) EXPECT_NEAR(v, 17.0f / 5.0f, 1e-6f);

  sync::VirtualAverager wrong(3, sync::SumOrder::kRing);
  wrong.set_weights({1, 2});
  EXPECT_THROW(wrong.average(StateKind::kX, gv), Error);
}

TEST(VirtualAverager, RejectsMismatchedReplicas) {
  sync::VirtualAverager avg(2);
  std::vector<float> a(3), b(4);
  std::vector<std::span<float>> v{a, b};
  EXPECT_THROW(avg.average(StateKind::kX, v), Error);
  std::vector<std::span<float>> one{a};
  EXPECT_THROW(avg.average(StateKind::kX, one), Error);
}

TEST(OuterNesterov, UnitLrZeroMomentumIsPlainAveraging) {
  sync::OuterNesterov outer(1.0f, 0.0f);
  std::vector<float> x0 = {1.0f, 2.0f};
  outer.reset(x0);
  std::vector<float> mean = {0.5f, 3.0f};
  outer.step(mean);
  EXPECT_EQ(mean, (std::vector<float>{0.5f, 3.0f}));
}

TEST(OuterNesterov, MomentumFollowsTheFormula) {
  sync::OuterNesterov outer(0.5f, 0.9f);
  std::vector<float> x0 = {1.0f};
  outer.reset(x0);
  std::vector<float> mean = {0.0f};  // delta = 1, m = 1, x = 1 - 0.5 (1 + 0.9) = 0.05
  outer.step(mean);
  EXPECT_NEAR(mean[0], 0.05f, 1e-6);
  mean = {0.05f};  // delta = 0, m = 0.9, x = 0.05 - 0.5 * 0.81 = -0.355
  outer.step(mean);
  EXPECT_NEAR(mean[0], -0.355f, 1e-6);
}

// Two workers minimise f_w(x) = (x - c_w)^2 / 2 with c = (-0.25, 3), from x = 0, Kx = 2 (favg),
// with an optimizer whose step is lr * g / (|g| + eps) (AdamW with beta1 = beta2 = 0, no bias
// correction): a signed step we can follow by hand.
//   t = 1: g = (0.25, -3)            -> x = (-0.5, 0.5)
//   t = 2: g at the UN-averaged x: g0 = -0.5 + 0.25 = -0.25 (< 0), g1 = -2.5;
//          x averaged to (0, 0), then updated with those g: x = (+0.5, +0.5).
// Had the gradient been taken after the average, g0 = 0.25 and x0 would end at -0.5; had the
// update come before the average, both would end at 0.
TEST(SyncedStep, OrderIsGradientThenAverageThenUpdate) {
  optim::OptimizerConfig sign{.algorithm = optim::Algorithm::kAdamW,
                              .beta1 = 0.0f,
                              .beta2 = 0.0f,
                              .eps = 1e-12f,
                              .weight_decay = 0.0f,
                              .bias_correction = false};
  optim::Optimizer o0(sign, 1), o1(sign, 1);
  std::vector<float> x0 = {0.0f}, x1 = {0.0f}, g0(1), g1(1);
  std::vector<sync::Replica> reps{{x0, g0, &o0}, {x1, g1, &o1}};
  const float c[2] = {-0.25f, 3.0f};
  auto grad = [&](std::size_t w) { reps[w].g[0] = reps[w].x[0] - c[w]; };
  const SyncPolicy policy({.method = SyncMethod::kFavg, .sites = 2, .kx = 2});
  sync::VirtualAverager avg(2);
  auto r1 = sync::run_synced_step(1, policy, avg, reps, grad, 0.5f);
  EXPECT_FALSE(r1.due.x);
  EXPECT_NEAR(x0[0], -0.5f, 1e-6);
  EXPECT_NEAR(x1[0], 0.5f, 1e-6);
  auto r2 = sync::run_synced_step(2, policy, avg, reps, grad, 0.5f);
  EXPECT_TRUE(r2.due.x);
  EXPECT_NEAR(x0[0], 0.5f, 1e-6);
  EXPECT_NEAR(x1[0], 0.5f, 1e-6);
  EXPECT_EQ(avg.traffic(0).payload[1], 4u);  // one float of x, once
}

TEST(SyncedStep, MomentumBoundNeverTouchesWhatAdamProducesAndTamesAForeignMomentum) {
  optim::OptimizerConfig cfg;  // adamw, b1 = 0.9, b2 = 0.95
  const std::size_t n = 256;
  optim::Optimizer opt(cfg, n);
  std::vector<float> x(n, 0.5f), g(n);
  std::uint32_t seed = 7;
  auto rnd = [&] {
    seed = seed * 1664525u + 1013904223u;
    return static_cast<float>(seed >> 8) / 16777216.0f - 0.5f;
  };
  // 200 Adam steps with gradients of every scale, and some coordinates that see one large
  // gradient and then none (the worst case for |u| / sqrt(v)).
  for (int t = 0; t < 200; ++t) {
    for (std::size_t i = 0; i < n; ++i)
      g[i] = i % 7 == 0 ? (t == 3 ? 100.0f : 0.0f) : rnd() * std::pow(10.0f, float(i % 5) - 2);
    opt.step(x, g, 1e-3f);
  }
  std::vector<float> zeros(n);
  std::vector<sync::Replica> replicas{{x, zeros, &opt}};
  const std::vector<float> before = opt.state().u;
  sync::bound_momentum(replicas);
  EXPECT_EQ(opt.state().u, before) << "an Adam-produced u must never be clamped";

  // Another site's momentum for coordinates this site's v knows nothing of: it would be a
  // step of lr * u / eps; bounded, it is at most C * lr.
  opt.state().u[1] = 0.3f;
  opt.state().v[1] = 0.0f;
  opt.state().u[2] = -0.3f;
  opt.state().v[2] = 1e-4f;
  sync::bound_momentum(replicas);
  EXPECT_EQ(opt.state().u[1], 0.0f);
  const float c = 1.0001f * 0.1f / std::sqrt(0.05f * (1.0f - 0.81f / 0.95f));
  EXPECT_NEAR(opt.state().u[2], -c * 1e-2f, 1e-6f);

  // ADOPT's step does not divide by sqrt(v): left alone.
  optim::OptimizerConfig adopt_cfg;
  adopt_cfg.algorithm = optim::Algorithm::kAdopt;
  optim::Optimizer adopt(adopt_cfg, n);
  adopt.state().u.assign(n, 0.3f);
  std::vector<sync::Replica> adopt_replicas{{x, zeros, &adopt}};
  sync::bound_momentum(adopt_replicas);
  EXPECT_EQ(adopt.state().u, std::vector<float>(n, 0.3f));
}

TEST(SyncedStep, ResetZeroesMomentsAfterTheAverage) {
  optim::OptimizerConfig cfg{.algorithm = optim::Algorithm::kAdamW, .weight_decay = 0.0f};
  optim::Optimizer o0(cfg, 2), o1(cfg, 2);
  std::vector<float> x0 = {1, 2}, x1 = {3, 4}, g0(2), g1(2);
  std::vector<sync::Replica> reps{{x0, g0, &o0}, {x1, g1, &o1}};
  auto grad = [&](std::size_t w) { std::fill(reps[w].g.begin(), reps[w].g.end(), 1.0f); };
  const SyncPolicy policy({.method = SyncMethod::kFavgReset, .sites = 2, .kx = 1});
  sync::VirtualAverager avg(2);
  sync::run_synced_step(1, policy, avg, reps, grad, 0.1f, {.reset_step_count = true});
  // u was zeroed before the update, so after it u = (1 - beta1) g exactly.
  EXPECT_NEAR(o0.state().u[0], 0.1f, 1e-7);
  EXPECT_EQ(o0.state().t, 1);
  EXPECT_EQ(x0, x1);
}

// Fragment f of P is due at t when (t - phase - floor(f K / P)) mod K == 0: every fragment
// exactly once per period, fragment 0 on the unfragmented schedule, P = 1 the plain schedule.
TEST(SyncPolicy, FragmentsAreStaggeredOverEachPeriod) {
  for (std::int64_t k = 1; k <= 24; ++k)
    for (int p = 1; p <= k; ++p)
      for (std::int64_t phase = 0; phase < k; phase += 5) {
        std::vector<int> seen(static_cast<std::size_t>(p), 0);
        for (std::int64_t t = 1; t <= 3 * k; ++t) {
          const int f = due_fragment(t, k, phase, p);
          if (p == 1) {
            ASSERT_EQ(f == 0, due_at(t, k, phase)) << k << " " << t;
          }
          if (f < 0) continue;
          ASSERT_LT(f, p);
          ++seen[static_cast<std::size_t>(f)];
          ASSERT_EQ(((t - phase - f * k / p) % k + k) % k, 0) << k << " " << p << " " << t;
          if (f == 0) {
            ASSERT_TRUE(due_at(t, k, phase));
          }
        }
        for (const int n : seen) ASSERT_EQ(n, 3) << "K " << k << " P " << p;
      }
  // No overflow at the largest period the config takes.
  const std::int64_t big = INT64_MAX / 6;
  EXPECT_EQ(due_fragment(big, big, 0, 1 << 20), 0);
  EXPECT_EQ(due_fragment(big - 1, big, 0, 1 << 20), -1);
  EXPECT_EQ(due_fragment(big / 2 + 1, big, 1, 2), 1);

  const SyncPolicy p({.method = SyncMethod::kDesloc, .kx = 4, .ku = 8, .kv = 12, .fragments = 4});
  EXPECT_EQ(steps_where(p, 8, &sync::SyncDecision::x), (V{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(steps_where(p, 16, &sync::SyncDecision::u), (V{2, 4, 6, 8, 10, 12, 14, 16}));
  EXPECT_EQ(steps_where(p, 12, &sync::SyncDecision::v), (V{3, 6, 9, 12}));
  std::vector<int> fx, fu;
  for (std::int64_t t = 1; t <= 8; ++t) {
    fx.push_back(p.at(t).frag_x);
    if (p.at(t).u) fu.push_back(p.at(t).frag_u);
  }
  EXPECT_EQ(fx, (std::vector<int>{1, 2, 3, 0, 1, 2, 3, 0}));
  EXPECT_EQ(fu, (std::vector<int>{1, 2, 3, 0}));
  EXPECT_EQ(p.at(6).frag_v, 2);
  EXPECT_NEAR(p.state_syncs_per_step(), 1.0 / 4 + 1.0 / 8 + 1.0 / 12, 1e-12);
  // u and v cut Ku / Kx and Kv / Kx times finer: a fragment of every state on every x
  // fragment's step.
  const SyncPolicy even({.method = SyncMethod::kDesloc,
                         .kx = 4,
                         .fragments = 2,
                         .fragments_u = 6,
                         .fragments_v = 12});
  for (std::int64_t t = 1; t <= 48; ++t) {
    const auto d = even.at(t);
    EXPECT_EQ(d.x, t % 2 == 0) << t;
    EXPECT_EQ(d.u, d.x) << t;
    EXPECT_EQ(d.v, d.x) << t;
    EXPECT_EQ(d.parts_u, 6);
    EXPECT_EQ(d.parts_v, 12);
    if (d.x) {
      EXPECT_EQ(d.frag_u, (t / 2) % 6) << t;
      EXPECT_EQ(d.frag_v, (t / 2) % 12) << t;
    }
  }
}

// Unequal sites (sync.weights = "tokens", 6, 1 and 8 tokens a step): with kx = 1, DES-LOC's
// average of x at a step is the token-weighted mean computed by hand, not the plain one; under
// DDP the gradient's is.
TEST(SyncEngine, UnequalSitesAverageToTheTokenWeightedMean) {
  const std::size_t n = 4;
  optim::OptimizerConfig cfg{.algorithm = optim::Algorithm::kAdamW, .weight_decay = 0.0f};
  for (const SyncMethod method : {SyncMethod::kDesloc, SyncMethod::kDdp}) {
    const SyncPolicy policy({.method = method, .sites = 3, .kx = 1});
    std::vector<optim::Optimizer> opts{optim::Optimizer(cfg, n), optim::Optimizer(cfg, n),
                                       optim::Optimizer(cfg, n)};
    std::vector<std::vector<float>> xs = {{1, 2, 3, 4}, {5, -6, 7, 8}, {-9, 10, 11, 12}};
    std::vector<std::vector<float>> gs = xs;
    std::vector<sync::Replica> reps;
    for (std::size_t w = 0; w < 3; ++w) reps.push_back({xs[w], gs[w], &opts[w]});
    sync::VirtualAverager avg(3, sync::SumOrder::kRing, 2, 2);
    avg.set_weights({6, 1, 8});
    sync::SyncEngine engine(policy);
    engine.begin(1, avg);
    engine.finish(reps);
    const auto& averaged = method == SyncMethod::kDdp ? gs : xs;
    for (std::size_t i = 0; i < n; ++i) {
      const std::vector<float> before = {std::vector<float>{1, 2, 3, 4}[i],
                                         std::vector<float>{5, -6, 7, 8}[i],
                                         std::vector<float>{-9, 10, 11, 12}[i]};
      const double weighted = (6.0 * before[0] + 1.0 * before[1] + 8.0 * before[2]) / 15.0;
      const double plain = (before[0] + before[1] + before[2]) / 3.0;
      for (std::size_t w = 0; w < 3; ++w) {
        EXPECT_NEAR(averaged[w][i], weighted, 2e-6 * 12) << to_string(method) << " " << i;
        EXPECT_GT(std::abs(averaged[w][i] - plain), 0.1) << to_string(method) << " " << i;
      }
    }
  }
}

// With fragments each average replaces one block of the state and leaves the rest alone; the
// step-overlapped and blocking engines agree bit for bit, and a delayed fragment is folded
// into its own block only.
TEST(SyncEngine, FragmentsAverageOneBlockAtATime) {
  const std::size_t n = 5;  // blocks of 3 and 2
  optim::OptimizerConfig cfg{.algorithm = optim::Algorithm::kAdamW, .weight_decay = 0.0f};
  const SyncPolicy policy({.method = SyncMethod::kLocalAdam, .sites = 2, .kx = 4, .fragments = 2});
  {
    optim::Optimizer o0(cfg, n), o1(cfg, n);
    std::vector<float> x0 = {1, 2, 3, 4, 5}, x1 = {3, 4, 5, 6, 7}, g0(n), g1(n);
    std::vector<sync::Replica> reps{{x0, g0, &o0}, {x1, g1, &o1}};
    sync::VirtualAverager avg(2);
    sync::SyncEngine engine(policy);
    engine.begin(2, avg);  // fragment 1: elements 3 and 4
    engine.finish(reps);
    EXPECT_EQ(x0, (std::vector<float>{1, 2, 3, 5, 6}));
    EXPECT_EQ(x1, (std::vector<float>{3, 4, 5, 5, 6}));
    EXPECT_EQ(avg.traffic(0).payload[static_cast<std::size_t>(StateKind::kX)], 2 * sizeof(float));
    engine.begin(4, avg);  // fragment 0
    engine.finish(reps);
    EXPECT_EQ(x0, (std::vector<float>{2, 3, 4, 5, 6}));
    EXPECT_EQ(x0, x1);
    EXPECT_EQ(avg.traffic(0).payload[static_cast<std::size_t>(StateKind::kX)], 5 * sizeof(float));
  }
  // Three engines on the same trajectory: blocking, step-overlapped, delayed (tau = 1).
  auto run = [&](sync::Overlap overlap, std::int64_t steps) {
    std::vector<std::vector<float>> xs = {{0.5f, -1, 2, 0.25f, 3}, {1.5f, 1, -2, 0.75f, -3}};
    std::vector<std::vector<float>> gs(2, std::vector<float>(n));
    std::vector<optim::Optimizer> opts{optim::Optimizer(cfg, n), optim::Optimizer(cfg, n)};
    std::vector<sync::Replica> reps{{xs[0], gs[0], &opts[0]}, {xs[1], gs[1], &opts[1]}};
    sync::VirtualAverager avg(2, sync::SumOrder::kRing);
    sync::StepOptions so;
    so.overlap = overlap;
    so.delay = {0, 1, 1, 1};
    sync::SyncEngine engine(policy, so);
    for (std::int64_t t = 1; t <= steps; ++t) {
      engine.begin(t, avg, reps, false);
      for (std::size_t w = 0; w < 2; ++w)
        for (std::size_t i = 0; i < n; ++i)  // elementwise: a block's dynamics are its own
          gs[w][i] = (w == 0 ? 1.0f : -0.5f) * xs[w][i] + 0.1f * float(i);
      engine.finish(reps);
      engine.update(reps, 0.01f);
    }
    return xs;
  };
  EXPECT_EQ(run(sync::Overlap::kNone, 9), run(sync::Overlap::kStep, 9));
  // Delayed, after step 2: fragment 1 started at step 2 is not folded yet, so the replicas
  // equal a run without averages; after step 3 (its fold) only block 1 differs from it.
  auto local = [&](std::int64_t steps) {
    std::vector<std::vector<float>> xs = {{0.5f, -1, 2, 0.25f, 3}, {1.5f, 1, -2, 0.75f, -3}};
    std::vector<std::vector<float>> gs(2, std::vector<float>(n));
    std::vector<optim::Optimizer> opts{optim::Optimizer(cfg, n), optim::Optimizer(cfg, n)};
    for (std::int64_t t = 1; t <= steps; ++t)
      for (std::size_t w = 0; w < 2; ++w) {
        for (std::size_t i = 0; i < n; ++i)
          gs[w][i] = (w == 0 ? 1.0f : -0.5f) * xs[w][i] + 0.1f * float(i);
        opts[w].step(xs[w], gs[w], 0.01f);
      }
    return xs;
  };
  EXPECT_EQ(run(sync::Overlap::kDelayed, 2), local(2));
  const auto folded = run(sync::Overlap::kDelayed, 3), alone = local(3);
  for (std::size_t w = 0; w < 2; ++w) {
    for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(folded[w][i], alone[w][i]) << w << " " << i;
    for (std::size_t i = 3; i < n; ++i) EXPECT_NE(folded[w][i], alone[w][i]) << w << " " << i;
  }
}

// sync.overlap = "delayed" against a hand computation: two Adam replicas on different
// gradients, x, u and v averaged at t = 4 (local_adam, kx = 4) with tau = 2. The average starts
// from the values before step 4's update and is folded in before step 6's, after two more
// updates: x += mean(x_4) - x_4, u += b1^2 (mean(u_4) - u_4), v += b2^2 (mean(v_4) - v_4).
// The naive delay replaces the state by mean(s_4) instead.
TEST(SyncEngine, DelayedAverageFoldsTheMeanIntoTheLocalProgressAsDerived) {
  for (const bool naive : {false, true}) {
    optim::OptimizerConfig cfg{
        .algorithm = optim::Algorithm::kAdamW, .beta1 = 0.8f, .beta2 = 0.9f, .weight_decay = 0.0f};
    const std::size_t n = 5;
    optim::Optimizer o0(cfg, n), o1(cfg, n), h0(cfg, n), h1(cfg, n);
    std::vector<float> x0(n, 0.5f), x1(n, -0.25f), g0(n), g1(n);
    std::vector<float> hx0 = x0, hx1 = x1;
    std::vector<sync::Replica> reps{{x0, g0, &o0}, {x1, g1, &o1}};
    // Each worker's gradient depends on its own x, so the two trajectories differ.
    auto grad_of = [&](std::size_t w, std::span<const float> x, std::span<float> g) {
      for (std::size_t i = 0; i < n; ++i)
        g[i] = (w == 0 ? 1.0f : -2.0f) * (x[i] - 0.1f * float(i)) + 0.3f * float(w);
    };
    const SyncPolicy policy({.method = SyncMethod::kLocalAdam, .sites = 2, .kx = 4});
    sync::VirtualAverager avg(2);
    sync::StepOptions opts;
    opts.overlap = naive ? sync::Overlap::kDelayedNaive : sync::Overlap::kDelayed;
    opts.delay = {0, 2, 2, 2};
    sync::SyncEngine engine(policy, opts);
    // The hand computation: local steps, the snapshot before step 4's update, the fold before
    // step 6's.
    std::array<std::vector<float>, 2> sx, su, sv;
    optim::Optimizer* h[2] = {&h0, &h1};
    std::vector<float>* hx[2] = {&hx0, &hx1};
    const float lr = 0.05f;
    for (std::int64_t t = 1; t <= 7; ++t) {
      engine.begin(t, avg, reps, false);
      for (std::size_t w = 0; w < 2; ++w) grad_of(w, reps[w].x, reps[w].g);
      engine.finish(reps);
      engine.update(reps, lr);

      std::array<std::vector<float>, 2> hgrad;  // at the un-averaged x, as the engine's
      for (std::size_t w = 0; w < 2; ++w) {
        hgrad[w].resize(n);
        grad_of(w, *hx[w], hgrad[w]);
      }
      if (t == 4)
        for (std::size_t w = 0; w < 2; ++w) {
          sx[w] = *hx[w];
          su[w] = h[w]->state().u;
          sv[w] = h[w]->state().v;
        }
      if (t == 6) {
        const float cu = naive ? 0.0f : static_cast<float>(std::pow(0.8, 2.0));
        const float cv = naive ? 0.0f : static_cast<float>(std::pow(0.9, 2.0));
        for (std::size_t w = 0; w < 2; ++w)
          for (std::size_t i = 0; i < n; ++i) {
            const float mx = static_cast<float>((double(sx[0][i]) + sx[1][i]) / 2);
            const float mu = static_cast<float>((double(su[0][i]) + su[1][i]) / 2);
            const float mv = static_cast<float>((double(sv[0][i]) + sv[1][i]) / 2);
            auto& hs = h[w]->state();
            if (naive) {
              (*hx[w])[i] = mx;
              hs.u[i] = mu;
              hs.v[i] = mv;
            } else {
              (*hx[w])[i] += mx - sx[w][i];
              hs.u[i] += cu * (mu - su[w][i]);
              hs.v[i] = std::max(0.0f, hs.v[i] + cv * (mv - sv[w][i]));
            }
          }
      }
      for (std::size_t w = 0; w < 2; ++w) h[w]->step(*hx[w], hgrad[w], lr);
      for (std::size_t w = 0; w < 2; ++w)
        for (std::size_t i = 0; i < n; ++i) {
          EXPECT_NEAR(reps[w].x[i], (*hx[w])[i], 1e-6f) << "naive " << naive << " t " << t;
          EXPECT_NEAR(reps[w].opt->state().u[i], h[w]->state().u[i], 1e-6f) << "t " << t;
          EXPECT_NEAR(reps[w].opt->state().v[i], h[w]->state().v[i], 1e-6f) << "t " << t;
        }
      if (t == 5) {  // in flight: nothing folded yet, the replicas still differ
        EXPECT_NE(x0, x1);
      }
    }
    EXPECT_EQ(avg.traffic(0).payload[1], n * sizeof(float)) << "x averaged once";
  }
}

// Streaming DiLoCo's form of the outer step: with delayed averages of fragments, each
// fragment's outer Nesterov step is taken when its average is folded in, on the mean of its
// snapshots, and the fold carries the outer step's parameters with the local progress kept:
//   x_f <- x_f + (outer(mean(x_f at t)) - x_f at t),  outer(m) = ref - lr (d + mu (mu m0 + d)),
//   d = ref - m; the other fragment's reference and momentum do not move.
TEST(SyncEngine, DelayedFragmentsTakeTheOuterStepAtTheirFold) {
  const std::size_t n = 6;
  optim::OptimizerConfig cfg{.algorithm = optim::Algorithm::kAdamW, .weight_decay = 0.0f};
  optim::Optimizer o0(cfg, n), o1(cfg, n);
  std::vector<float> x0(n), x1(n), g0(n, 0.0f), g1(n, 0.0f);
  for (std::size_t i = 0; i < n; ++i) {
    x0[i] = 1.0f + 0.25f * float(i);
    x1[i] = -0.5f + 0.125f * float(i);
  }
  std::vector<sync::Replica> reps{{x0, g0, &o0}, {x1, g1, &o1}};
  const float outer_lr = 0.7f, mu = 0.9f;
  sync::OuterNesterov outer(outer_lr, mu);
  const std::vector<float> start(n, 0.0f);
  outer.reset(start);  // the agreed start: all zeros, so the first d is -mean
  SyncConfig sc{.method = SyncMethod::kFavg, .sites = 2, .kx = 4};
  sc.overlap = Overlap::kDelayed;
  sc.delay = 1;
  sc.fragments = 2;
  const SyncPolicy policy(sc);
  sync::VirtualAverager avg(2);
  sync::StepOptions opts = sync::step_options(policy.config(), nullptr, &outer);
  sync::SyncEngine engine(policy, opts);
  // Steps without updates (no engine.update): x moves only by the folds, and by hand between
  // the snapshot and the fold, so the local progress is known.
  std::array<std::vector<float>, 2> snap;
  std::vector<float> ref(n, 0.0f), m(n, 0.0f);
  std::vector<int> folded;  // the fragments folded, in order
  for (std::int64_t t = 1; t <= 8; ++t) {
    const auto& due = engine.begin(t, avg, reps, false);
    const bool starts = due.x;
    const int frag = due.frag_x;
    if (starts) snap = {x0, x1};
    engine.finish(reps);
    if (starts) {
      // Local progress after the snapshot, before its fold at t + 1.
      for (float& v : x0) v += 0.01f;
      for (float& v : x1) v -= 0.02f;
      const transport::Range r = transport::block(n, 2, frag);
      // The fold at t + 1, by hand.
      std::array<std::vector<float>, 2> want{x0, x1};
      for (std::size_t i = r.offset; i < r.offset + r.count; ++i) {
        const float mean = static_cast<float>((double(snap[0][i]) + snap[1][i]) / 2);
        const float d = ref[i] - mean;
        m[i] = mu * m[i] + d;
        const float x_new = ref[i] - outer_lr * (d + mu * m[i]);
        ref[i] = x_new;
        for (std::size_t w = 0; w < 2; ++w) want[w][i] += x_new - snap[w][i];
      }
      engine.begin(t + 1, avg, reps, false);
      engine.finish(reps);
      ++t;
      folded.push_back(frag);
      for (std::size_t i = 0; i < n; ++i) {
        EXPECT_NEAR(x0[i], want[0][i], 1e-6f) << "step " << t << " element " << i;
        EXPECT_NEAR(x1[i], want[1][i], 1e-6f) << "step " << t << " element " << i;
        EXPECT_EQ(outer.reference()[i], ref[i]) << "the other fragment's reference moved";
        EXPECT_EQ(outer.momentum()[i], m[i]);
      }
    }
  }
  EXPECT_EQ(folded, (std::vector<int>{1, 0, 1, 0})) << "each fragment's average, twice";
}

// A delayed fold of a quantised v can pull v below the v that bounded u (int2 sends four
// levels, none of them zero, and a small v's share of its block's scale is large): u must be
// bounded after the fold of v, as after a blocking compressed average of v. Without it, int2
// with delayed averages diverged on the e2e bed (loss 477). Gradients of scales 1e-3 to 10
// put small and large v in the same codec blocks.
TEST(SyncEngine, ADelayedFoldOfACompressedVBoundsU) {
  optim::OptimizerConfig cfg{
      .algorithm = optim::Algorithm::kAdamW, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.0f};
  const std::size_t n = 64;
  optim::Optimizer o0(cfg, n), o1(cfg, n);
  std::vector<float> x0(n, 0.0f), x1(n, 0.0f), g0(n), g1(n);
  std::vector<sync::Replica> reps{{x0, g0, &o0}, {x1, g1, &o1}};
  sync::CompressionConfig cc;
  cc.codec[static_cast<std::size_t>(optim::StateKind::kV)] = sync::Codec::kInt2;
  cc.block = 16;
  sync::CompressionState codecs(cc, n, 2);
  codecs.reset(x0);
  // DES-LOC: v folds at steps where u does not (u every 6, v every 8, at phase 3).
  const SyncPolicy policy(
      {.method = SyncMethod::kDesloc, .sites = 2, .kx = 2, .ku = 6, .kv = 8, .phase_v = 3});
  sync::VirtualAverager avg(2);
  sync::StepOptions opts;
  opts.overlap = sync::Overlap::kDelayed;
  opts.delay = {0, 1, 1, 1};
  opts.compression = &codecs;
  sync::SyncEngine engine(policy, opts);
  const float c = static_cast<float>(1.0001 * 0.1 / std::sqrt(0.05 * (1.0 - 0.81 / 0.95)));
  int v_folds = 0;
  for (std::int64_t t = 1; t <= 40; ++t) {
    engine.begin(t, avg, reps, false);
    for (std::size_t w = 0; w < 2; ++w)
      for (std::size_t i = 0; i < n; ++i)  // scales 1e-3..10; the sites' signs differ
        reps[w].g[i] = std::pow(10.0f, float(i % 5) - 3.0f) * (w == 0 ? 1.0f : -0.5f) *
                       (1.0f + 0.3f * float((t + i) % 3));
    engine.finish(reps);                           // the folds happen here, before the update
    v_folds += t > 3 && (t - 4) % 8 == 0 ? 1 : 0;  // v starts at 3, 11, ... and folds a step later
    for (std::size_t w = 0; w < 2; ++w) {
      const auto& st = reps[w].opt->state();
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_LE(std::abs(st.u[i]), c * std::sqrt(st.v[i]) * 1.0001f + 1e-30f)
            << "step " << t << " worker " << w << " element " << i << " v " << st.v[i];
    }
    engine.update(reps, 1e-3f);
  }
  EXPECT_GE(v_folds, 4);
}

// A compressed x with the outer step: after each average (blocking, and delayed at its fold)
// the codec's reference is the outer step's parameters, so the next payload is the local
// progress since the outer step (DiLoCo's pseudo-gradient), on every site alike.
TEST(SyncEngine, ACompressedXSendsItsProgressSinceTheOuterStep) {
  for (const bool delayed : {false, true}) {
    optim::OptimizerConfig cfg{.algorithm = optim::Algorithm::kAdamW, .weight_decay = 0.0f};
    const std::size_t n = 32;
    optim::Optimizer o0(cfg, n), o1(cfg, n);
    std::vector<float> x0(n, 0.0f), x1(n, 0.0f), g0(n), g1(n);
    std::vector<sync::Replica> reps{{x0, g0, &o0}, {x1, g1, &o1}};
    sync::CompressionConfig cc;
    cc.codec[static_cast<std::size_t>(optim::StateKind::kX)] = sync::Codec::kInt8;
    cc.block = 16;
    sync::CompressionState codecs(cc, n, 2);
    codecs.reset(x0);
    sync::OuterNesterov outer(0.7f, 0.9f);
    outer.reset(x0);
    SyncConfig sc{.method = SyncMethod::kFavg, .sites = 2, .kx = 4};
    if (delayed) {
      sc.overlap = Overlap::kDelayed;
      sc.delay = 1;
    }
    const SyncPolicy policy(sc);
    sync::VirtualAverager avg(2);
    sync::SyncEngine engine(policy, sync::step_options(sc, nullptr, &outer, &codecs));
    int checked = 0;
    for (std::int64_t t = 1; t <= 12; ++t) {
      engine.begin(t, avg, reps, false);
      for (std::size_t w = 0; w < 2; ++w)
        for (std::size_t i = 0; i < n; ++i)
          reps[w].g[i] = (w == 0 ? 1.0f : -0.5f) * (1.0f + 0.1f * float(i % 7));
      engine.finish(reps);
      const bool applied = delayed ? t % 4 == 1 && t > 1 : t % 4 == 0;
      if (applied) {
        EXPECT_EQ(codecs.reference(optim::StateKind::kX), outer.reference())
            << (delayed ? "delayed" : "blocking") << ", step " << t;
        ++checked;
      }
      engine.update(reps, 1e-2f);
    }
    EXPECT_EQ(checked, delayed ? 2 : 3);
  }
}

// With regions, the codec and the outer step belong to the job-wide averages: a region's
// average is the plain fp32 mean of its sites and leaves the codec's reference and the outer
// step's parameters alone; a job-wide average is compressed, takes the outer step, and leaves
// both equal to its result on every site.
TEST(SyncEngine, WithRegionsTheCodecAndTheOuterStepActOnTheJobWideAveragesOnly) {
  optim::OptimizerConfig cfg{.algorithm = optim::Algorithm::kAdamW, .weight_decay = 0.0f};
  constexpr std::size_t n = 32;
  constexpr int M = 4;
  std::vector<optim::Optimizer> opts(M, optim::Optimizer(cfg, n));
  std::vector<std::vector<float>> x(M, std::vector<float>(n, 0.0f)), g(M, std::vector<float>(n));
  std::vector<sync::Replica> reps;
  for (int w = 0; w < M; ++w) reps.push_back({x[w], g[w], &opts[w]});
  sync::CompressionConfig cc;
  cc.codec[static_cast<std::size_t>(optim::StateKind::kX)] = sync::Codec::kInt8;
  cc.block = 16;
  sync::CompressionState codecs(cc, n, M);
  codecs.reset(x[0]);
  sync::OuterNesterov outer(0.7f, 0.9f);
  outer.reset(x[0]);
  const SyncConfig sc{.method = SyncMethod::kFavg, .sites = M, .kx = 4, .region_kx = 2};
  const SyncPolicy policy(sc);
  sync::VirtualAverager global(M, sync::SumOrder::kRing);
  sync::GroupedAverager regions({{0, 1}, {2, 3}}, M, sync::ShardMap::even(1), sync::PayloadGuard{});
  sync::RegionalAverager avg(global, regions);
  sync::SyncEngine engine(policy, sync::step_options(sc, nullptr, &outer, &codecs));
  for (std::int64_t t = 1; t <= 8; ++t) {
    const std::vector<float> ref_before = codecs.reference(optim::StateKind::kX);
    const std::vector<float> outer_before = outer.reference();
    const std::vector<std::vector<float>> before = x;
    engine.begin(t, avg, reps, false);
    for (std::size_t w = 0; w < M; ++w)
      for (std::size_t i = 0; i < n; ++i)
        reps[w].g[i] =
            (1.0f + float(w)) * (w % 2 == 0 ? 1.0f : -0.3f) * (1.0f + 0.1f * float(i % 7));
    engine.finish(reps);
    if (t % 4 == 0) {  // job-wide: compressed, then the outer step, shared by every site
      for (int w = 1; w < M; ++w) EXPECT_EQ(x[w], x[0]) << "step " << t << " site " << w;
      EXPECT_EQ(x[0], outer.reference()) << "step " << t;
      EXPECT_EQ(codecs.reference(optim::StateKind::kX), outer.reference()) << "step " << t;
      EXPECT_NE(outer.reference(), outer_before) << "step " << t;
    } else if (t % 2 == 0) {  // inside each region: the fp32 mean, nothing shared moves
      for (std::size_t i = 0; i < n; ++i) {
        EXPECT_EQ(x[0][i], (before[0][i] + before[1][i]) / 2.0f) << "step " << t << " i " << i;
        EXPECT_EQ(x[2][i], (before[2][i] + before[3][i]) / 2.0f) << "step " << t << " i " << i;
      }
      EXPECT_EQ(x[1], x[0]);
      EXPECT_EQ(x[3], x[2]);
      EXPECT_NE(x[2], x[0]);
      EXPECT_EQ(codecs.reference(optim::StateKind::kX), ref_before) << "step " << t;
      EXPECT_EQ(outer.reference(), outer_before) << "step " << t;
    }
    engine.update(reps, 1e-2f);
  }
}

// Delayed averages with regions: the regions average at the start of every step they are
// due, before a job-wide average takes its snapshot, so the sites of a region start that
// average from one snapshot and fold in one correction. With the regions averaging every step,
// a region's sites then agree bit for bit after every step's folds, while the job-wide average
// (x every 4 steps, folded a step later) pulls the two regions together.
TEST(SyncEngine, DelayedAveragesWithRegionsFoldOneCorrectionPerRegion) {
  optim::OptimizerConfig cfg{.algorithm = optim::Algorithm::kAdamW, .weight_decay = 0.0f};
  constexpr std::size_t n = 16;
  constexpr int M = 4;
  std::vector<optim::Optimizer> opts(M, optim::Optimizer(cfg, n));
  std::vector<std::vector<float>> x(M, std::vector<float>(n)), g(M, std::vector<float>(n));
  std::vector<sync::Replica> reps;
  for (int w = 0; w < M; ++w) {
    for (std::size_t i = 0; i < n; ++i) x[w][i] = float(w) + 0.1f * float(i);
    reps.push_back({x[w], g[w], &opts[w]});
  }
  SyncConfig sc{.method = SyncMethod::kFavg, .sites = M, .kx = 4, .region_kx = 1};
  sc.overlap = Overlap::kDelayed;
  sc.delay = 1;
  const SyncPolicy policy(sc);
  sync::VirtualAverager global(M, sync::SumOrder::kRing);
  sync::GroupedAverager regions({{0, 1}, {2, 3}}, M, sync::ShardMap::even(1), sync::PayloadGuard{});
  sync::RegionalAverager avg(global, regions);
  sync::SyncEngine engine(policy, sync::step_options(sc, nullptr, nullptr));
  const auto gap = [&] {  // between the regions
    float most = 0.0f;
    for (std::size_t i = 0; i < n; ++i) most = std::max(most, std::abs(x[0][i] - x[2][i]));
    return most;
  };
  float before_fold = 0.0f, first = 0.0f;
  for (std::int64_t t = 1; t <= 9; ++t) {
    engine.begin(t, avg, reps, false);
    EXPECT_EQ(x[0], x[1]) << "step " << t << ": the region averaged at the step's start";
    EXPECT_EQ(x[2], x[3]) << "step " << t;
    if (t % 4 == 1 && t > 1) {
      before_fold = gap();
      if (t == 5) first = before_fold;
    }
    for (std::size_t w = 0; w < M; ++w)
      for (std::size_t i = 0; i < n; ++i)
        reps[w].g[i] = (w < 2 ? 1.0f : -0.7f) * (1.0f + 0.2f * float(w)) * float(i % 3 + 1);
    engine.finish(reps);
    EXPECT_EQ(x[0], x[1]) << "step " << t << ": one correction per region";
    EXPECT_EQ(x[2], x[3]) << "step " << t;
    if (t % 4 == 1 && t > 1) {  // the fold of the job-wide average started at t - 1
      // What is left is the one step of updates since the snapshot (lr 0.01 each way).
      EXPECT_LT(gap(), 0.025f) << "step " << t << ", " << before_fold << " before";
    }
    engine.update(reps, 1e-2f);
  }
  EXPECT_GT(first, 1.0f) << "the regions start 2 apart";
  EXPECT_GT(before_fold, 0.02f) << "the regions drift apart between the job-wide averages";
}

// A delayed average that is drained (a checkpoint after step t's update) is folded with the
// updates made so far; a state due again before its fold is refused.
TEST(SyncEngine, DelayedAveragesDrainEarlyAndRefuseAnOverlap) {
  optim::OptimizerConfig cfg{.algorithm = optim::Algorithm::kAdamW, .weight_decay = 0.0f};
  optim::Optimizer o0(cfg, 1), o1(cfg, 1);
  std::vector<float> x0 = {1.0f}, x1 = {3.0f}, g0 = {0.0f}, g1 = {0.0f};
  std::vector<sync::Replica> reps{{x0, g0, &o0}, {x1, g1, &o1}};
  const SyncPolicy policy({.method = SyncMethod::kFavg, .sites = 2, .kx = 2});
  sync::VirtualAverager avg(2);
  sync::StepOptions opts;
  opts.overlap = sync::Overlap::kDelayed;
  opts.delay = {0, 1, 1, 1};
  {
    sync::SyncEngine engine(policy, opts);
    engine.begin(1, avg, reps, false);
    engine.finish(reps);
    engine.begin(2, avg, reps, false);  // x due: starts from x = 1 and 3
    engine.finish(reps);
    x0[0] = 10.0f;  // local progress after the snapshot
    engine.drain(2, reps);
    EXPECT_EQ(x0[0], 11.0f);  // 10 + (2 - 1)
    EXPECT_EQ(x1[0], 2.0f);   // 3 + (2 - 3)
    engine.begin(3, avg, reps, false);
    engine.finish(reps);
    EXPECT_EQ(x0[0], 11.0f) << "a drained average is not folded again";
  }
  opts.delay = {0, 2, 2, 2};  // the config refuses it; the engine too
  sync::SyncEngine engine(policy, opts);
  for (std::int64_t t = 1; t <= 3; ++t) {
    engine.begin(t, avg, reps, false);
    engine.finish(reps);
  }
  try {
    engine.begin(4, avg, reps, false);
    ADD_FAILURE() << "a second average of x while the first waits for its fold";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("step 4 starts an average of 'x' while the one started at step 2 "
                               "waits for its fold at step 4"),
              std::string::npos)
        << e.message();
  }
}

namespace {
// The in-process averager, with the wide-area half of v's averages held until released: a
// slow link under one state of a batch.
class HeldV final : public sync::Averager {
 public:
  explicit HeldV(int workers) : inner_(workers) {}
  void average(StateKind kind, std::span<const std::span<float>> local) override {
    if (kind == StateKind::kV) {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return released_; });
    }
    inner_.average(kind, local);
  }
  bool exchange_control(std::span<const sync::DueAverage> due, bool stop) override {
    return inner_.exchange_control(due, stop);
  }
  int sites() const override { return inner_.sites(); }
  sync::Traffic traffic(int w) const override { return inner_.traffic(w); }
  void release() {
    const std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  bool released() {
    const std::lock_guard lock(mu_);
    return released_;
  }

 private:
  sync::VirtualAverager inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};
}  // namespace

// A batch of delayed averages (x, u and v started at one step) travels in that order; x and u
// are folded at their own steps while v is still on the wire, not after the whole batch.
TEST(SyncEngine, ADelayedFoldWaitsForItsOwnAverageOnly) {
  optim::OptimizerConfig cfg{.algorithm = optim::Algorithm::kAdamW, .weight_decay = 0.0f};
  optim::Optimizer o0(cfg, 1), o1(cfg, 1);
  std::vector<float> x0 = {1.0f}, x1 = {3.0f}, g0 = {0.0f}, g1 = {0.0f};
  o0.state().v[0] = 4.0f;
  o1.state().v[0] = 8.0f;
  std::vector<sync::Replica> reps{{x0, g0, &o0}, {x1, g1, &o1}};
  const SyncPolicy policy({.method = SyncMethod::kDesloc, .sites = 2, .kx = 4, .ku = 4, .kv = 4});
  HeldV avg(2);
  sync::StepOptions opts;
  opts.overlap = sync::Overlap::kDelayed;
  opts.delay = {0, 1, 1, 3};  // by StateKind: grad, x, u, v
  sync::SyncEngine engine(policy, opts);
  // Releases v after 3 s: a fold that waited for it would return only then.
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    avg.release();
  });
  for (std::int64_t t = 1; t <= 5; ++t) {
    engine.begin(t, avg, reps, false);
    engine.finish(reps);
  }
  EXPECT_FALSE(avg.released()) << "step 5's fold of x waited for v's average";
  EXPECT_EQ(x0[0], 2.0f);  // x folded at step 5: 1 + (2 - 1)
  EXPECT_EQ(x1[0], 2.0f);
  EXPECT_EQ(o0.state().v[0], 4.0f);  // v not yet
  for (std::int64_t t = 6; t <= 7; ++t) {
    engine.begin(t, avg, reps, false);
    engine.finish(reps);
  }
  releaser.join();
  // v folded at step 7, n = 3 steps after its snapshot, with no update meanwhile:
  // v + beta2^3 (6 - v).
  const float c = static_cast<float>(std::pow(double(cfg.beta2), 3.0));
  EXPECT_EQ(o0.state().v[0], std::max(0.0f, 4.0f + c * (6.0f - 4.0f)));
  EXPECT_EQ(o1.state().v[0], std::max(0.0f, 8.0f + c * (6.0f - 8.0f)));
}

namespace {
std::string sync_error(const std::string& body) {
  try {
    train::parse_config("[sync]\n" + body, "job.toml");
  } catch (const ConfigError& e) {
    return e.message();
  }
  return "<no error>";
}
}  // namespace

TEST(SyncConfig, BadInputNamesTheKey) {
  EXPECT_NE(sync_error("method = \"diloco\"\n")
                .find("job.toml:2:10: sync.method = \"diloco\" is not one of"),
            std::string::npos);
  EXPECT_NE(
      sync_error("method = \"desloc\"\nkx = 0\n").find("job.toml:3:6: sync.kx = 0 is out of range"),
      std::string::npos);
  EXPECT_NE(sync_error("method = \"desloc\"\nkx = -5\n").find("sync.kx"), std::string::npos);
  EXPECT_NE(
      sync_error("method = \"desloc\"\nku = 0\n").find("job.toml:3:6: sync.ku must be positive"),
      std::string::npos);
  EXPECT_NE(sync_error("method = \"desloc\"\nkv = -1\n").find("sync.kv"), std::string::npos);
  EXPECT_NE(
      sync_error("method = \"favg\"\nkv = 64\n")
          .find("job.toml:3:6: sync.kv is set, but method = \"favg\" has no separate v average"),
      std::string::npos);
  EXPECT_NE(sync_error("method = \"local_adam\"\nku = 64\n").find("sync.ku is set"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"ddp\"\nouter = \"nesterov\"\n")
                .find("job.toml:3:9: sync.outer = \"nesterov\" (outer step) with sync.method = "
                      "\"ddp\" (no parameter average) cannot be combined: it acts on the "
                      "parameter average"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"none\"\nouter = \"nesterov\"\n").find("sync.outer"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"desloc\"\nkx = 4\nphase_x = 4\n")
                .find("sync.phase_x = 4 must be smaller"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"ddp\"\noverlap = \"step\"\n")
                .find("job.toml:3:11: sync.overlap = \"step\" (step overlap) with sync.method = "
                      "\"ddp\" (no parameter average) cannot be combined: it overlaps the "
                      "averages of x, u and v with compute, and the method has none (DDP's "
                      "gradient average"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"none\"\noverlap = \"step\"\n").find("sync.overlap"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"desloc\"\noverlap = \"eager\"\n")
                .find("sync.overlap = \"eager\" is not one of"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"desloc\"\nkx = 8\noverlap = \"delayed\"\n")
                .find("job.toml:4:11: sync.overlap = \"delayed\" needs sync.delay >= 1"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"desloc\"\nkx = 8\ndelay = 2\n")
                .find("job.toml:4:9: sync.delay is set, but overlap = \"none\" has no delay"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"desloc\"\nkx = 8\noverlap = \"delayed\"\ndelay = 8\n")
                .find("job.toml:5:9: sync.delay = 8 must be smaller than the period kx = 8"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"desloc\"\nkx = 8\nkv = 16\noverlap = \"delayed\"\ndelay = 4\n"
                       "delay_v = 16\n")
                .find("job.toml:7:11: sync.delay_v = 16 must be smaller than the period kv = 16"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"local_adam\"\nkx = 8\noverlap = \"delayed\"\ndelay = 2\n"
                       "delay_u = 3\n")
                .find("sync.delay_u is set, but method = \"local_adam\" averages u and v with x"),
            std::string::npos);
  // The outer step with delayed averages and with fragments: Streaming DiLoCo's form.
  EXPECT_EQ(sync_error("method = \"desloc\"\nkx = 8\nouter = \"nesterov\"\noverlap = "
                       "\"delayed\"\ndelay = 2\n"),
            "<no error>");
  EXPECT_NE(sync_error("method = \"favg_reset\"\nkx = 8\noverlap = \"delayed\"\ndelay = 2\n")
                .find("with sync.method = \"favg_reset\" (favg_reset) cannot be combined"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"ddp\"\nfragments = 4\n")
                .find("job.toml:3:13: sync.fragments = 4 (fragments) with sync.method = \"ddp\" "
                      "(no parameter average) cannot be combined: it splits the averages of x, u "
                      "and v, and the method has none"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"none\"\nfragments = 2\n").find("sync.fragments"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"desloc\"\nkx = 8\nfragments = 9\n")
                .find("job.toml:4:13: sync.fragments = 9 exceeds the period kx = 8"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"desloc\"\nkx = 8\nku = 4\nfragments = 6\n")
                .find("sync.fragments = 6 exceeds the period ku = 4"),
            std::string::npos);
  EXPECT_EQ(sync_error("method = \"favg\"\nkx = 8\nouter = \"nesterov\"\nfragments = 2\n"),
            "<no error>");
  EXPECT_NE(sync_error("method = \"local_adam\"\nkx = 8\nfragments_u = 2\n")
                .find("job.toml:4:15: sync.fragments_u is set, but method = \"local_adam\" "
                      "averages u and v with x"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"desloc\"\nkx = 8\nfragments = 2\nfragments_u = 25\n")
                .find("job.toml:5:15: sync.fragments_u = 25 exceeds the period ku = 24"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"desloc\"\nkx = 8\nfragments_v = 49\n")
                .find("sync.fragments_v = 49 exceeds the period kv = 48"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"favg_reset\"\nkx = 8\nfragments = 2\n")
                .find("with sync.fragments = 2 (fragments) is not supported yet: its reset of u "
                      "and v acts on the whole buffers"),
            std::string::npos);
  try {
    train::parse_config(
        "[model]\nvocab = 1\ncontext = 1\nlayers = 1\nheads = 1\nd_model = 1\n"
        "[sync]\nmethod = \"desloc\"\nkx = 64\nfragments = 64\n",
        "tiny.toml");
    ADD_FAILURE() << "64 fragments of 29 parameters";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("tiny.toml:10:13: sync.fragments = 64 exceeds the model's 29 "
                               "parameters"),
              std::string::npos)
        << e.message();
  }
  EXPECT_NE(sync_error("workers = 0\n").find("sync.workers"), std::string::npos);
  EXPECT_NE(sync_error("workers = 2\njoin_step = 10\njoin_workers = 2\n").find("sync.join_workers"),
            std::string::npos);
  // Codecs (issue 14): unknown names, states the method never averages, feedback without a
  // codec, blocks that are not whole bytes of int2, and what owns the reference elsewhere.
  EXPECT_NE(sync_error("method = \"desloc\"\ncodec_x = \"fp8\"\n")
                .find("job.toml:3:11: sync.codec_x = \"fp8\" is not one of"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"favg\"\ncodec_u = \"int8\"\n")
                .find("job.toml:3:11: sync.codec_u compresses a state that method = \"favg\" "
                      "never averages across sites"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"ddp\"\ncodec_x = \"int8\"\n")
                .find("sync.codec_x = \"int8\" (codecs) with sync.method = \"ddp\" (no "
                      "parameter average) cannot be combined: it compresses a state the method "
                      "never averages"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"desloc\"\nerror_feedback = true\n")
                .find("job.toml:3:18: sync.error_feedback = true without a codec"),
            std::string::npos);
  // The sqrt domain is v's alone; codec_v accepts it.
  EXPECT_NE(sync_error("method = \"desloc\"\ncodec_u = \"sqrt-int4\"\n")
                .find("job.toml:3:11: sync.codec_u = \"sqrt-int4\" is not one of"),
            std::string::npos);
  EXPECT_EQ(sync_error("method = \"desloc\"\ncodec_v = \"sqrt-int4\"\n"), "<no error>");
  EXPECT_NE(sync_error("method = \"desloc\"\ncodec_x = \"int2\"\ncodec_block = 30\n")
                .find("job.toml:4:15: sync.codec_block = 30 must be a multiple of 4"),
            std::string::npos);
  // A codec with the outer step: the reference follows the outer step's parameters.
  EXPECT_EQ(sync_error("method = \"favg\"\nouter = \"nesterov\"\ncodec_x = \"bf16\"\n"),
            "<no error>");
  EXPECT_NE(sync_error("method = \"favg_reset\"\ncodec_x = \"int8\"\n")
                .find("sync.codec_x = \"int8\" (codecs) with sync.method = \"favg_reset\" "
                      "(favg_reset) is not supported yet"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"desloc\"\nworkers = 2\njoin_step = 10\njoin_workers = 3\n"
                       "codec_v = \"int4\"\n")
                .find("job.toml:4:13: sync.join_step = 10 (elastic join) with sync.codec_v = "
                      "\"int4\" (codecs) is not supported yet: a joining site holds no "
                      "reference"),
            std::string::npos);
  const auto ok = train::parse_config(
      "[sync]\nmethod = \"local_adam\"\ncodec_u = \"int4\"\ncodec_block = 128\n"
      "error_feedback = true\n",
      "ok.toml");
  const sync::CompressionConfig c = ok.sync.compression();
  EXPECT_EQ(c.of(optim::StateKind::kU), sync::Codec::kInt4);
  EXPECT_EQ(c.of(optim::StateKind::kX), sync::Codec::kFp32);
  EXPECT_EQ(c.block, 128u);
  EXPECT_TRUE(c.error_feedback);
}

TEST(SyncConfig, ValidDeslocConfig) {
  const auto cfg = train::parse_config(
      "[sync]\nmethod = \"desloc\"\nworkers = 4\nkx = 32\nku = 96\nkv = 192\n", "ok.toml");
  EXPECT_EQ(cfg.sync.effective_ku(), 96);
  EXPECT_EQ(cfg.sync.effective_kv(), 192);
  const auto d = train::parse_config("[sync]\nmethod = \"desloc\"\nkx = 16\n", "ok.toml");
  EXPECT_EQ(d.sync.effective_ku(), 48);
  EXPECT_EQ(d.sync.effective_kv(), 96);
}
