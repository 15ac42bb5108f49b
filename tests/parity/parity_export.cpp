// Exports a tiny GPT's weights, batch, logits, loss, gradients and the losses of its first
// optimizer steps, so torch_parity.py can rebuild the same model in PyTorch and compare.
// Usage: parity_export OUT_DIR. Writes manifest.json plus raw little-endian .bin arrays.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/model/model.hpp"
#include "desloc/optim/optimizer.hpp"

namespace {

using desloc::model::Batch;
using desloc::model::GptConfig;

constexpr int kBatch = 4;
constexpr int kSteps = 10;
constexpr float kLr = 1e-3f;
constexpr std::uint64_t kParamSeed = 1337;
constexpr std::uint32_t kBatchSeed = 2024;

GptConfig parity_config() {
  GptConfig cfg;
  cfg.vocab = 256;
  cfg.context = 16;
  cfg.layers = 2;
  cfg.heads = 4;
  cfg.d_model = 64;
  return cfg;
}

template <class T>
void write_array(const std::filesystem::path& path, std::span<const T> values) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(values.data());
  desloc::write_file_atomic(path.string(), std::span(p, values.size_bytes()));
}

std::string json_float(float x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(x));
  return buf;
}

std::string json_floats(const std::vector<float>& xs) {
  std::string s = "[";
  for (std::size_t i = 0; i < xs.size(); ++i) s += (i ? ", " : "") + json_float(xs[i]);
  return s + "]";
}

desloc::model::BackendOptions parity_options() {
  desloc::model::BackendOptions opts;
  opts.threads = 2;  // exercise the multi-threaded kernels
  opts.max_batch = kBatch;
  return opts;
}

// Losses of the first kSteps optimizer steps from the initial params, same batch every step.
std::vector<float> step_losses(desloc::optim::Algorithm optimizer, const std::vector<float>& init,
                               const Batch& batch) {
  auto model = desloc::model::make_model(parity_config(), parity_options());
  std::copy(init.begin(), init.end(), model->params().begin());
  model->params_updated();
  desloc::optim::OptimizerConfig cfg;
  cfg.algorithm = optimizer;
  cfg.beta1 = 0.9f;
  cfg.beta2 = 0.95f;
  cfg.eps = 1e-8f;
  cfg.weight_decay = 0.1f;
  cfg.bias_correction = true;
  desloc::optim::Optimizer opt(cfg, model->layout());
  std::vector<float> losses;
  for (int s = 0; s < kSteps; ++s) {
    losses.push_back(model->forward_backward(batch));
    opt.step(model->params(), model->grads(), kLr);
    model->params_updated();
  }
  return losses;
}

void run(const std::filesystem::path& out) {
  std::filesystem::create_directories(out);
  const GptConfig cfg = parity_config();
  const int T = cfg.context;
  auto model = desloc::model::make_model(cfg, parity_options());
  desloc::model::init_params(model->layout(), cfg, kParamSeed, model->params());
  model->params_updated();
  const std::vector<float> init(model->params().begin(), model->params().end());

  // A batch with structure (targets are the next input) so the step losses fall visibly.
  std::mt19937 rng(kBatchSeed);
  std::uniform_int_distribution<int> token(0, cfg.vocab - 1);
  std::vector<std::int32_t> stream(kBatch * T + 1);
  for (auto& t : stream) t = token(rng);
  std::vector<std::int32_t> inputs(stream.begin(), stream.end() - 1);
  std::vector<std::int32_t> targets(stream.begin() + 1, stream.end());
  const Batch batch{inputs, targets, kBatch, T};

  std::vector<float> logits(static_cast<std::size_t>(kBatch) * T * cfg.vocab);
  const float loss_forward = model->forward(batch, logits);
  const float loss = model->forward_backward(batch);
  if (loss != loss_forward)
    throw desloc::Error("forward() and forward_backward() disagree on the loss: " +
                        json_float(loss_forward) + " vs " + json_float(loss));

  write_array<float>(out / "params.bin", init);
  write_array<float>(out / "grads.bin", model->grads());
  write_array<float>(out / "logits.bin", logits);
  write_array<std::int32_t>(out / "inputs.bin", inputs);
  write_array<std::int32_t>(out / "targets.bin", targets);

  std::string m = "{\n";
  m += "  \"config\": {\"vocab\": " + std::to_string(cfg.vocab) +
       ", \"context\": " + std::to_string(cfg.context) +
       ", \"layers\": " + std::to_string(cfg.layers) + ", \"heads\": " + std::to_string(cfg.heads) +
       ", \"d_model\": " + std::to_string(cfg.d_model) + "},\n";
  m += "  \"B\": " + std::to_string(kBatch) + ", \"T\": " + std::to_string(T) + ",\n";
  m += "  \"loss\": " + json_float(loss) + ",\n";
  m += "  \"optim\": {\"lr\": " + json_float(kLr) +
       ", \"beta1\": 0.9, \"beta2\": 0.95, \"eps\": 1e-8, \"weight_decay\": 0.1, "
       "\"bias_correction\": true, \"steps\": " +
       std::to_string(kSteps) + "},\n";
  m += "  \"step_losses\": {\"adamw\": " +
       json_floats(step_losses(desloc::optim::Algorithm::kAdamW, init, batch)) +
       ", \"adopt\": " + json_floats(step_losses(desloc::optim::Algorithm::kAdopt, init, batch)) +
       "},\n";
  m += "  \"tensors\": [\n";
  const auto& tensors = model->layout().tensors();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    std::string shape;
    for (std::size_t d = 0; d < t.shape.size(); ++d)
      shape += (d ? ", " : "") + std::to_string(t.shape[d]);
    m += "    {\"name\": \"" + t.name + "\", \"shape\": [" + shape +
         "], \"offset\": " + std::to_string(t.offset) + ", \"numel\": " + std::to_string(t.numel) +
         ", \"decay\": " + (t.decay ? "true" : "false") + "}" +
         (i + 1 < tensors.size() ? ",\n" : "\n");
  }
  m += "  ]\n}\n";
  desloc::write_file_atomic((out / "manifest.json").string(),
                            std::span(reinterpret_cast<const std::uint8_t*>(m.data()), m.size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    run(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parity_export: %s\n", e.what());
    return 1;
  }
  return 0;
}
