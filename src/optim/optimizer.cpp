// AdamW and ADOPT updates over flat buffers, plus clipping and LR schedules.
#include "desloc/optim/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "desloc/core/error.hpp"

namespace desloc::optim {

const char* to_string(StateKind kind) {
  switch (kind) {
    case StateKind::kGrad:
      return "grad";
    case StateKind::kX:
      return "x";
    case StateKind::kU:
      return "u";
    case StateKind::kV:
      return "v";
  }
  return "?";
}

void OptimizerConfig::validate() const {
  if (!(beta1 >= 0.0f && beta1 < 1.0f))
    throw ConfigError("optim.beta1 = " + std::to_string(beta1) + " must be in [0, 1)");
  if (!(beta2 >= 0.0f && beta2 < 1.0f))
    throw ConfigError("optim.beta2 = " + std::to_string(beta2) + " must be in [0, 1)");
  if (!(eps > 0.0f)) throw ConfigError("optim.eps must be positive, got " + std::to_string(eps));
  if (!(weight_decay >= 0.0f))
    throw ConfigError("optim.weight_decay must be >= 0, got " + std::to_string(weight_decay));
}

Optimizer::Optimizer(OptimizerConfig cfg, const model::ParamLayout& layout) : cfg_(std::move(cfg)) {
  cfg_.validate();
  state_.u.assign(layout.total(), 0.0f);
  state_.v.assign(layout.total(), 0.0f);
  decay_.assign(layout.total(), 0.0f);
  for (const auto& t : layout.tensors())
    if (t.decay) std::fill_n(decay_.begin() + static_cast<std::ptrdiff_t>(t.offset), t.numel, 1.0f);
}

Optimizer::Optimizer(OptimizerConfig cfg, std::size_t n) : cfg_(std::move(cfg)) {
  cfg_.validate();
  state_.u.assign(n, 0.0f);
  state_.v.assign(n, 0.0f);
  decay_.assign(n, 0.0f);
}

std::span<float> Optimizer::buffer(StateKind kind) {
  if (kind == StateKind::kU) return state_.u;
  if (kind == StateKind::kV) return state_.v;
  throw Error(std::string("the optimizer holds only u and v, not '") + to_string(kind) + "'");
}

void Optimizer::step(std::span<float> x, std::span<const float> g, float lr) {
  const std::size_t n = state_.u.size();
  if (x.size() != n || g.size() != n)
    throw Error("optimizer step: buffer sizes differ (x " + std::to_string(x.size()) + ", g " +
                std::to_string(g.size()) + ", state " + std::to_string(n) + ")");
  float* __restrict xs = x.data();
  const float* __restrict gs = g.data();
  float* __restrict u = state_.u.data();
  float* __restrict v = state_.v.data();
  const float* __restrict dmask = decay_.data();
  const float b1 = cfg_.beta1, b2 = cfg_.beta2, eps = cfg_.eps;
  const float wd_lr = lr * cfg_.weight_decay;

  if (cfg_.algorithm == Algorithm::kAdamW) {
    const auto t = static_cast<double>(state_.t + 1);
    // torch.optim.AdamW: x -= lr/bc1 * u / (sqrt(v)/sqrt(bc2) + eps)
    const float bc1 =
        cfg_.bias_correction ? static_cast<float>(1.0 - std::pow(double(b1), t)) : 1.0f;
    const float bc2 =
        cfg_.bias_correction ? static_cast<float>(1.0 - std::pow(double(b2), t)) : 1.0f;
    const float step_size = lr / bc1;
    const float inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < n; ++i) {
      const float gi = gs[i];
      float xi = xs[i] * (1.0f - wd_lr * dmask[i]);
      const float ui = b1 * u[i] + (1.0f - b1) * gi;
      const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
      u[i] = ui;
      v[i] = vi;
      xs[i] = xi - step_size * ui / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
    }
  } else {  // adopt
    if (state_.t == 0) {
      // ADOPT's first step only initialises v with g^2 (Taniguchi et al. 2024, Alg. 2).
#pragma omp parallel for simd schedule(static)
      for (std::size_t i = 0; i < n; ++i) v[i] = gs[i] * gs[i];
    } else {
      const float clip = static_cast<float>(std::pow(static_cast<double>(state_.t), 0.25));
#pragma omp parallel for simd schedule(static)
      for (std::size_t i = 0; i < n; ++i) {
        const float gi = gs[i];
        const float denom = std::max(std::sqrt(v[i]), eps);
        const float ng = std::clamp(gi / denom, -clip, clip);
        const float ui = b1 * u[i] + (1.0f - b1) * ng;
        u[i] = ui;
        xs[i] = xs[i] * (1.0f - wd_lr * dmask[i]) - lr * ui;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
      }
    }
  }
  ++state_.t;
}

