// The KV-cached decoder against the training forward pass, and sampling: deterministic for a
// seed, identical with and without the cache, and bad options refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "desloc/core/error.hpp"
#include "desloc/data/tokenizer.hpp"
#include "desloc/model/kv_decoder.hpp"
#include "desloc/model/model.hpp"
#include "desloc/train/sampler.hpp"

namespace desloc {
namespace {

model::GptConfig tiny() { return {256, 24, 2, 4, 32}; }

train::TrainedModel trained(std::uint64_t seed) {
  train::TrainedModel m;
  m.model = tiny();
  const model::ParamLayout layout(m.model);
  m.params.resize(layout.total());
  model::init_params(layout, m.model, seed, m.params);
  // Larger weights than the init's, so the logits are far from uniform and sampling has shape.
  for (float& p : m.params) p *= 4.0f;
  m.sites = 1;
  m.tokenizer_kind = "byte";
  m.tokenizer = std::make_unique<data::ByteTokenizer>();
  return m;
}

double max_abs(std::span<const float> a) {
  double m = 0.0;
  for (const float x : a) m = std::max(m, double(std::fabs(x)));
  return m;
}

TEST(KvDecoder, EveryPositionMatchesTheTrainingForward) {
  const train::TrainedModel m = trained(5);
  std::mt19937 rng(1);
  std::vector<std::uint16_t> tokens(static_cast<std::size_t>(m.model.context));
  for (auto& t : tokens) t = static_cast<std::uint16_t>(rng() % 256);
  const std::vector<float> want = train::prompt_logits(m, tokens);
  model::KvDecoder dec(m.model, m.params);
  const auto V = static_cast<std::size_t>(m.model.vocab);
  double worst = 0.0;
  std::vector<float> first;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto got = dec.step(tokens[i]);
    if (i == 0) first.assign(got.begin(), got.end());
    const std::span<const float> row(want.data() + i * V, V);
    double diff = 0.0;
    for (std::size_t v = 0; v < V; ++v) diff = std::max(diff, double(std::fabs(got[v] - row[v])));
    worst = std::max(worst, diff / max_abs(row));
  }
  EXPECT_LT(worst, 1e-5) << "relative error of the cached logits";
  EXPECT_EQ(dec.position(), m.model.context);
  EXPECT_THROW(dec.step(1), Error) << "a full cache must refuse another token";
  EXPECT_THROW(model::KvDecoder(m.model, std::span<const float>(m.params).first(10)), Error);
  dec.reset();
  const auto again = dec.step(tokens[0]);
  EXPECT_EQ(std::vector<float>(again.begin(), again.end()), first) << "reset forgets everything";
  EXPECT_THROW(dec.step(256), Error) << "a token outside the vocabulary";
}

std::string sampled(const train::TrainedModel& m, const train::SampleOptions& o,
                    const std::string& prompt = "The ") {
  std::string streamed;
  const auto r = train::sample_text(m, prompt, o, [&](const std::string& t) { streamed += t; });
  EXPECT_EQ(streamed, m.tokenizer->decode(r.generated)) << "the stream is the decoding";
  EXPECT_EQ(r.generated.size(), static_cast<std::size_t>(o.tokens));
  return streamed;
}

TEST(Sampler, IsDeterministicForASeedAndTheCacheChangesNothing) {
  const train::TrainedModel m = trained(9);
  train::SampleOptions o;
  o.tokens = 18;  // prompt 4 + 18 < context 24: both paths see the same positions
  o.seed = 7;
  const std::string a = sampled(m, o);
  EXPECT_EQ(sampled(m, o), a);
  o.kv_cache = false;
  EXPECT_EQ(sampled(m, o), a);
  o.kv_cache = true;
  o.seed = 8;
  EXPECT_NE(sampled(m, o), a);
  // Greedy in the limit: top-k 1 always takes the most likely token, whatever the seed.
  o.top_k = 1;
  const std::string g = sampled(m, o);
  o.seed = 99;
  EXPECT_EQ(sampled(m, o), g);
  // Past the context the cache rewinds to its newest half and keeps going.
  o.top_k = 0;
  o.tokens = 100;
  train::SampleResult r = train::sample_text(m, "The ", o, [](const std::string&) {});
  EXPECT_EQ(r.generated.size(), 100u);
  EXPECT_GT(r.rewinds, 0);
}

TEST(Sampler, RefusesBadOptionsAndPrompts) {
  const train::TrainedModel m = trained(9);
  auto refuses = [&](const std::string& prompt, train::SampleOptions o, const std::string& what) {
    try {
      train::sample_text(m, prompt, o, [](const std::string&) {});
      ADD_FAILURE() << "accepted: " << what;
    } catch (const ConfigError& e) {
      EXPECT_NE(e.message().find(what), std::string::npos) << e.message();
    }
  };
  train::SampleOptions o;
  refuses("", o, "empty");
  refuses(std::string(25, 'x'), o, "context is 24");
  o.temperature = 0.0;
  refuses("a", o, "temperature");
  o.temperature = -1.0;
  refuses("a", o, "temperature");
  o.temperature = NAN;
  refuses("a", o, "temperature");
  o.temperature = 1.0;
  o.top_k = -1;
  refuses("a", o, "top-k");
}

}  // namespace
}  // namespace desloc
