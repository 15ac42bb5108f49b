// Incremental decoding with a KV cache (kv_decoder.hpp): the training forward's operations
// (LayerNorm, GELU, the same causal attention) on one position, with matrix-vector products.
#include "desloc/model/kv_decoder.hpp"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "desloc/core/error.hpp"
#include "model/cpu/gelu.hpp"
#include "model/cpu/layernorm.hpp"

namespace desloc::model {
namespace {

// y (rows) = W (rows, cols) x + b, W row-major as torch.nn.Linear stores it.
void linear(float* y, const float* W, const float* b, const float* x, int rows, int cols) {
  std::copy(b, b + rows, y);
  cblas_sgemv(CblasRowMajor, CblasNoTrans, rows, cols, 1.0f, W, cols, x, 1, 1.0f, y, 1);
}

}  // namespace

KvDecoder::KvDecoder(const GptConfig& cfg, std::span<const float> params)
    : cfg_(cfg), layout_(cfg), params_(params) {
  cfg_.validate();
  if (params.size() != layout_.total())
    throw Error(fmt::format("KvDecoder: {} parameters given for a model of {}", params.size(),
                            layout_.total()));
  const auto C = static_cast<std::size_t>(cfg.d_model);
  x_.resize(C);
  ln_.resize(C);
  qkv_.resize(3 * C);
  att_.resize(C);
  scores_.resize(static_cast<std::size_t>(cfg.context));
  proj_.resize(C);
  fc_.resize(4 * C);
  logits_.resize(static_cast<std::size_t>(cfg.vocab));
  const std::size_t cache = static_cast<std::size_t>(cfg.layers) * cfg.context * C;
  keys_.resize(cache);
  values_.resize(cache);
}

std::span<const float> KvDecoder::step(int token) {
  if (pos_ >= cfg_.context)
    throw Error(fmt::format("KvDecoder: the cache holds {} positions (model.context) and is full",
                            cfg_.context));
  if (token < 0 || token >= cfg_.vocab)
    throw Error(
        fmt::format("KvDecoder: token {} is outside the vocabulary of {}", token, cfg_.vocab));
  const int C = cfg_.d_model;
  const float* p = params_.data();
  const float* wte = p + layout_.wte().offset;
  const float* wpe = p + layout_.wpe().offset;
  for (int c = 0; c < C; ++c)
    x_[c] =
        wte[static_cast<std::size_t>(token) * C + c] + wpe[static_cast<std::size_t>(pos_) * C + c];
  for (int l = 0; l < cfg_.layers; ++l) {
    auto at = [&](ParamLayout::LayerTensor t) { return p + layout_.layer(l, t).offset; };
    cpu::layernorm_forward(ln_.data(), &mean_, &rstd_, x_.data(), at(ParamLayout::kLn1W),
                           at(ParamLayout::kLn1B), 1, C);
    linear(qkv_.data(), at(ParamLayout::kQkvW), at(ParamLayout::kQkvB), ln_.data(), 3 * C, C);
    const std::size_t slot = (static_cast<std::size_t>(l) * cfg_.context + pos_) * C;
    std::copy(qkv_.begin() + C, qkv_.begin() + 2 * C, keys_.begin() + static_cast<long>(slot));
    std::copy(qkv_.begin() + 2 * C, qkv_.end(), values_.begin() + static_cast<long>(slot));
    attend(l);
    linear(proj_.data(), at(ParamLayout::kAttnProjW), at(ParamLayout::kAttnProjB), att_.data(), C,
           C);
    for (int c = 0; c < C; ++c) x_[c] += proj_[c];
    cpu::layernorm_forward(ln_.data(), &mean_, &rstd_, x_.data(), at(ParamLayout::kLn2W),
                           at(ParamLayout::kLn2B), 1, C);
    linear(fc_.data(), at(ParamLayout::kFcW), at(ParamLayout::kFcB), ln_.data(), 4 * C, C);
    cpu::gelu_forward(fc_.data(), fc_.data(), 4L * C);
    linear(proj_.data(), at(ParamLayout::kFcProjW), at(ParamLayout::kFcProjB), fc_.data(), C,
           4 * C);
    for (int c = 0; c < C; ++c) x_[c] += proj_[c];
  }
  cpu::layernorm_forward(ln_.data(), &mean_, &rstd_, x_.data(), p + layout_.lnf_w().offset,
                         p + layout_.lnf_b().offset, 1, C);
  // The head is tied to wte: logits = lnf(x) wte^T.
  cblas_sgemv(CblasRowMajor, CblasNoTrans, cfg_.vocab, C, 1.0f, wte, C, ln_.data(), 1, 0.0f,
              logits_.data(), 1);
  ++pos_;
  return logits_;
}

// att (C) = per head: softmax(q_h k_h^T / sqrt(hd)) v_h over positions 0..pos_.
void KvDecoder::attend(int layer) {
  const int C = cfg_.d_model, hd = cfg_.head_dim(), n = pos_ + 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* keys = keys_.data() + static_cast<std::size_t>(layer) * cfg_.context * C;
  const float* values = values_.data() + static_cast<std::size_t>(layer) * cfg_.context * C;
  for (int h = 0; h < cfg_.heads; ++h) {
    const float* q = qkv_.data() + h * hd;
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, hd, scale, keys + h * hd, C, q, 1, 0.0f,
                scores_.data(), 1);
    const float peak = *std::max_element(scores_.begin(), scores_.begin() + n);
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) sum += (scores_[j] = std::exp(scores_[j] - peak));
    for (int j = 0; j < n; ++j) scores_[j] /= sum;
    cblas_sgemv(CblasRowMajor, CblasTrans, n, hd, 1.0f, values + h * hd, C, scores_.data(), 1, 0.0f,
                att_.data() + h * hd, 1);
  }
}

}  // namespace desloc::model
