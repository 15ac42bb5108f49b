// The CUDA backend against the CPU backend on identical params and batches: loss, logits,
// every gradient tensor and a few AdamW steps. Skips without a CUDA device; the factory's
// error for a missing device is checked everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/model/model.hpp"
#include "desloc/optim/optimizer.hpp"

namespace desloc::model {
namespace {

// cuBLAS runs in true fp32 (no TF32); the two backends differ only in summation order and
// in the CPU's polynomial exp/tanh, so errors are ~1e-6 relative. These bounds leave margin.
constexpr double kLossTol = 1e-5;    // relative
constexpr double kLogitTol = 1e-4;   // max |diff| / max |logit|
constexpr double kGradTol = 1e-3;    // max |diff| / max |grad| per tensor
constexpr double kGradL2Tol = 1e-4;  // ||diff|| / ||grad|| over the whole gradient
// Tensors whose exact gradient is zero (e.g. the key bias: softmax ignores a constant added
// to a row of scores) hold rounding noise on both sides; compare them against this fraction
// of the largest gradient entry instead of their own scale.
constexpr double kNoiseFloor = 1e-4;
constexpr float kStepLossTol = 5e-4f;  // relative, after AdamW steps

struct Case {
  const char* name;
  GptConfig cfg;
  int B, T, max_batch;
};

// Odd sizes on purpose: C not a multiple of 32, T below and at the context, V above one
// block of threads, more rows than one column-sum chunk (128), repeated tokens.
const Case kCases[] = {
    {"tiny", {.vocab = 96, .context = 16, .layers = 2, .heads = 4, .d_model = 32}, 3, 13, 4},
    {"full_context",
     {.vocab = 300, .context = 64, .layers = 1, .heads = 3, .d_model = 48},
     5,
     64,
     5},
    {"deeper", {.vocab = 256, .context = 40, .layers = 3, .heads = 2, .d_model = 64}, 2, 37, 3},
};

// Names the case in test output instead of dumping its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

struct Tokens {
  std::vector<std::int32_t> inputs, targets;
  Batch batch(int B, int T) const { return Batch{inputs, targets, B, T}; }
};

Tokens random_tokens(int n, int vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> tok(0, vocab - 1);
  Tokens t;
  for (int i = 0; i < n; ++i) {
    t.inputs.push_back(tok(rng));
    t.targets.push_back(tok(rng));
  }
  return t;
}

double max_abs(std::span<const float> a) {
  double m = 0;
  for (float x : a) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}

double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

double rel_l2(std::span<const float> a, std::span<const float> ref) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - ref[i];
    diff += d * d;
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

struct Pair {
  std::unique_ptr<Model> cpu, cuda;
};

// Both backends with the same init_params(seed) weights.
Pair make_pair(const Case& c, std::uint64_t seed) {
  BackendOptions cpu_opts{.backend = Backend::kCpu, .threads = 2, .max_batch = c.max_batch};
  BackendOptions cuda_opts{.backend = Backend::kCuda, .max_batch = c.max_batch};
  Pair p{make_model(c.cfg, cpu_opts), make_model(c.cfg, cuda_opts)};
  init_params(p.cpu->layout(), c.cfg, seed, p.cpu->params());
  p.cpu->params_updated();
  std::copy(p.cpu->params().begin(), p.cpu->params().end(), p.cuda->params().begin());
  p.cuda->params_updated();
  return p;
}

class GptCudaParity : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(GptCudaParity, LossLogitsAndGradsMatchCpu) {
  const Case& c = GetParam();
  Pair p = make_pair(c, 7);
  ASSERT_EQ(p.cuda->backend_name(), "cuda");
  ASSERT_EQ(p.cuda->layout().total(), p.cpu->layout().total());
  const Tokens tokens = random_tokens(c.B * c.T, c.cfg.vocab, 11);
  const Batch batch = tokens.batch(c.B, c.T);

  const std::size_t n_logits = static_cast<std::size_t>(c.B) * c.T * c.cfg.vocab;
  std::vector<float> logits_cpu(n_logits), logits_cuda(n_logits);
  const float loss_cpu = p.cpu->forward(batch, logits_cpu);
  const float loss_cuda = p.cuda->forward(batch, logits_cuda);
  EXPECT_NEAR(loss_cuda, loss_cpu, kLossTol * std::abs(loss_cpu));
  EXPECT_LE(max_abs_diff(logits_cuda, logits_cpu), kLogitTol * max_abs(logits_cpu));

  const float fb_cpu = p.cpu->forward_backward(batch);
  const float fb_cuda = p.cuda->forward_backward(batch);
  EXPECT_NEAR(fb_cuda, fb_cpu, kLossTol * std::abs(fb_cpu));
  EXPECT_FLOAT_EQ(fb_cuda, loss_cuda) << "forward() and forward_backward() disagree";

