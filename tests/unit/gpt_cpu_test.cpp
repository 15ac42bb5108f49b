// Whole-model checks of the CPU GPT backend: finite-difference spot checks of every parameter
// tensor, bitwise determinism, batch-size limits and the loss at initialisation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/model/model.hpp"
#include "desloc/sync/averager.hpp"
#include "model/cpu/gpt_cpu.hpp"

namespace desloc::model {
namespace {

GptConfig tiny_config() {
  GptConfig cfg;
  cfg.vocab = 64;
  cfg.context = 8;
  cfg.layers = 2;
  cfg.heads = 2;
  cfg.d_model = 32;
  return cfg;
}

BackendOptions tiny_options() {
  BackendOptions opts;
  opts.threads = 2;
  opts.max_batch = 3;
  return opts;
}

struct Tokens {
  std::vector<std::int32_t> inputs, targets;
  Batch batch(int B, int T) const { return Batch{inputs, targets, B, T}; }
};

Tokens random_tokens(int B, int T, int V, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, V - 1);
  Tokens t;
  for (int i = 0; i < B * T; ++i) {
    t.inputs.push_back(dist(rng));
    t.targets.push_back(dist(rng));
  }
  return t;
}

// Mean cross-entropy recomputed in double from the model's fp32 logits: the finite
// difference then sees the change in the logits, not the rounding of a float loss.
double loss_in_double(Model& m, const Batch& b) {
  std::vector<float> logits(static_cast<std::size_t>(b.B) * b.T * m.config().vocab);
  m.forward(b, logits);
  const int V = m.config().vocab;
  double total = 0.0;
  for (int i = 0; i < b.B * b.T; ++i) {
    const float* row = logits.data() + static_cast<std::size_t>(i) * V;
    const double mx = *std::max_element(row, row + V);
    double z = 0.0;
    for (int j = 0; j < V; ++j) z += std::exp(row[j] - mx);
    total += std::log(z) + mx - row[b.targets[i]];
  }
  return total / (b.B * b.T);
}

TEST(GptCpu, LossAtInitIsNearLogVocab) {
  const auto cfg = tiny_config();
  auto m = make_cpu_gpt(cfg, tiny_options());
  const auto tok = random_tokens(3, 8, cfg.vocab, 1);
  const float loss = m->forward(tok.batch(3, 8));
  EXPECT_NEAR(loss, std::log(static_cast<float>(cfg.vocab)), 0.05f);
}

TEST(GptCpu, EveryParameterTensorMatchesFiniteDifferences) {
  const auto cfg = tiny_config();
  auto m = make_cpu_gpt(cfg, tiny_options());
  // Move away from the symmetric init (zero biases, unit gains) so every tensor, biases and
  // LayerNorm parameters included, carries a clearly non-zero gradient.
  std::mt19937 rng(7);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  for (auto& x : m->params()) x += noise(rng);
  m->params_updated();
  const auto tok = random_tokens(2, 7, cfg.vocab, 2);  // T = 7 < context = 8
  const Batch b = tok.batch(2, 7);
  const float loss = m->forward_backward(b);
  EXPECT_NEAR(loss, loss_in_double(*m, b), 1e-5);
  const std::vector<float> grads(m->grads().begin(), m->grads().end());

  constexpr float kEps = 1e-2f;
  auto params = m->params();
  for (const auto& t : m->layout().tensors()) {
    // The 3 largest-gradient coordinates plus 3 random ones from each tensor.
    std::vector<std::size_t> idx(t.numel);
    std::iota(idx.begin(), idx.end(), t.offset);
    std::partial_sort(
        idx.begin(), idx.begin() + std::min<std::size_t>(3, t.numel), idx.end(),
        [&](std::size_t a, std::size_t c) { return std::abs(grads[a]) > std::abs(grads[c]); });
    idx.resize(std::min<std::size_t>(3, t.numel));
    std::uniform_int_distribution<std::size_t> pick(t.offset, t.offset + t.numel - 1);
    for (int r = 0; r < 3; ++r) idx.push_back(pick(rng));
    double max_grad = 0.0;
    for (std::size_t i = t.offset; i < t.offset + t.numel; ++i)
      max_grad = std::max(max_grad, static_cast<double>(std::abs(grads[i])));
    ASSERT_GT(max_grad, 1e-6) << t.name << " has an all-zero gradient";
    for (std::size_t i : idx) {
      const float saved = params[i];
      params[i] = saved + kEps;
      const double up = loss_in_double(*m, b);
      params[i] = saved - kEps;
      const double down = loss_in_double(*m, b);
      params[i] = saved;
      const double numeric = (up - down) / (2.0 * kEps);
      EXPECT_LE(std::abs(numeric - grads[i]), 1e-2 * max_grad + 2e-6)
          << t.name << "[" << i - t.offset << "]: numeric " << numeric << ", analytic " << grads[i]
          << ", tensor max |grad| " << max_grad;
    }
  }
}

// DDP over unequal sites (sync.weights = "tokens"): site A's mean gradient over its 1
// sequence and site B's over its 2, averaged with weights 1 and 2, is the mean gradient over
// the 3 sequences, the one a site training on the combined batch takes. Not bit for bit: the
// model sums the batch's rows in one order, the average adds two means (each rounded) scaled
// by 1/3 * 3 and 2/3 * 3 (rounded to float); within 1e-5 of the largest gradient. The plain
// mean of the two sites' gradients is not.
TEST(GptCpu, TheTokenWeightedMeanOfTwoSitesGradientsIsTheGradientOfTheirCombinedBatch) {
  const auto cfg = tiny_config();
  auto m = make_cpu_gpt(cfg, tiny_options());
  const auto tok = random_tokens(3, 8, cfg.vocab, 9);
  m->forward_backward(tok.batch(3, 8));
  const std::vector<float> combined(m->grads().begin(), m->grads().end());
  const auto rows = [&](int first, int count) {
    const auto at = static_cast<std::size_t>(first) * 8, n = static_cast<std::size_t>(count) * 8;
    return Batch{std::span(tok.inputs).subspan(at, n), std::span(tok.targets).subspan(at, n), count,
                 8};
  };
  m->forward_backward(rows(0, 1));
  std::vector<float> a(m->grads().begin(), m->grads().end());
  m->forward_backward(rows(1, 2));
  std::vector<float> b(m->grads().begin(), m->grads().end());
  std::vector<float> plain_a = a, plain_b = b;
  std::vector<std::span<float>> sites{a, b};
  sync::VirtualAverager weighted(2, sync::SumOrder::kRing);
  weighted.set_weights({1.0 * 8, 2.0 * 8});  // tokens per step
  weighted.average(optim::StateKind::kGrad, sites);
  std::vector<std::span<float>> plain{plain_a, plain_b};
  sync::VirtualAverager alike(2, sync::SumOrder::kRing);
  alike.average(optim::StateKind::kGrad, plain);
  double largest = 0.0, worst = 0.0, plain_worst = 0.0;
  for (std::size_t i = 0; i < combined.size(); ++i) {
    largest = std::max(largest, double(std::abs(combined[i])));
    worst = std::max(worst, double(std::abs(a[i] - combined[i])));
    plain_worst = std::max(plain_worst, double(std::abs(plain_a[i] - combined[i])));
  }
  EXPECT_LE(worst, 1e-5 * largest);
  EXPECT_GT(plain_worst, 1e-3 * largest);
}

TEST(GptCpu, RunsAreBitwiseDeterministic) {
  const auto cfg = tiny_config();
  const auto tok = random_tokens(3, 8, cfg.vocab, 3);
  auto run = [&](Model& m) {
    const float loss = m.forward_backward(tok.batch(3, 8));
    return std::make_pair(loss, std::vector<float>(m.grads().begin(), m.grads().end()));
  };
  auto a = make_cpu_gpt(cfg, tiny_options());
  auto b = make_cpu_gpt(cfg, tiny_options());
  const auto first = run(*a);
  const auto second = run(*a);  // reused buffers, grads overwritten (not accumulated)
  const auto other = run(*b);   // a second instance
  for (const auto* r : {&second, &other}) {
    EXPECT_EQ(std::memcmp(&first.first, &r->first, sizeof(float)), 0);
    ASSERT_EQ(first.second.size(), r->second.size());
    EXPECT_EQ(std::memcmp(first.second.data(), r->second.data(), first.second.size() * 4), 0);
  }
}

TEST(GptCpu, ForwardWritesLogitsAndLeavesGradientsAlone) {
  const auto cfg = tiny_config();
  auto m = make_cpu_gpt(cfg, tiny_options());
  const auto tok = random_tokens(2, 8, cfg.vocab, 4);
  const float loss_fb = m->forward_backward(tok.batch(2, 8));
  const std::vector<float> grads(m->grads().begin(), m->grads().end());
  std::vector<float> logits(2 * 8 * cfg.vocab, std::nanf(""));
  const float loss_f = m->forward(tok.batch(2, 8), logits);
  EXPECT_EQ(loss_f, loss_fb);
  EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); }));
  EXPECT_TRUE(std::equal(grads.begin(), grads.end(), m->grads().begin()));
}

