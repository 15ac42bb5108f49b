// Incremental decoding for sampling: the GPT forward pass one token at a time on the CPU, with
// each layer's keys and values kept (a KV cache), so that a new token costs one position of
// work instead of a pass over the whole context. Reads the flat parameters in ParamLayout
// order; the logits equal the training forward's (model.hpp) for the same tokens to float
// rounding (tests/unit/kv_decoder_test.cpp).
#pragma once

#include <span>
#include <vector>

#include "desloc/model/gpt_config.hpp"
#include "desloc/model/param_layout.hpp"

namespace desloc::model {

class KvDecoder {
 public:
  // `params` must outlive the decoder and hold ParamLayout(cfg).total() floats.
  KvDecoder(const GptConfig& cfg, std::span<const float> params);

  // Appends `token` at position position() and returns the logits (cfg.vocab) for the token
  // after it, valid until the next call. Throws Error when the cache is full (position() ==
  // cfg.context) or the token is outside the vocabulary.
  std::span<const float> step(int token);
  // Forgets every position.
  void reset() { pos_ = 0; }
  int position() const { return pos_; }
  int capacity() const { return cfg_.context; }

 private:
  void attend(int layer);

  GptConfig cfg_;
  ParamLayout layout_;
  std::span<const float> params_;
  int pos_ = 0;
  std::vector<float> x_, ln_, qkv_, att_, scores_, proj_, fc_, logits_;
  std::vector<float> keys_, values_;  // (L, context, C) each
  float mean_ = 0.0f, rstd_ = 0.0f;
};

}  // namespace desloc::model
