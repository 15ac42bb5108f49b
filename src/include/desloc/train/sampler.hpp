// `desloc sample`: text generated from a trained model, token by token, with a KV cache
// (model/kv_decoder.hpp), deterministic for a seed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "desloc/train/trained_model.hpp"

namespace desloc::train {

struct SampleOptions {
  int tokens = 200;          // tokens to generate
  double temperature = 1.0;  // > 0; logits are divided by it
  int top_k = 0;             // 0 = every token; else only the k most likely
  std::uint64_t seed = 1;
  // Without the cache every new token runs the whole sequence again (the bench's reference).
  bool kv_cache = true;
};

struct SampleResult {
  std::vector<std::uint16_t> prompt, generated;
  double seconds = 0.0;  // generation only (the prompt's pass excluded)
  int rewinds = 0;       // times the context filled and the newest half was run again
};

// The refusals of sample_text, on their own: the command checks before it prints the prompt.
void check_sample_options(const TrainedModel& m, const std::vector<std::uint16_t>& prompt,
                          const SampleOptions& opts);

// Encodes the prompt, runs it, then draws opts.tokens tokens, handing each one's text to
// `emit` as soon as it is drawn. Only ids the tokenizer can decode are drawn. When the context
// fills, the newest context/2 tokens are run again from position 0 (learned positions cannot
// go past the context). Throws ConfigError for an empty prompt, one longer than the context,
// a temperature <= 0 or a top_k < 0.
SampleResult sample_text(const TrainedModel& m, std::string_view prompt, const SampleOptions& opts,
                         const std::function<void(const std::string&)>& emit);

// The logits of every prompt position from the training forward pass (model.hpp's CPU
// backend), (P, V) row-major, to check an export against another implementation.
std::vector<float> prompt_logits(const TrainedModel& m, const std::vector<std::uint16_t>& prompt);

// Writes a (rows, cols) float32 array, or a (n,) int32 one, as a NumPy .npy file (version
// 1.0), atomically.
void write_npy(const std::string& path, const std::vector<float>& data, std::size_t rows,
               std::size_t cols);
void write_npy(const std::string& path, const std::vector<std::int32_t>& data);

}  // namespace desloc::train
