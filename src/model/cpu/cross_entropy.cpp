// Fused softmax + cross-entropy forward and (in-place) backward.
#include "model/cpu/cross_entropy.hpp"

#include <algorithm>
#include <cmath>

#include "model/cpu/fast_math.hpp"

namespace desloc::model::cpu {

void softmax_cross_entropy(float* logits, float* losses, const std::int32_t* targets, int N, int V,
                           bool backward, float dloss) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    float* row = logits + static_cast<long>(i) * V;
    float mx = row[0];
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < V; ++j) mx = std::max(mx, row[j]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < V; ++j) sum += exp_approx(row[j] - mx);
    const int y = targets[i];
    losses[i] = std::log(sum) + mx - row[y];
    if (backward) {
      const float s = dloss / sum;
#pragma omp simd
      for (int j = 0; j < V; ++j) row[j] = exp_approx(row[j] - mx) * s;
      row[y] -= dloss;
    }
  }
}

}  // namespace desloc::model::cpu
