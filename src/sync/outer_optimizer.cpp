// DiLoCo-style outer Nesterov step on the parameter average.
#include "desloc/sync/outer_optimizer.hpp"

#include "desloc/core/error.hpp"

namespace desloc::sync {

void OuterNesterov::reset(std::span<const float> x) {
  x_ref_.assign(x.begin(), x.end());
  m_.assign(x.size(), 0.0f);
}

void OuterNesterov::step(std::span<float> mean_x) {
  if (mean_x.size() != x_ref_.size())
    throw Error("outer optimizer: parameter count changed since reset()");
  const std::size_t n = mean_x.size();
#pragma omp parallel for simd schedule(static)
  for (std::size_t i = 0; i < n; ++i) {
    const float delta = x_ref_[i] - mean_x[i];
    const float m = momentum_ * m_[i] + delta;
    m_[i] = m;
    const float x_new = x_ref_[i] - lr_ * (delta + momentum_ * m);
    x_ref_[i] = x_new;
    mean_x[i] = x_new;
  }
}

}  // namespace desloc::sync
