// AdamW / ADOPT updates against hand-computed double-precision references, clipping and
// learning-rate schedules against their closed forms.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/model/param_layout.hpp"
#include "desloc/optim/optimizer.hpp"

using namespace desloc;

namespace {
model::GptConfig tiny() {
  return {.vocab = 8, .context = 4, .layers = 1, .heads = 1, .d_model = 4};
}
}  // namespace

TEST(Optimizer, AdamWMatchesDoubleReferenceOverSteps) {
  const model::ParamLayout layout(tiny());
  optim::OptimizerConfig cfg{.algorithm = optim::Algorithm::kAdamW,
                             .beta1 = 0.9f,
                             .beta2 = 0.95f,
                             .eps = 1e-8f,
                             .weight_decay = 0.1f};
  optim::Optimizer opt(cfg, layout);
  const std::size_t n = layout.total();
  std::vector<float> x(n), g(n);
  std::vector<double> xr(n), ur(n, 0.0), vr(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) xr[i] = x[i] = 0.01f * float(int(i % 17) - 8);
  std::vector<double> decay(n, 0.0);
  for (const auto& t : layout.tensors())
    for (std::size_t i = 0; i < t.numel; ++i) decay[t.offset + i] = t.decay ? 1.0 : 0.0;
  for (int step = 1; step <= 5; ++step) {
    for (std::size_t i = 0; i < n; ++i) g[i] = std::sin(float(i) * 0.37f + float(step));
    const float lr = 1e-2f;
    opt.step(x, g, lr);
    const double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.95, step);
    for (std::size_t i = 0; i < n; ++i) {
      xr[i] *= 1 - lr * 0.1 * decay[i];
      ur[i] = 0.9 * ur[i] + 0.1 * g[i];
      vr[i] = 0.95 * vr[i] + 0.05 * double(g[i]) * g[i];
      xr[i] -= lr * (ur[i] / bc1) / (std::sqrt(vr[i] / bc2) + 1e-8);
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(x[i], xr[i], 1e-5) << "element " << i;
    ASSERT_NEAR(opt.state().u[i], ur[i], 1e-6);
    ASSERT_NEAR(opt.state().v[i], vr[i], 1e-6);
  }
  EXPECT_EQ(opt.state().t, 5);
}

TEST(Optimizer, AdamWWithoutBiasCorrectionTakesRawMoments) {
  const model::ParamLayout layout(tiny());
  optim::Optimizer opt({.algorithm = optim::Algorithm::kAdamW,
                        .beta1 = 0.5f,
                        .beta2 = 0.5f,
                        .eps = 0.0f + 1e-12f,
                        .weight_decay = 0.0f,
                        .bias_correction = false},
                       layout);
  std::vector<float> x(layout.total(), 1.0f), g(layout.total(), 2.0f);
  opt.step(x, g, 0.1f);
  // u = 1, v = 2 -> x = 1 - 0.1 * 1 / sqrt(2)
  EXPECT_NEAR(x[0], 1.0 - 0.1 / std::sqrt(2.0), 1e-6);
}

TEST(Optimizer, AdoptFirstStepOnlyInitialisesSecondMoment) {
  const model::ParamLayout layout(tiny());
  optim::Optimizer opt({.algorithm = optim::Algorithm::kAdopt,
                        .beta1 = 0.9f,
                        .beta2 = 0.999f,
                        .eps = 1e-6f,
                        .weight_decay = 0.0f},
                       layout);
  std::vector<float> x(layout.total(), 0.5f), g(layout.total(), -3.0f);
  opt.step(x, g, 0.1f);
  EXPECT_EQ(x[0], 0.5f);
  EXPECT_EQ(opt.state().v[0], 9.0f);
  EXPECT_EQ(opt.state().u[0], 0.0f);
  // Second step: normalised g = -3/3 = -1 (clip 1^0.25 = 1), u = 0.1 * -1, x += 0.1 * 0.1
  opt.step(x, g, 0.1f);
  EXPECT_NEAR(opt.state().u[0], -0.1f, 1e-7);
  EXPECT_NEAR(x[0], 0.5f + 0.01f, 1e-7);
  EXPECT_NEAR(opt.state().v[0], 0.999f * 9.0f + 0.001f * 9.0f, 1e-5);
}

