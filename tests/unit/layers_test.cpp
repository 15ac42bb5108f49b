// Finite-difference checks of every CPU layer's backward, plus forward references where the
// layer has a simple closed form. Each layer is wrapped in a scalar loss L = sum(out * w) with
// random w, so backward receives dout = w and every input's gradient is dL/d(input).
#include <gtest/gtest.h>

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "model/cpu/attention.hpp"
#include "model/cpu/cross_entropy.hpp"
#include "model/cpu/encoder.hpp"
#include "model/cpu/gelu.hpp"
#include "model/cpu/gemm.hpp"
#include "model/cpu/layernorm.hpp"
#include "model/cpu/linear.hpp"

namespace desloc::model::cpu {
namespace {

using Vec = std::vector<float>;

Vec random_vec(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  Vec v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// L = sum(out * w), accumulated in double so that the finite difference sees the change in
// the layer's fp32 output rather than rounding in the sum.
double weighted_sum(const Vec& out, const Vec& w) {
  double s = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * w[i];
  return s;
}

// Central differences of loss() w.r.t. every coordinate of x (or every stride-th one),
// compared with the analytic gradient. The error is max|numeric - analytic| relative to
// max|analytic|, the per-tensor measure the PyTorch parity test also uses.
void expect_gradient(const std::string& what, Vec& x, const Vec& analytic,
                     const std::function<double()>& loss, float eps = 1e-2f, double tol = 5e-3,
                     std::size_t stride = 1) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  double max_err = 0.0;
  double max_ref = 0.0;
  for (std::size_t i = 0; i < x.size(); i += stride) {
    const float saved = x[i];
    x[i] = saved + eps;
    const double up = loss();
    x[i] = saved - eps;
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (2.0 * static_cast<double>(eps));
    max_err = std::max(max_err, std::abs(numeric - analytic[i]));
    max_ref = std::max(max_ref, std::abs(static_cast<double>(analytic[i])));
  }
  ASSERT_GT(max_ref, 1e-6) << what << ": analytic gradient is identically zero";
  EXPECT_LE(max_err / max_ref, tol)
      << what << ": max abs error " << max_err << " against max |grad| " << max_ref;
}

TEST(Gemm, TiledMatchesSingleCallForEveryTransposition) {
  // Big enough (M * N * K >= 2^18) that gemm() splits the work across the OpenMP team, with
  // sizes that are not multiples of the tile alignment.
  const int M = 83, N = 97, K = 71;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      for (int wide = 0; wide < 2; ++wide) {
        const int m = wide ? M : N * 3, n = wide ? N * 3 : M;  // exercise both split axes
        const Vec a = random_vec(static_cast<std::size_t>(m) * K, 1);
        const Vec b = random_vec(static_cast<std::size_t>(K) * n, 2);
        Vec c = random_vec(static_cast<std::size_t>(m) * n, 3);
        Vec ref = c;
        const int lda = ta ? m : K, ldb = tb ? K : n;
        gemm(ta, tb, m, n, K, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, c.data(), n);
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    m, n, K, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, ref.data(), n);
        for (std::size_t i = 0; i < c.size(); ++i)
          ASSERT_NEAR(c[i], ref[i], 1e-4f * (1.0f + std::abs(ref[i])))
              << "ta=" << ta << " tb=" << tb << " i=" << i;
      }
    }
  }
}

TEST(Encoder, BackwardMatchesFiniteDifferences) {
  const int B = 2, T = 3, C = 4, V = 5;
  const std::vector<std::int32_t> tokens = {1, 3, 1, 4, 1, 0};  // repeats exercise the scatter
  Vec wte = random_vec(V * C, 10), wpe = random_vec(T * C, 11);
  const Vec w = random_vec(B * T * C, 12);
  Vec out(B * T * C);
  auto loss = [&] {
    encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return weighted_sum(out, w);
  };
  loss();
  for (int i = 0; i < B * T; ++i)
    for (int j = 0; j < C; ++j)
      ASSERT_EQ(out[i * C + j], wte[tokens[i] * C + j] + wpe[(i % T) * C + j]);
  Vec dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  encoder_backward(dwte.data(), dwpe.data(), w.data(), tokens.data(), B, T, C);
  expect_gradient("encoder d/dwte", wte, dwte, loss);
  expect_gradient("encoder d/dwpe", wpe, dwpe, loss);
}

