// Sampling from a trained model (sampler.hpp).
#include "desloc/train/sampler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/model/kv_decoder.hpp"
#include "desloc/model/model.hpp"

namespace desloc::train {
void check_sample_options(const TrainedModel& m, const std::vector<std::uint16_t>& prompt,
                          const SampleOptions& opts) {
  if (prompt.empty())
    throw ConfigError("sample: the prompt is empty; pass --prompt with at least one character");
  if (static_cast<int>(prompt.size()) > m.model.context)
    throw ConfigError(
        fmt::format("sample: the prompt is {} tokens but the model's context is {}; shorten it",
                    prompt.size(), m.model.context));
  if (!(opts.temperature > 0.0) || !std::isfinite(opts.temperature))
    throw ConfigError(fmt::format(
        "sample: temperature {} must be a positive number (1 samples the model as it is; lower "
        "is greedier)",
        opts.temperature));
  if (opts.top_k < 0)
    throw ConfigError(fmt::format("sample: top-k {} must be at least 1", opts.top_k));
  if (opts.tokens < 0)
    throw ConfigError(fmt::format("sample: tokens {} must not be negative", opts.tokens));
}

namespace {

// Draws from softmax(logits / temperature) over the first `vocab` ids, optionally only the
// top_k largest. Deterministic: one 53-bit uniform per draw from the generator.
int draw(std::span<const float> logits, int vocab, const SampleOptions& opts, std::mt19937_64& rng,
         std::vector<int>& order, std::vector<double>& p) {
  order.resize(static_cast<std::size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::size_t keep = order.size();
  if (opts.top_k > 0 && static_cast<std::size_t>(opts.top_k) < order.size()) {
    keep = static_cast<std::size_t>(opts.top_k);
    // Ties broken by id, so the kept set does not depend on the sort's implementation.
    std::partial_sort(
        order.begin(), order.begin() + static_cast<long>(keep), order.end(),
        [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  }
  double peak = -INFINITY;
  for (std::size_t i = 0; i < keep; ++i) peak = std::max(peak, double(logits[order[i]]));
  p.resize(keep);
  double sum = 0.0;
  for (std::size_t i = 0; i < keep; ++i)
    sum += (p[i] = std::exp((double(logits[order[i]]) - peak) / opts.temperature));
  const double u = double(rng() >> 11) * 0x1.0p-53 * sum;
  double acc = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

}  // namespace

SampleResult sample_text(const TrainedModel& m, std::string_view prompt, const SampleOptions& opts,
                         const std::function<void(const std::string&)>& emit) {
  SampleResult r;
  r.prompt = m.tokenizer->encode(prompt);
  check_sample_options(m, r.prompt, opts);
  const int vocab = std::min(m.tokenizer->vocab(), m.model.vocab);
  model::KvDecoder decoder(m.model, m.params);
  std::vector<std::uint16_t> sequence = r.prompt;
  std::span<const float> logits;
  // Runs the sequence's newest tokens from position 0: the prompt, a rewind, or (without the
  // cache) every token.
  auto run = [&](std::size_t count) {
    decoder.reset();
    for (std::size_t i = sequence.size() - count; i < sequence.size(); ++i)
      logits = decoder.step(sequence[i]);
  };
  run(sequence.size());
  std::mt19937_64 rng(opts.seed);
  std::vector<int> order;
  std::vector<double> p;
  const auto t0 = std::chrono::steady_clock::now();
  const auto context = static_cast<std::size_t>(m.model.context);
  for (int i = 0; i < opts.tokens; ++i) {
    const auto next = static_cast<std::uint16_t>(draw(logits, vocab, opts, rng, order, p));
    r.generated.push_back(next);
    sequence.push_back(next);
    emit(m.tokenizer->token_text(next));
    if (i + 1 == opts.tokens) break;
    if (!opts.kv_cache) {
      run(std::min(sequence.size(), context));
    } else if (decoder.position() == decoder.capacity()) {
      run(std::max<std::size_t>(1, context / 2));
      ++r.rewinds;
    } else {
      logits = decoder.step(next);
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::vector<float> prompt_logits(const TrainedModel& m, const std::vector<std::uint16_t>& prompt) {
  const int P = static_cast<int>(prompt.size());
  if (P == 0 || P > m.model.context)
    throw ConfigError(fmt::format("the prompt is {} tokens; it must be 1 to {} (model.context)", P,
                                  m.model.context));
  auto model = model::make_model(m.model, {model::Backend::kCpu, 0, 1, 0});
  std::copy(m.params.begin(), m.params.end(), model->params().begin());
  model->params_updated();
  std::vector<std::int32_t> in(prompt.begin(), prompt.end()), tgt(in.size(), 0);
  std::copy(in.begin() + 1, in.end(), tgt.begin());
  std::vector<float> logits(static_cast<std::size_t>(P) * m.model.vocab);
  model->forward({in, tgt, 1, P}, logits);
  return logits;
}

namespace {
void write_npy_bytes(const std::string& path, const std::string& descr, const std::string& shape,
                     const void* data, std::size_t bytes) {
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr, shape);
  // magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::string file = "\x93NUMPY";
  file += '\x01';
  file += '\x00';
  file += static_cast<char>(header.size() & 0xff);
  file += static_cast<char>(header.size() >> 8);
  file += header;
  file.append(static_cast<const char*>(data), bytes);
  write_file_atomic(path, file);
}
}  // namespace

void write_npy(const std::string& path, const std::vector<float>& data, std::size_t rows,
               std::size_t cols) {
  write_npy_bytes(path, "<f4", fmt::format("({}, {})", rows, cols), data.data(),
                  data.size() * sizeof(float));
}

void write_npy(const std::string& path, const std::vector<std::int32_t>& data) {
  write_npy_bytes(path, "<i4", fmt::format("({},)", data.size()), data.data(),
                  data.size() * sizeof(std::int32_t));
}

}  // namespace desloc::train
