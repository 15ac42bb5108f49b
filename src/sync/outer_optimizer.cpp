// DiLoCo-style outer Nesterov step on the parameter average.
#include "desloc/sync/outer_optimizer.hpp"

#include <string>

#include "desloc/core/error.hpp"

namespace desloc::sync {

void OuterNesterov::reset(std::span<const float> x) {
  x_ref_.assign(x.begin(), x.end());
  m_.assign(x.size(), 0.0f);
}

void OuterNesterov::step(std::span<float> mean_x) {
  if (mean_x.size() != x_ref_.size())
    throw Error("outer optimizer: parameter count changed since reset()");
  step(mean_x, 0);
}

void OuterNesterov::step(std::span<float> mean_x, std::size_t offset) {
  if (offset > x_ref_.size() || mean_x.size() > x_ref_.size() - offset)
    throw Error("outer optimizer: elements [" + std::to_string(offset) + ", " +
                std::to_string(offset + mean_x.size()) + ") of " + std::to_string(x_ref_.size()) +
                " parameters");
  float* ref = x_ref_.data() + offset;
  float* mom = m_.data() + offset;
  const std::size_t n = mean_x.size();
#pragma omp parallel for simd schedule(static)
  for (std::size_t i = 0; i < n; ++i) {
    const float delta = ref[i] - mean_x[i];
    const float m = momentum_ * mom[i] + delta;
    mom[i] = m;
    const float x_new = ref[i] - lr_ * (delta + momentum_ * m);
    ref[i] = x_new;
    mean_x[i] = x_new;
  }
}

}  // namespace desloc::sync
