// The model interface the trainer drives. Backends (CPU, CUDA) implement it; the trainer,
// optimizer and (later) averagers only see flat host buffers laid out by ParamLayout.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "desloc/model/gpt_config.hpp"
#include "desloc/model/param_layout.hpp"

namespace desloc::model {

// A micro-batch of token ids: inputs and next-token targets, both (B, T) row-major.
struct Batch {
  std::span<const std::int32_t> inputs;   // (B, T)
  std::span<const std::int32_t> targets;  // (B, T)
  int B = 0;
  int T = 0;  // T <= config.context
};

class Model {
 public:
  virtual ~Model() = default;
  Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  virtual const GptConfig& config() const = 0;
  virtual const ParamLayout& layout() const = 0;
  virtual std::string backend_name() const = 0;

  // The fp32 master parameters x on the host (ParamLayout order). After changing them,
  // call params_updated() so a device backend can refresh its copy.
  virtual std::span<float> params() = 0;
  virtual void params_updated() = 0;

  // Gradient of the mean loss w.r.t. params, on the host, valid after forward_backward().
  virtual std::span<float> grads() = 0;

  // Mean cross-entropy over B*T positions (nats). If logits is non-empty it receives the
  // (B, T, V) logits. Does not touch the gradient.
  virtual float forward(const Batch& batch, std::span<float> logits = {}) = 0;

  // forward() then backward(): overwrites grads() with d(mean loss)/d(params).
  virtual float forward_backward(const Batch& batch) = 0;
};

// GPT-2 style init: N(0, 0.02) weights, residual projections scaled by 1/sqrt(2L),
// zero biases, unit LayerNorm gains. Deterministic from the seed.
void init_params(const ParamLayout& layout, const GptConfig& cfg, std::uint64_t seed,
                 std::span<float> params);

// Where the model runs (train.backend).
enum class Backend : std::uint8_t { kCpu, kCuda };
constexpr std::string_view to_string(Backend b) { return b == Backend::kCuda ? "cuda" : "cpu"; }

struct BackendOptions {
  Backend backend = Backend::kCpu;
  int threads = 0;     // CPU threads for loops and BLAS; 0 = hardware concurrency
  int max_batch = 16;  // largest B the activation buffers are sized for
  int device = 0;      // CUDA device ordinal
};

// Floats of the CPU backend's activation arena for batches of up to max_batch sequences of
// model.context tokens: what forward and backward keep per layer, the logits and the
// activation gradients (gpt_cpu.cpp lays them out). In double, so that absurd sizes give a
// huge number rather than an overflowed one. The CUDA backend keeps its activations on the
// device.
double cpu_activation_floats(const GptConfig& cfg, int max_batch);

// Creates a backend. Throws ConfigError for CUDA when this build has no CUDA support or no
// device is present.
std::unique_ptr<Model> make_model(const GptConfig& cfg, const BackendOptions& opts);

// True when this build can create the backend (CUDA also needs a device).
bool backend_available(Backend backend);
// True when the backend was compiled into this build, device or not.
bool backend_compiled(Backend backend);

}  // namespace desloc::model