void ClipConfig::validate() const {
  if (mode != "coord" && mode != "norm" && mode != "none")
    throw ConfigError("optim.clip = \"" + mode +
                      "\" is unknown; expected \"coord\", \"norm\" or \"none\"");
  if (mode != "none" && !(value > 0.0f))
    throw ConfigError("optim.clip_value must be positive, got " + std::to_string(value));
}

float global_norm(std::span<const float> g) {
  // Double accumulation over fixed contiguous blocks, combined in block order: the result is
  // bitwise reproducible for any thread count (an OpenMP reduction combines in arrival order).
  constexpr std::size_t kBlock = 1 << 16;
  const std::size_t n = g.size();
  const std::size_t blocks = (n + kBlock - 1) / kBlock;
  const float* p = g.data();
  if (blocks <= 1) {
    double s = 0.0;
    for (std::size_t i = 0; i < n; ++i) s += double(p[i]) * double(p[i]);
    return static_cast<float>(std::sqrt(s));
  }
  std::vector<double> partial(blocks, 0.0);
#pragma omp parallel for schedule(static)
  for (std::size_t b = 0; b < blocks; ++b) {
    double s = 0.0;
    const std::size_t end = std::min(n, (b + 1) * kBlock);
    for (std::size_t i = b * kBlock; i < end; ++i) s += double(p[i]) * double(p[i]);
    partial[b] = s;
  }
  double sum = 0.0;
  for (double s : partial) sum += s;
  return static_cast<float>(std::sqrt(sum));
}

float clip_gradient(std::span<float> g, const ClipConfig& cfg) {
  const float norm = global_norm(g);
  float* p = g.data();
  const std::size_t n = g.size();
  if (cfg.mode == "coord") {
    const float rho = cfg.value;
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < n; ++i) p[i] = std::clamp(p[i], -rho, rho);
  } else if (cfg.mode == "norm" && norm > cfg.value) {
    const float scale = cfg.value / (norm + 1e-6f);
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < n; ++i) p[i] *= scale;
  }
  return norm;
}

void ScheduleConfig::validate() const {
  if (kind != "cosine" && kind != "wsd" && kind != "constant")
    throw ConfigError("schedule.kind = \"" + kind +
                      "\" is unknown; expected \"cosine\", \"wsd\" or \"constant\"");
  if (!(lr > 0.0f)) throw ConfigError("schedule.lr must be positive, got " + std::to_string(lr));
  if (warmup < 0) throw ConfigError("schedule.warmup must be >= 0, got " + std::to_string(warmup));
  if (!(min_lr_ratio >= 0.0f && min_lr_ratio <= 1.0f))
    throw ConfigError("schedule.min_lr_ratio must be in [0, 1], got " +
                      std::to_string(min_lr_ratio));
  if (!(decay_fraction > 0.0f && decay_fraction <= 1.0f))
    throw ConfigError("schedule.decay_fraction must be in (0, 1], got " +
                      std::to_string(decay_fraction));
}

float learning_rate(const ScheduleConfig& cfg, std::int64_t step, std::int64_t total_steps) {
  const double peak = cfg.lr;
  const double floor = peak * cfg.min_lr_ratio;
  if (step < cfg.warmup) return static_cast<float>(peak * double(step + 1) / double(cfg.warmup));
  if (cfg.kind == "constant") return cfg.lr;
  const double total = std::max<double>(double(total_steps), double(cfg.warmup) + 1.0);
  if (cfg.kind == "cosine") {
    const double progress =
        std::clamp((double(step) - cfg.warmup) / (total - cfg.warmup), 0.0, 1.0);
    return static_cast<float>(floor +
                              0.5 * (peak - floor) * (1.0 + std::cos(std::numbers::pi * progress)));
  }
  // wsd: constant at the peak, then a linear decay to the floor over the last decay_fraction.
  const double decay_start = total - std::max(1.0, std::round(cfg.decay_fraction * total));
  if (double(step) < decay_start) return cfg.lr;
  const double progress =
      std::clamp((double(step) - decay_start) / (total - decay_start), 0.0, 1.0);
  return static_cast<float>(peak + (floor - peak) * progress);
}

}  // namespace desloc::optim
