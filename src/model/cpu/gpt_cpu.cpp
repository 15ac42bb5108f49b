// The CPU backend of the GPT model: owns flat params/grads and activation buffers sized for
// (max_batch, context), and chains the per-layer kernels of this folder.
#include "model/cpu/gpt_cpu.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "desloc/core/error.hpp"
#include "model/cpu/attention.hpp"
#include "model/cpu/cross_entropy.hpp"
#include "model/cpu/encoder.hpp"
#include "model/cpu/gelu.hpp"
#include "model/cpu/gemm.hpp"
#include "model/cpu/layernorm.hpp"
#include "model/cpu/linear.hpp"

namespace desloc::model {
namespace {

using namespace desloc::model::cpu;

// Seed used when the caller does not overwrite params() (the trainer calls init_params itself).
constexpr std::uint64_t kDefaultSeed = 1337;

// Per-layer activations kept for backward, each a view into one arena.
struct LayerActs {
  float* ln1;       // (B, T, C)
  float* ln1_mean;  // (B, T)
  float* ln1_rstd;  // (B, T)
  float* qkv;       // (B, T, 3C)
  float* att;       // (B, NH, T, T) softmax probabilities
  float* atty;      // (B, T, C) attention output before the projection
  float* res2;      // (B, T, C) h = x + attn(ln1(x))
  float* ln2;       // (B, T, C)
  float* ln2_mean;  // (B, T)
  float* ln2_rstd;  // (B, T)
  float* fch;       // (B, T, 4C) before GELU
  float* fch_gelu;  // (B, T, 4C)
  float* res3;      // (B, T, C) layer output
};

class CpuGpt final : public Model {
 public:
  CpuGpt(const GptConfig& cfg, const BackendOptions& opts)
      : cfg_(cfg), layout_(cfg), max_batch_(opts.max_batch), threads_(opts.threads) {
    cfg_.validate();
    if (max_batch_ <= 0)
      throw ConfigError("model max_batch must be positive, got " + std::to_string(max_batch_));
    if (threads_ < 0)
      throw ConfigError("model threads must be >= 0 (0 = all cores), got " +
                        std::to_string(threads_));
    threads_ = set_cpu_threads(threads_);
    params_.assign(layout_.total(), 0.0f);
    grads_.assign(layout_.total(), 0.0f);
    init_params(layout_, cfg_, kDefaultSeed, params_);
    allocate();
  }

  const GptConfig& config() const override { return cfg_; }
  const ParamLayout& layout() const override { return layout_; }
  std::string backend_name() const override { return "cpu"; }
  std::span<float> params() override { return params_; }
  void params_updated() override {}
  std::span<float> grads() override { return grads_; }

  float forward(const Batch& batch, std::span<float> logits) override {
    check_batch(batch);
    set_cpu_threads(threads_);
    const std::size_t n_logits = static_cast<std::size_t>(batch.B) * batch.T * cfg_.vocab;
    if (!logits.empty() && logits.size() != n_logits)
      throw ConfigError("forward(): logits span holds " + std::to_string(logits.size()) +
                        " floats but (B, T, V) = (" + std::to_string(batch.B) + ", " +
                        std::to_string(batch.T) + ", " + std::to_string(cfg_.vocab) + ") needs " +
                        std::to_string(n_logits));
    float* out = logits.empty() ? logits_ : logits.data();
    forward_pass(batch, out);
    return loss(batch, out, false);
  }

  float forward_backward(const Batch& batch) override {
    check_batch(batch);
    set_cpu_threads(threads_);
    forward_pass(batch, logits_);
    const float mean_loss = loss(batch, logits_, true);
    backward_pass(batch);
    return mean_loss;
  }

 private:
  float* p(const ParamTensor& t) { return params_.data() + t.offset; }
  float* g(const ParamTensor& t) { return grads_.data() + t.offset; }