  const std::span<const float> g_cpu = p.cpu->grads();
  const std::span<const float> g_cuda = p.cuda->grads();
  const double global_max = max_abs(g_cpu);
  ASSERT_GT(global_max, 0.0);
  for (const ParamTensor& t : p.cpu->layout().tensors()) {
    const auto a = g_cuda.subspan(t.offset, t.numel);
    const auto b = g_cpu.subspan(t.offset, t.numel);
    const double scale = std::max(max_abs(b), kNoiseFloor * global_max);
    EXPECT_LE(max_abs_diff(a, b), kGradTol * scale)
        << t.name << ": max |grad| cpu " << max_abs(b) << ", cuda " << max_abs(a);
  }
  EXPECT_LE(rel_l2(g_cuda, g_cpu), kGradL2Tol);
}

TEST_P(GptCudaParity, GradientsAreBitwiseDeterministic) {
  const Case& c = GetParam();
  Pair p = make_pair(c, 3);
  const Tokens tokens = random_tokens(c.B * c.T, c.cfg.vocab, 5);
  const float loss1 = p.cuda->forward_backward(tokens.batch(c.B, c.T));
  const std::vector<float> g1(p.cuda->grads().begin(), p.cuda->grads().end());
  const float loss2 = p.cuda->forward_backward(tokens.batch(c.B, c.T));
  EXPECT_EQ(loss1, loss2);
  const std::span<const float> g2 = p.cuda->grads();
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < g1.size(); ++i) mismatches += g1[i] != g2[i];
  EXPECT_EQ(mismatches, 0u) << "of " << g1.size() << " gradient entries";
}

TEST_P(GptCudaParity, AdamWStepsMatchCpu) {
  const Case& c = GetParam();
  Pair p = make_pair(c, 21);
  optim::OptimizerConfig ocfg;
  ocfg.algorithm = optim::Algorithm::kAdamW;
  optim::Optimizer opt_cpu(ocfg, p.cpu->layout());
  optim::Optimizer opt_cuda(ocfg, p.cuda->layout());
  constexpr int kSteps = 5;
  constexpr float kLr = 1e-3f;
  for (int step = 0; step < kSteps; ++step) {
    const Tokens tokens = random_tokens(c.B * c.T, c.cfg.vocab, 100 + step);
    const float loss_cpu = p.cpu->forward_backward(tokens.batch(c.B, c.T));
    const float loss_cuda = p.cuda->forward_backward(tokens.batch(c.B, c.T));
    EXPECT_NEAR(loss_cuda, loss_cpu, kStepLossTol * std::abs(loss_cpu)) << "step " << step;
    opt_cpu.step(p.cpu->params(), p.cpu->grads(), kLr);
    p.cpu->params_updated();
    opt_cuda.step(p.cuda->params(), p.cuda->grads(), kLr);
    p.cuda->params_updated();
  }
}

TEST_P(GptCudaParity, RejectsBadBatches) {
  const Case& c = GetParam();
  Pair p = make_pair(c, 1);
  const int too_big = c.max_batch + 1;
  Tokens big = random_tokens(too_big * c.T, c.cfg.vocab, 2);
  EXPECT_THROW(p.cuda->forward_backward(big.batch(too_big, c.T)), ConfigError);
  Tokens bad = random_tokens(c.B * c.T, c.cfg.vocab, 2);
  bad.inputs[1] = c.cfg.vocab;  // one past the vocabulary
  EXPECT_THROW(p.cuda->forward_backward(bad.batch(c.B, c.T)), DataError);
  // The model is still usable afterwards.
  const Tokens good = random_tokens(c.B * c.T, c.cfg.vocab, 2);
  EXPECT_TRUE(std::isfinite(p.cuda->forward_backward(good.batch(c.B, c.T))));
}

INSTANTIATE_TEST_SUITE_P(Configs, GptCudaParity, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// Runs everywhere: without a device the factory refuses "cuda" with a ConfigError that names
// the backend and the way out; with one, an out-of-range device ordinal is refused.
TEST(CudaFactory, RefusesUnavailableDevice) {
  const GptConfig cfg{.vocab = 32, .context = 8, .layers = 1, .heads = 1, .d_model = 8};
  if (!backend_available(Backend::kCuda)) {
    try {
      make_model(cfg, BackendOptions{.backend = Backend::kCuda});
      FAIL() << "make_model(\"cuda\") succeeded without a CUDA device";
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;
      EXPECT_NE(msg.find("cpu"), std::string::npos) << "no way out suggested: " << msg;
    }
  } else {
    try {
      make_model(cfg, BackendOptions{.backend = Backend::kCuda, .device = 1 << 20});
      FAIL() << "make_model(\"cuda\") accepted device 1048576";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("device"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace desloc::model
