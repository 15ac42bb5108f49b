// SyncPolicy schedules, the exact virtual-worker average, the outer optimizer, the order of
// the DES-LOC step on a hand-computed two-worker quadratic, and [sync] config errors.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/sync/averager.hpp"
#include "desloc/sync/outer_optimizer.hpp"
#include "desloc/sync/sync_policy.hpp"
#include "desloc/sync/synced_step.hpp"
#include "desloc/train/config.hpp"

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
  optim::OptimizerConfig sign{.name = "adamw",
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
  const SyncPolicy policy({.method = SyncMethod::kFavg, .workers = 2, .kx = 2});
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
  adopt_cfg.name = "adopt";
  optim::Optimizer adopt(adopt_cfg, n);
  adopt.state().u.assign(n, 0.3f);
  std::vector<sync::Replica> adopt_replicas{{x, zeros, &adopt}};
  sync::bound_momentum(adopt_replicas);
  EXPECT_EQ(adopt.state().u, std::vector<float>(n, 0.3f));
}

TEST(SyncedStep, ResetZeroesMomentsAfterTheAverage) {
  optim::OptimizerConfig cfg{.name = "adamw", .weight_decay = 0.0f};
  optim::Optimizer o0(cfg, 2), o1(cfg, 2);
  std::vector<float> x0 = {1, 2}, x1 = {3, 4}, g0(2), g1(2);
  std::vector<sync::Replica> reps{{x0, g0, &o0}, {x1, g1, &o1}};
  auto grad = [&](std::size_t w) { std::fill(reps[w].g.begin(), reps[w].g.end(), 1.0f); };
  const SyncPolicy policy({.method = SyncMethod::kFavgReset, .workers = 2, .kx = 1});
  sync::VirtualAverager avg(2);
  sync::run_synced_step(1, policy, avg, reps, grad, 0.1f, {.reset_step_count = true});
  // u was zeroed before the update, so after it u = (1 - beta1) g exactly.
  EXPECT_NEAR(o0.state().u[0], 0.1f, 1e-7);
  EXPECT_EQ(o0.state().t, 1);
  EXPECT_EQ(x0, x1);
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
                .find("job.toml:3:9: sync.outer = \"nesterov\" needs a parameter average, but "
                      "method = \"ddp\""),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"none\"\nouter = \"nesterov\"\n").find("sync.outer"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"desloc\"\nkx = 4\nphase_x = 4\n")
                .find("sync.phase_x = 4 must be smaller"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"ddp\"\noverlap = \"step\"\n")
                .find("job.toml:3:11: sync.overlap = \"step\" overlaps averages of x, u and v "
                      "with compute, but method = \"ddp\" has none (DDP's gradient average"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"none\"\noverlap = \"step\"\n").find("sync.overlap"),
            std::string::npos);
  EXPECT_NE(sync_error("method = \"desloc\"\noverlap = \"eager\"\n")
                .find("sync.overlap = \"eager\" is not one of"),
            std::string::npos);
  EXPECT_NE(sync_error("workers = 0\n").find("sync.workers"), std::string::npos);
  EXPECT_NE(sync_error("workers = 2\njoin_step = 10\njoin_workers = 2\n").find("sync.join_workers"),
            std::string::npos);
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