  // The arena's layout; cpu_activation_floats() below counts the same terms.
  void allocate() {
    if (cpu_activation_floats(cfg_, max_batch_) * sizeof(float) >
        static_cast<double>(std::numeric_limits<std::ptrdiff_t>::max()))
      throw ConfigError(
          fmt::format("the activations of data.batch = {} sequences of model.context = {} tokens "
                      "({:.3g} floats) do not fit this machine's address space",
                      max_batch_, cfg_.context, cpu_activation_floats(cfg_, max_batch_)));
    const std::size_t N = static_cast<std::size_t>(max_batch_) * cfg_.context;
    const std::size_t C = cfg_.d_model;
    const std::size_t att = static_cast<std::size_t>(max_batch_) * cfg_.heads * cfg_.context *
                            static_cast<std::size_t>(cfg_.context);
    const std::size_t per_layer = N * C * 5 + N * 3 * C + N * 4 * C * 2 + N * 4 + att;
    const std::size_t top = N * C + N * C + 2 * N + N * cfg_.vocab + N;
    const std::size_t grad_acts = N * C * 2 + N * 3 * C + N * 4 * C + att;
    arena_.assign(per_layer * cfg_.layers + top + grad_acts, 0.0f);
    float* cursor = arena_.data();
    auto take = [&cursor](std::size_t n) {
      float* q = cursor;
      cursor += n;
      return q;
    };
    encoded_ = take(N * C);
    layers_.resize(cfg_.layers);
    for (auto& a : layers_) {
      a.ln1 = take(N * C);
      a.ln1_mean = take(N);
      a.ln1_rstd = take(N);
      a.qkv = take(N * 3 * C);
      a.att = take(att);
      a.atty = take(N * C);
      a.res2 = take(N * C);
      a.ln2 = take(N * C);
      a.ln2_mean = take(N);
      a.ln2_rstd = take(N);
      a.fch = take(N * 4 * C);
      a.fch_gelu = take(N * 4 * C);
      a.res3 = take(N * C);
    }
    lnf_ = take(N * C);
    lnf_mean_ = take(N);
    lnf_rstd_ = take(N);
    logits_ = take(N * cfg_.vocab);
    losses_ = take(N);
    dres_ = take(N * C);
    dbuf_ = take(N * C);
    dqkv_ = take(N * 3 * C);
    dfch_ = take(N * 4 * C);
    datt_ = take(att);
  }

  void check_batch(const Batch& b) const {
    if (b.B <= 0 || b.B > max_batch_)
      throw ConfigError("batch B = " + std::to_string(b.B) +
                        " is outside [1, max_batch = " + std::to_string(max_batch_) +
                        "] the CPU model's activations were sized for; raise max_batch");
    if (b.T <= 0 || b.T > cfg_.context)
      throw ConfigError("batch T = " + std::to_string(b.T) +
                        " is outside [1, model.context = " + std::to_string(cfg_.context) + "]");
    const std::size_t n = static_cast<std::size_t>(b.B) * b.T;
    if (b.inputs.size() != n || b.targets.size() != n)
      throw ConfigError("batch holds " + std::to_string(b.inputs.size()) + " inputs and " +
                        std::to_string(b.targets.size()) +
                        " targets but B * T = " + std::to_string(n));
    for (std::size_t i = 0; i < n; ++i) {
      if (b.inputs[i] < 0 || b.inputs[i] >= cfg_.vocab || b.targets[i] < 0 ||
          b.targets[i] >= cfg_.vocab)
        throw DataError("token id at position " + std::to_string(i) + " (input " +
                        std::to_string(b.inputs[i]) + ", target " + std::to_string(b.targets[i]) +
                        ") is outside the vocabulary [0, " + std::to_string(cfg_.vocab) + ")");
    }
  }