TEST(GptCpu, RejectsBatchesBeyondItsBuffersAndBadTokens) {
  const auto cfg = tiny_config();
  auto m = make_cpu_gpt(cfg, tiny_options());  // max_batch = 3, context = 8
  const auto big = random_tokens(4, 9, cfg.vocab, 5);
  auto message = [&](const Batch& b) {
    try {
      m->forward_backward(b);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no ConfigError");
  };
  EXPECT_NE(message(big.batch(4, 8)).find("B = 4"), std::string::npos) << message(big.batch(4, 8));
  EXPECT_NE(message(big.batch(3, 9)).find("T = 9"), std::string::npos) << message(big.batch(3, 9));
  EXPECT_NE(message(Batch{std::span(big.inputs).first(5), std::span(big.targets).first(5), 1, 8})
                .find("B * T"),
            std::string::npos);
  std::vector<float> wrong(7);
  EXPECT_THROW(m->forward(big.batch(1, 8), wrong), ConfigError);
  auto bad = random_tokens(1, 8, cfg.vocab, 6);
  bad.inputs[3] = cfg.vocab;
  EXPECT_THROW(m->forward(bad.batch(1, 8)), DataError);
  BackendOptions opts = tiny_options();
  opts.max_batch = 0;
  EXPECT_THROW(make_cpu_gpt(cfg, opts), ConfigError);
}

}  // namespace
}  // namespace desloc::model