TEST(LayerNorm, ForwardNormalisesAndBackwardMatchesFiniteDifferences) {
  const int N = 5, C = 16;
  Vec inp = random_vec(N * C, 20, 2.0f), weight = random_vec(C, 21), bias = random_vec(C, 22);
  for (auto& x : inp) x += 0.7f;  // a non-zero mean the layer must remove
  const Vec w = random_vec(N * C, 23);
  Vec out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(),
                      N, C);
    return weighted_sum(out, w);
  };
  loss();
  for (int i = 0; i < N; ++i) {
    double m = 0, v = 0;
    for (int j = 0; j < C; ++j) m += inp[i * C + j];
    m /= C;
    for (int j = 0; j < C; ++j) v += (inp[i * C + j] - m) * (inp[i * C + j] - m);
    v /= C;
    for (int j = 0; j < C; ++j) {
      const double ref = (inp[i * C + j] - m) / std::sqrt(v + 1e-5) * weight[j] + bias[j];
      ASSERT_NEAR(out[i * C + j], ref, 1e-5);
    }
  }
  // dinp accumulates: start from a known value and subtract it afterwards.
  Vec dinp(N * C, 0.25f), dweight(C, 0.0f), dbias(C, 0.0f);
  layernorm_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(),
                     mean.data(), rstd.data(), N, C);
  for (auto& d : dinp) d -= 0.25f;
  expect_gradient("layernorm d/dinp", inp, dinp, loss);
  expect_gradient("layernorm d/dweight", weight, dweight, loss);
  expect_gradient("layernorm d/dbias", bias, dbias, loss);
}

void check_linear(int N, int IC, int OC, bool with_bias, bool with_residual, std::size_t stride) {
  const std::string tag =
      "linear(" + std::to_string(N) + "," + std::to_string(IC) + "," + std::to_string(OC) + ") ";
  Vec inp = random_vec(N * IC, 30), weight = random_vec(OC * IC, 31, 0.3f);
  Vec bias = random_vec(OC, 32), residual = random_vec(N * OC, 33);
  const Vec w = random_vec(N * OC, 34);
  Vec out(N * OC);
  auto loss = [&] {
    linear_forward(out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr,
                   with_residual ? residual.data() : nullptr, N, IC, OC);
    return weighted_sum(out, w);
  };
  loss();
  for (int i = 0; i < N; i += std::max(1, N / 7)) {
    for (int o = 0; o < OC; ++o) {
      double ref = (with_bias ? bias[o] : 0.0) + (with_residual ? residual[i * OC + o] : 0.0);
      for (int k = 0; k < IC; ++k) ref += static_cast<double>(inp[i * IC + k]) * weight[o * IC + k];
      ASSERT_NEAR(out[i * OC + o], ref, 1e-4 * (1.0 + std::abs(ref))) << tag;
    }
  }
  Vec dinp(N * IC, 7.0f), dweight(OC * IC, 0.0f), dbias(OC, 0.0f);
  linear_backward(dinp.data(), dweight.data(), with_bias ? dbias.data() : nullptr, w.data(),
                  inp.data(), weight.data(), N, IC, OC);
  expect_gradient(tag + "d/dinp", inp, dinp, loss, 1e-2f, 5e-3, stride);
  expect_gradient(tag + "d/dweight", weight, dweight, loss, 1e-2f, 5e-3, stride);
  if (with_bias) expect_gradient(tag + "d/dbias", bias, dbias, loss);
  // The residual's gradient is dout itself: the model keeps dout as the skip-path gradient.
  if (with_residual) expect_gradient(tag + "d/dresidual", residual, w, loss, 1e-2f, 5e-3, stride);
}

TEST(Linear, BackwardMatchesFiniteDifferencesWithBiasAndResidual) {
  check_linear(6, 5, 7, true, true, 1);
}

TEST(Linear, BackwardWithoutBiasLikeTheTiedHead) { check_linear(4, 6, 9, false, false, 1); }

TEST(Linear, TiledGemmPathMatchesFiniteDifferences) {
  // N * IC * OC >= 2^18: every GEMM of forward and backward is split across threads.
  check_linear(80, 64, 96, true, true, 97);
}

TEST(Gelu, ForwardMatchesTanhFormulaAndBackwardMatchesFiniteDifferences) {
  const int n = 10007;  // more than one parallel chunk, not a multiple of the vector width
  Vec inp(n);
  for (int i = 0; i < n; ++i) inp[i] = -6.0f + 12.0f * static_cast<float>(i) / n;
  const Vec w = random_vec(n, 40);
  Vec out(n);
  auto loss = [&] {
    gelu_forward(out.data(), inp.data(), n);
    return weighted_sum(out, w);
  };
  loss();
  for (int i = 0; i < n; ++i) {
    const double x = inp[i];
    const double ref =
        0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
    ASSERT_NEAR(out[i], ref, 1e-6 * (1.0 + std::abs(ref))) << "x=" << x;
  }
  Vec dinp(n);
  gelu_backward(dinp.data(), inp.data(), w.data(), n);
  expect_gradient("gelu d/dinp", inp, dinp, loss, 1e-3f, 5e-3, 61);
}