  void forward_pass(const Batch& batch, float* logits) {
    const int B = batch.B, T = batch.T, C = cfg_.d_model, NH = cfg_.heads, N = B * T;
    encoder_forward(encoded_, batch.inputs.data(), p(layout_.wte()), p(layout_.wpe()), B, T, C);
    const float* x = encoded_;
    for (int l = 0; l < cfg_.layers; ++l) {
      auto& a = layers_[l];
      auto w = [&](ParamLayout::LayerTensor t) { return p(layout_.layer(l, t)); };
      layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w(ParamLayout::kLn1W),
                        w(ParamLayout::kLn1B), N, C);
      linear_forward(a.qkv, a.ln1, w(ParamLayout::kQkvW), w(ParamLayout::kQkvB), nullptr, N, C,
                     3 * C);
      attention_forward(a.atty, a.att, a.qkv, B, T, C, NH);
      linear_forward(a.res2, a.atty, w(ParamLayout::kAttnProjW), w(ParamLayout::kAttnProjB), x, N,
                     C, C);
      layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w(ParamLayout::kLn2W),
                        w(ParamLayout::kLn2B), N, C);
      linear_forward(a.fch, a.ln2, w(ParamLayout::kFcW), w(ParamLayout::kFcB), nullptr, N, C,
                     4 * C);
      gelu_forward(a.fch_gelu, a.fch, static_cast<long>(N) * 4 * C);
      linear_forward(a.res3, a.fch_gelu, w(ParamLayout::kFcProjW), w(ParamLayout::kFcProjB), a.res2,
                     N, 4 * C, C);
      x = a.res3;
    }
    layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, x, p(layout_.lnf_w()), p(layout_.lnf_b()), N, C);
    // Tied head: (N, C) @ wte^T (C, V) -> (N, V)
    linear_forward(logits, lnf_, p(layout_.wte()), nullptr, nullptr, N, C, cfg_.vocab);
  }

  float loss(const Batch& batch, float* logits, bool backward) {
    const int N = batch.B * batch.T;
    softmax_cross_entropy(logits, losses_, batch.targets.data(), N, cfg_.vocab, backward,
                          1.0f / static_cast<float>(N));
    double sum = 0.0;  // serial, so the mean does not depend on the thread count
    for (int i = 0; i < N; ++i) sum += losses_[i];
    return static_cast<float>(sum / N);
  }

  void backward_pass(const Batch& batch) {
    const int B = batch.B, T = batch.T, C = cfg_.d_model, NH = cfg_.heads, N = B * T;
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    // logits_ now holds dlogits (N, V).
    linear_backward(dbuf_, g(layout_.wte()), nullptr, logits_, lnf_, p(layout_.wte()), N, C,
                    cfg_.vocab);
    const float* x_last = cfg_.layers > 0 ? layers_.back().res3 : encoded_;
    std::fill(dres_, dres_ + static_cast<std::size_t>(N) * C, 0.0f);
    layernorm_backward(dres_, g(layout_.lnf_w()), g(layout_.lnf_b()), dbuf_, x_last,
                       p(layout_.lnf_w()), lnf_mean_, lnf_rstd_, N, C);
    // dres_ is the gradient of the residual stream; each block adds its branches into it.
    for (int l = cfg_.layers - 1; l >= 0; --l) {
      auto& a = layers_[l];
      const float* x = l > 0 ? layers_[l - 1].res3 : encoded_;
      auto w = [&](ParamLayout::LayerTensor t) { return p(layout_.layer(l, t)); };
      auto dw = [&](ParamLayout::LayerTensor t) { return g(layout_.layer(l, t)); };
      // MLP branch: res3 = res2 + fcproj(gelu(fc(ln2(res2))))
      linear_backward(dfch_, dw(ParamLayout::kFcProjW), dw(ParamLayout::kFcProjB), dres_,
                      a.fch_gelu, w(ParamLayout::kFcProjW), N, 4 * C, C);
      gelu_backward(dfch_, a.fch, dfch_, static_cast<long>(N) * 4 * C);
      linear_backward(dbuf_, dw(ParamLayout::kFcW), dw(ParamLayout::kFcB), dfch_, a.ln2,
                      w(ParamLayout::kFcW), N, C, 4 * C);
      layernorm_backward(dres_, dw(ParamLayout::kLn2W), dw(ParamLayout::kLn2B), dbuf_, a.res2,
                         w(ParamLayout::kLn2W), a.ln2_mean, a.ln2_rstd, N, C);
      // Attention branch: res2 = x + proj(attn(qkv(ln1(x))))
      linear_backward(dbuf_, dw(ParamLayout::kAttnProjW), dw(ParamLayout::kAttnProjB), dres_,
                      a.atty, w(ParamLayout::kAttnProjW), N, C, C);
      attention_backward(dqkv_, datt_, dbuf_, a.qkv, a.att, B, T, C, NH);
      linear_backward(dbuf_, dw(ParamLayout::kQkvW), dw(ParamLayout::kQkvB), dqkv_, a.ln1,
                      w(ParamLayout::kQkvW), N, C, 3 * C);
      layernorm_backward(dres_, dw(ParamLayout::kLn1W), dw(ParamLayout::kLn1B), dbuf_, x,
                         w(ParamLayout::kLn1W), a.ln1_mean, a.ln1_rstd, N, C);
    }
    encoder_backward(g(layout_.wte()), g(layout_.wpe()), dres_, batch.inputs.data(), B, T, C);
  }

  GptConfig cfg_;
  ParamLayout layout_;
  int max_batch_;
  int threads_;
  std::vector<float> params_;
  std::vector<float> grads_;
  std::vector<float> arena_;  // every activation and activation gradient below
  float* encoded_ = nullptr;  // (B, T, C)
  std::vector<LayerActs> layers_;
  float* lnf_ = nullptr;       // (B, T, C)
  float* lnf_mean_ = nullptr;  // (B, T)
  float* lnf_rstd_ = nullptr;  // (B, T)
  float* logits_ = nullptr;    // (B, T, V); dlogits in place during backward
  float* losses_ = nullptr;    // (B, T)
  float* dres_ = nullptr;      // (B, T, C) residual-stream gradient
  float* dbuf_ = nullptr;      // (B, T, C) branch gradient scratch
  float* dqkv_ = nullptr;      // (B, T, 3C)
  float* dfch_ = nullptr;      // (B, T, 4C)
  float* datt_ = nullptr;      // (B, NH, T, T)
};

}  // namespace

double cpu_activation_floats(const GptConfig& cfg, int max_batch) {
  const double N = static_cast<double>(max_batch) * cfg.context;  // positions (B, T)
  const double C = cfg.d_model;
  const double att = static_cast<double>(max_batch) * cfg.heads * cfg.context * cfg.context;
  const double per_layer = N * C * 5 + N * 3 * C + N * 4 * C * 2 + N * 4 + att;
  const double top = N * C + N * C + 2 * N + N * cfg.vocab + N;
  const double grad_acts = N * C * 2 + N * 3 * C + N * 4 * C + att;
  return per_layer * cfg.layers + top + grad_acts;
}

std::unique_ptr<Model> make_cpu_gpt(const GptConfig& cfg, const BackendOptions& opts) {
  return std::make_unique<CpuGpt>(cfg, opts);
}

}  // namespace desloc::model
