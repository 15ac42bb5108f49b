// Local optimizers (AdamW, ADOPT), gradient clipping and LR schedules.
// The optimizer state lives in named, contiguous buffers (u = first moment, v = second
// moment) that share ParamLayout's indexing with x, so DES-LOC can average each state on
// its own period (arXiv 2505.22549, Alg. 1).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "desloc/model/param_layout.hpp"

namespace desloc::optim {

// The per-worker state buffers that a sync policy may average, and the gradient.
enum class StateKind : std::uint8_t { kGrad = 0, kX = 1, kU = 2, kV = 3 };
const char* to_string(StateKind kind);

// The local optimizer (optim.name): AdamW, or ADOPT (Taniguchi et al., 2024).
enum class Algorithm : std::uint8_t { kAdamW, kAdopt };
constexpr const char* to_string(Algorithm a) { return a == Algorithm::kAdopt ? "adopt" : "adamw"; }

struct OptimizerConfig {
  Algorithm algorithm = Algorithm::kAdamW;  // optim.name
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;    // decoupled; applied only to tensors with decay = true
  bool bias_correction = true;  // AdamW only; ADOPT has no bias correction
  void validate() const;        // throws ConfigError naming the key
};

struct OptimState {
  std::vector<float> u;  // first moment, ParamLayout order
  std::vector<float> v;  // second moment, ParamLayout order
  std::int64_t t = 0;    // number of optimizer steps taken (bias correction, ADOPT warm start)
};

class Optimizer {
 public:
  Optimizer(OptimizerConfig cfg, const model::ParamLayout& layout);
  // For a plain vector of n parameters (toy problems); weight decay applies to none of them.
  Optimizer(OptimizerConfig cfg, std::size_t n);

  // One update of x with gradient g at learning rate lr.
  //   AdamW: u = b1 u + (1-b1) g; v = b2 v + (1-b2) g^2;
  //          x = x (1 - lr wd) - lr * u_hat / (sqrt(v_hat) + eps)    (torch.optim.AdamW form)
  //   ADOPT (Taniguchi et al. 2024): at t = 0 only v = g^2. Afterwards
  //          u = b1 u + (1-b1) clip(g / max(sqrt(v), eps), t^0.25); x = x (1 - lr wd) - lr u;
  //          v = b2 v + (1-b2) g^2   (v is updated after it normalized g)
  void step(std::span<float> x, std::span<const float> g, float lr);

  OptimState& state() { return state_; }
  const OptimState& state() const { return state_; }
  const OptimizerConfig& config() const { return cfg_; }
  std::span<float> buffer(StateKind kind);  // kU or kV

 private:
  OptimizerConfig cfg_;
  OptimState state_;
  std::vector<float> decay_;  // per-element weight-decay factor, 0 or 1 (built from layout)
};

// Gradient clipping. Both return the global L2 norm of g before clipping.
struct ClipConfig {
  std::string mode = "coord";  // "coord" (clip each coordinate to [-rho, rho], the paper's form)
                               // | "norm" (rescale to global norm <= value) | "none"
  float value = 1.0f;          // rho for "coord", max norm for "norm"
  void validate() const;
};
float clip_gradient(std::span<float> g, const ClipConfig& cfg);
float global_norm(std::span<const float> g);

// Learning-rate schedules over optimizer steps [0, total).
struct ScheduleConfig {
  std::string kind =
      "cosine";      // "cosine" (warmup + cosine) | "wsd" (warmup-stable-decay) | "constant"
  float lr = 3e-3f;  // peak learning rate
  int warmup = 0;    // linear warmup steps from lr/warmup
  float min_lr_ratio = 0.1f;    // floor of the decay, as a fraction of lr
  float decay_fraction = 0.2f;  // wsd: fraction of total steps spent in the final linear decay
  void validate() const;
};
float learning_rate(const ScheduleConfig& cfg, std::int64_t step, std::int64_t total_steps);

}  // namespace desloc::optim