// Direct causal attention in double, for the forward check.
Vec attention_reference(const Vec& qkv, int B, int T, int C, int NH) {
  const int hd = C / NH;
  Vec out(static_cast<std::size_t>(B) * T * C);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double d = 0;
          for (int e = 0; e < hd; ++e)
            d += static_cast<double>(qkv[(b * T + t) * 3 * C + h * hd + e]) *
                 qkv[(b * T + j) * 3 * C + C + h * hd + e];
          s[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (auto& x : s) z += (x = std::exp(x - mx));
        for (int e = 0; e < hd; ++e) {
          double y = 0;
          for (int j = 0; j <= t; ++j)
            y += s[j] / z * qkv[(b * T + j) * 3 * C + 2 * C + h * hd + e];
          out[(b * T + t) * C + h * hd + e] = static_cast<float>(y);
        }
      }
  return out;
}

void check_attention(int B, int T, int C, int NH, std::size_t stride) {
  const std::string tag = "attention(B=" + std::to_string(B) + ",T=" + std::to_string(T) + ") ";
  Vec qkv = random_vec(static_cast<std::size_t>(B) * T * 3 * C, 50);
  const Vec w = random_vec(static_cast<std::size_t>(B) * T * C, 51);
  Vec out(static_cast<std::size_t>(B) * T * C), att(static_cast<std::size_t>(B) * NH * T * T);
  auto loss = [&] {
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return weighted_sum(out, w);
  };
  loss();
  const Vec ref = attention_reference(qkv, B, T, C, NH);
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 2e-5) << tag << i;
  // Causal: the first position attends only to itself, so it equals its own v.
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c)
      ASSERT_NEAR(out[b * T * C + c], qkv[b * T * 3 * C + 2 * C + c], 1e-6) << tag;
  Vec dqkv(qkv.size(), 123.0f), scratch(att.size());
  attention_backward(dqkv.data(), scratch.data(), w.data(), qkv.data(), att.data(), B, T, C, NH);
  expect_gradient(tag + "d/dqkv", qkv, dqkv, loss, 1e-2f, 5e-3, stride);
  // Keys and values of the last position only influence the last query: their gradient must
  // come from that single row, and the last query itself must see every earlier key.
  for (int c = C; c < 3 * C; ++c) EXPECT_NE(dqkv[(T - 1) * 3 * C + c], 0.0f) << tag;
}

TEST(Attention, SingleCausalBlockMatchesReferenceAndFiniteDifferences) {
  check_attention(2, 5, 8, 2, 1);
}

TEST(Attention, SeveralCausalBlocksMatchReferenceAndFiniteDifferences) {
  // T = 70 spans three 32-row causal blocks, the last one partial.
  check_attention(2, 70, 16, 4, 23);
}

TEST(SoftmaxCrossEntropy, LossesAndFusedGradientMatchReferenceAndFiniteDifferences) {
  const int N = 6, V = 11;
  Vec logits = random_vec(N * V, 60, 3.0f);
  const std::vector<std::int32_t> targets = {0, 10, 3, 3, 7, 5};
  const float dloss = 1.0f / N;
  Vec work(N * V), losses(N);
  auto loss = [&] {
    work = logits;
    softmax_cross_entropy(work.data(), losses.data(), targets.data(), N, V, false, dloss);
    double s = 0;
    for (float l : losses) s += l;
    return s * dloss;
  };
  loss();
  ASSERT_EQ(work, logits) << "forward-only must not modify the logits";
  for (int i = 0; i < N; ++i) {
    double mx = -1e300, z = 0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(logits[i * V + j]));
    for (int j = 0; j < V; ++j) z += std::exp(logits[i * V + j] - mx);
    ASSERT_NEAR(losses[i], std::log(z) + mx - logits[i * V + targets[i]], 1e-5);
  }
  Vec dlogits = logits;
  softmax_cross_entropy(dlogits.data(), losses.data(), targets.data(), N, V, true, dloss);
  for (int i = 0; i < N; ++i) {
    double row = 0;
    for (int j = 0; j < V; ++j) row += dlogits[i * V + j];
    EXPECT_NEAR(row, 0.0, 1e-7) << "softmax - onehot sums to zero in row " << i;
  }
  expect_gradient("softmax cross-entropy d/dlogits", logits, dlogits, loss, 1e-2f, 5e-3);
}

}  // namespace
}  // namespace desloc::model::cpu
