// Sizes of the GPT-style decoder. Validated once, when the config is loaded.
#pragma once

#include <cstddef>
#include <string>

namespace desloc::model {

struct GptConfig {
  int vocab = 256;    // V: byte-level tokenizer by default
  int context = 128;  // T_max: learned position embeddings
  int layers = 4;     // L
  int heads = 4;      // NH; must divide d_model
  int d_model = 128;  // C
  // Throws ConfigError naming the offending key when a size is non-positive or
  // heads does not divide d_model.
  void validate() const;
  int head_dim() const { return d_model / heads; }
};

}  // namespace desloc::model