// An unknown optim.name is refused where the config is read (config_test); here the numbers.
TEST(Optimizer, RejectsBadConfigWithKeyName) {
  const model::ParamLayout layout(tiny());
  try {
    optim::Optimizer opt({.beta1 = 1.0f}, layout);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("optim.beta1"), std::string::npos);
  }
  EXPECT_THROW(optim::Optimizer({.eps = 0.0f}, layout), ConfigError);
}

TEST(Clip, CoordinateClipsEachElementToRho) {
  std::vector<float> g = {-5.0f, -0.5f, 0.0f, 0.25f, 3.0f};
  const float norm = optim::clip_gradient(g, {.mode = "coord", .value = 1.0f});
  EXPECT_NEAR(norm, std::sqrt(25.0 + 0.25 + 0.0625 + 9.0), 1e-5);
  EXPECT_EQ(g, (std::vector<float>{-1.0f, -0.5f, 0.0f, 0.25f, 1.0f}));
}

TEST(Clip, GlobalNormRescalesOnlyAboveThreshold) {
  std::vector<float> g = {3.0f, 4.0f};
  EXPECT_NEAR(optim::clip_gradient(g, {.mode = "norm", .value = 1.0f}), 5.0f, 1e-6);
  EXPECT_NEAR(std::hypot(g[0], g[1]), 1.0f, 1e-5);
  std::vector<float> small = {0.3f, 0.4f};
  optim::clip_gradient(small, {.mode = "norm", .value = 1.0f});
  EXPECT_EQ(small, (std::vector<float>{0.3f, 0.4f}));
}

TEST(Clip, GlobalNormIsBitwiseStableAcrossLargeBuffers) {
  std::vector<float> g(1 << 20);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = std::cos(float(i));
  const float a = optim::global_norm(g), b = optim::global_norm(g);
  EXPECT_EQ(a, b);
  double ref = 0;
  for (float v : g) ref += double(v) * v;
  EXPECT_NEAR(a, std::sqrt(ref), 1e-3);
}

TEST(Schedule, WarmupThenCosineToFloor) {
  optim::ScheduleConfig s{.kind = "cosine", .lr = 1.0f, .warmup = 10, .min_lr_ratio = 0.1f};
  EXPECT_NEAR(optim::learning_rate(s, 0, 110), 0.1f, 1e-6);
  EXPECT_NEAR(optim::learning_rate(s, 9, 110), 1.0f, 1e-6);
  EXPECT_NEAR(optim::learning_rate(s, 10, 110), 1.0f, 1e-6);
  EXPECT_NEAR(optim::learning_rate(s, 60, 110), 0.55f, 1e-5);  // halfway: floor + (peak-floor)/2
  EXPECT_NEAR(optim::learning_rate(s, 110, 110), 0.1f, 1e-6);
}

TEST(Schedule, WarmupStableDecay) {
  optim::ScheduleConfig s{
      .kind = "wsd", .lr = 2.0f, .warmup = 4, .min_lr_ratio = 0.0f, .decay_fraction = 0.25f};
  EXPECT_NEAR(optim::learning_rate(s, 1, 100), 1.0f, 1e-6);
  EXPECT_EQ(optim::learning_rate(s, 50, 100), 2.0f);
  EXPECT_EQ(optim::learning_rate(s, 74, 100), 2.0f);
  EXPECT_NEAR(optim::learning_rate(s, 75, 100), 2.0f, 1e-6);
  EXPECT_NEAR(optim::learning_rate(s, 88, 100), 0.96f, 1e-5);
  EXPECT_NEAR(optim::learning_rate(s, 100, 100), 0.0f, 1e-6);
}
