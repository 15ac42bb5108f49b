// Question: what does the KV cache of `desloc sample` buy (issue 16: each new token should cost
// one position, not the whole context)?
//
// For the quickstart model (L4, C128, context 128, bytes) and a larger one (L6, C256, context
// 256, a 4096-token vocabulary), random parameters: first validated (the cached logits of every
// position against the training forward pass, relative error < 1e-5; the text sampled with and
// without the cache identical), then timed: tokens per second generating to the end of the
// context from a one-token prompt, with the KV cache, without it (every token runs the whole
// sequence through the same decoder), and with the training forward run over the whole
// sequence for each token (what a sampler without a decoder would do), median [min-max] over
// the repeats, with the ratios side by side.
//
//   bench_sample [--repeats 5]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "desloc/data/tokenizer.hpp"
#include "desloc/model/kv_decoder.hpp"
#include "desloc/model/model.hpp"
#include "desloc/train/sampler.hpp"
#include "harness.hpp"

namespace {
using namespace desloc;

struct Shape {
  const char* name;
  model::GptConfig cfg;
};

train::TrainedModel random_model(const model::GptConfig& cfg) {
  train::TrainedModel m;
  m.model = cfg;
  const model::ParamLayout layout(cfg);
  m.params.resize(layout.total());
  model::init_params(layout, cfg, 11, m.params);
  m.sites = 1;
  m.tokenizer_kind = "byte";
  m.tokenizer = std::make_unique<data::ByteTokenizer>();
  return m;
}

void validate(const train::TrainedModel& m) {
  std::vector<std::uint16_t> tokens(static_cast<std::size_t>(m.model.context));
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::uint16_t>((i * 37) % 256);
  const std::vector<float> want = train::prompt_logits(m, tokens);
  model::KvDecoder dec(m.model, m.params);
  const auto V = static_cast<std::size_t>(m.model.vocab);
  double worst = 0.0;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto got = dec.step(tokens[i]);
    double diff = 0.0, scale = 0.0;
    for (std::size_t v = 0; v < V; ++v) {
      diff = std::max(diff, double(std::fabs(got[v] - want[i * V + v])));
      scale = std::max(scale, double(std::fabs(want[i * V + v])));
    }
    worst = std::max(worst, diff / scale);
  }
  if (!(worst < 1e-5))
    throw bench::BenchError("cached logits differ from the training forward: " +
                            bench::fmt_sci(worst));
  std::printf("  validated: cached logits vs the training forward, worst relative error %s\n",
              bench::fmt_sci(worst).c_str());
}

std::string generate(const train::TrainedModel& m, bool cache, int tokens) {
  train::SampleOptions o;
  o.tokens = tokens;
  o.seed = 5;
  o.kv_cache = cache;
  std::string out;
  train::sample_text(m, "T", o, [&](const std::string& t) { out += t; });
  return out;
}

// The training forward over the whole sequence for every new token (greedy), as a sampler
// without a decoder would run it.
void generate_with_forward(const train::TrainedModel& m, int tokens) {
  auto model = model::make_model(m.model, {model::Backend::kCpu, 0, 1, 0});
  std::copy(m.params.begin(), m.params.end(), model->params().begin());
  model->params_updated();
  std::vector<std::int32_t> seq{'T'};
  std::vector<float> logits;
  for (int i = 0; i < tokens; ++i) {
    const int T = static_cast<int>(seq.size());
    std::vector<std::int32_t> tgt(seq.size(), 0);
    logits.resize(static_cast<std::size_t>(T) * m.model.vocab);
    model->forward({seq, tgt, 1, T}, logits);
    const float* last = logits.data() + static_cast<std::size_t>(T - 1) * m.model.vocab;
    seq.push_back(static_cast<std::int32_t>(std::max_element(last, last + 256) - last));
  }
}

int run(int argc, char** argv) {
  int repeats = 5;
  bench::Flags("bench_sample [--repeats N]").add("--repeats", repeats).parse(argc, argv);
  if (repeats < 1) throw bench::BenchError("--repeats must be positive");
  std::printf("bench_sample: load average %s\n", bench::load_average().c_str());
  const Shape shapes[] = {{"quickstart L4 C128 T128 V256", {256, 128, 4, 4, 128}},
                          {"L6 C256 T256 V4096", {4096, 256, 6, 8, 256}}};
  bench::Table table({"model", "tokens", "KV cache tok/s", "no cache tok/s", "forward tok/s",
                      "cache / no cache", "cache / forward"});
  for (const Shape& s : shapes) {
    std::printf("%s\n", s.name);
    const train::TrainedModel m = random_model(s.cfg);
    validate(m);
    const int n = s.cfg.context - 1;
    const std::string with = generate(m, true, n);
    if (generate(m, false, n) != with)
      throw bench::BenchError("sampling with and without the cache gave different text");
    std::printf("  validated: %d tokens sampled with and without the cache are identical\n", n);
    const auto cache = bench::summarize(bench::time_ms([&] { generate(m, true, n); }, 1, repeats));
    const auto none = bench::summarize(bench::time_ms([&] { generate(m, false, n); }, 1, repeats));
    const auto fwd =
        bench::summarize(bench::time_ms([&] { generate_with_forward(m, n); }, 1, repeats));
    auto rate = [&](const bench::Stats& ms) {
      // tokens/s: the median, and the spread from the slowest and fastest repeats.
      return bench::Stats{1e3 * n / ms.median, 1e3 * n / ms.max, 1e3 * n / ms.min, ms.n};
    };
    table.add({s.name, std::to_string(n), bench::fmt_stats(rate(cache), 0),
               bench::fmt_stats(rate(none), 0), bench::fmt_stats(rate(fwd), 0),
               bench::fmt(none.median / cache.median, 1) + "x",
               bench::fmt(fwd.median / cache.median, 1) + "x"});
  }
  table.print();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sample: %s\n", e.what());
    return 1;
  }
}
