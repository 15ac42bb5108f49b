// bench_gpu_step: how fast is one training step (forward + backward, gradients back on the
// host) of desloc's GPT on the CUDA backend, and how close to the GPU's fp32 peak is it?
// Validates the CUDA loss and gradients against the CPU backend first. Public API only.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/model/model.hpp"
#include "harness.hpp"

namespace {

using desloc::bench::BenchError;
using desloc::bench::fmt;
namespace dm = desloc::model;

// fp32 peak without tensor cores, assumed rather than measured (the bench sees no CUDA
// headers): H100 SXM5 is 67 TFLOP/s (132 SMs x 128 FP32 lanes x 2 x 1.98 GHz boost); the
// H200 uses the same GH100 die and clocks, so ~67 as well. H100 PCIe is lower (~51), so
// there the ratio understates. cuBLAS runs true fp32 here (no TF32).
constexpr double kFp32PeakTflops = 67.0;

constexpr double kValidateTol = 1e-3;  // relative, loss and gradient L2

struct SizeSpec {
  const char* name;
  dm::GptConfig cfg;
  int batch;
};

// Byte-level vocabulary as in training; head_dim 64 as in GPT-2. Tokens per step 4096-8192.
const SizeSpec kSizes[] = {
    {"L4-C256-T256", {.vocab = 256, .context = 256, .layers = 4, .heads = 4, .d_model = 256}, 16},
    {"L12-C768-T512", {.vocab = 256, .context = 512, .layers = 12, .heads = 12, .d_model = 768}, 8},
    {"L24-C1024-T1024",
     {.vocab = 256, .context = 1024, .layers = 24, .heads = 16, .d_model = 1024},
     8},
};

struct Tokens {
  std::vector<std::int32_t> inputs, targets;
};

Tokens random_tokens(std::size_t n, int vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> tok(0, vocab - 1);
  Tokens t;
  t.inputs.resize(n);
  t.targets.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    t.inputs[i] = tok(rng);
    t.targets[i] = tok(rng);
  }
  return t;
}

// FLOPs of one forward + backward. GEMMs with weights: 2 flops per multiply-add, 3 passes
// (forward, input grad, weight grad) = 6 N per token, N = 12 L C^2 (qkv, proj, fc, fc proj)
// + V C (tied LM head). Attention scores and att @ v: 4 T C per token per layer forward,
// x3 with backward; counted over the full T x T, which is what cuBLAS executes.
double step_flops(const dm::GptConfig& c, int B, int T) {
  const double C = c.d_model, L = c.layers, V = c.vocab;
  const double tokens = static_cast<double>(B) * T;
  const double n_matmul = 12.0 * L * C * C + V * C;
  return 6.0 * n_matmul * tokens + 12.0 * L * T * C * tokens;
}

void validate() {
  const dm::GptConfig cfg{.vocab = 256, .context = 64, .layers = 2, .heads = 4, .d_model = 128};
  const int B = 4, T = 64;
  auto cpu = dm::make_model(cfg, {.backend = dm::Backend::kCpu, .threads = 0, .max_batch = B});
  auto gpu = dm::make_model(cfg, {.backend = dm::Backend::kCuda, .max_batch = B});
  dm::init_params(cpu->layout(), cfg, 1, cpu->params());
  cpu->params_updated();
  std::copy(cpu->params().begin(), cpu->params().end(), gpu->params().begin());
  gpu->params_updated();
  const Tokens tok = random_tokens(static_cast<std::size_t>(B) * T, cfg.vocab, 1);
  const dm::Batch batch{tok.inputs, tok.targets, B, T};
  const double loss_cpu = cpu->forward_backward(batch);
  const double loss_gpu = gpu->forward_backward(batch);
  const double loss_rel = std::abs(loss_gpu - loss_cpu) / std::abs(loss_cpu);
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < cpu->grads().size(); ++i) {
    const double d = static_cast<double>(gpu->grads()[i]) - cpu->grads()[i];
    diff += d * d;
    norm += static_cast<double>(cpu->grads()[i]) * cpu->grads()[i];
  }
  const double grad_rel = std::sqrt(diff / std::max(norm, 1e-60));
  std::printf("validate (L2 C128 T64 B4): loss cpu %.6f cuda %.6f rel %.1e; grad rel L2 %.1e\n",
              loss_cpu, loss_gpu, loss_rel, grad_rel);
  if (!(loss_rel < kValidateTol) || !(grad_rel < kValidateTol))
    throw BenchError("CUDA backend disagrees with the CPU backend (tolerance " +
                     fmt(kValidateTol, 4) + "); not timing it");
}

int run(int warmup, int repeats) {
  if (!dm::backend_available(dm::Backend::kCuda)) {
    std::printf("no CUDA device: skipping\n");
    return 0;
  }
  validate();
  std::printf("\nfp32 peak assumed: %.0f TFLOP/s (H100 SXM / H200, no tensor cores)\n",
              kFp32PeakTflops);
  std::printf("step = forward_backward(): forward, backward, gradients copied to host memory\n");
  std::printf("h2d = params_updated(): parameters copied from host to device\n\n");
  desloc::bench::Table table({"size", "params (M)", "B x T", "step ms median [min-max]", "h2d ms",
                              "tokens/s", "TFLOP/s", "of fp32 peak"});
  for (const SizeSpec& s : kSizes) {
    const int B = s.batch, T = s.cfg.context;
    auto model = dm::make_model(s.cfg, {.backend = dm::Backend::kCuda, .max_batch = B});
    dm::init_params(model->layout(), s.cfg, 1, model->params());
    model->params_updated();
    const Tokens tok = random_tokens(static_cast<std::size_t>(B) * T, s.cfg.vocab, 2);
    const dm::Batch batch{tok.inputs, tok.targets, B, T};
    float loss = 0;
    const auto step_ms =
        desloc::bench::time_ms([&] { loss = model->forward_backward(batch); }, warmup, repeats);
    if (!std::isfinite(loss)) throw BenchError(std::string(s.name) + ": non-finite loss");
    const auto h2d_ms =
        desloc::bench::time_ms([&] { model->params_updated(); }, 1, std::max(3, repeats / 4));
    const auto st = desloc::bench::summarize(step_ms);
    const auto h2d = desloc::bench::summarize(h2d_ms);
    const double tokens = static_cast<double>(B) * T;
    const double tflops = step_flops(s.cfg, B, T) / (st.median * 1e-3) / 1e12;
    table.add({s.name, fmt(model->layout().total() / 1e6, 1),
               std::to_string(B) + " x " + std::to_string(T), desloc::bench::fmt_stats(st, 2),
               fmt(h2d.median, 2), fmt(tokens / (st.median * 1e-3), 0), fmt(tflops, 1),
               fmt(100.0 * tflops / kFp32PeakTflops, 1) + "%"});
  }
  table.print();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int warmup = 3, repeats = 20;
  try {
    desloc::bench::Flags("bench_gpu_step [--warmup N] [--repeats N]")
        .add("--warmup", warmup)
        .add("--repeats", repeats)
        .parse(argc, argv);
    if (warmup < 0 || repeats < 1)
      throw desloc::bench::BenchError("--warmup must be >= 0 and --repeats positive");
    return run(warmup, repeats);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_step: %s\n", e.what());
    return 1;
  }
}
