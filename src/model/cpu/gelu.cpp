// GELU (tanh approximation) forward and backward, vectorised through tanh_approx.
#include "model/cpu/gelu.hpp"

#include <algorithm>

#include "model/cpu/fast_math.hpp"

namespace desloc::model::cpu {
namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
// Elements per parallel chunk: large enough to amortise scheduling, small enough to balance.
constexpr long kChunk = 4096;
}  // namespace

void gelu_forward(float* out, const float* inp, long n) {
#pragma omp parallel for schedule(static)
  for (long c = 0; c < n; c += kChunk) {
    const int len = static_cast<int>(std::min(kChunk, n - c));
    const float* in = inp + c;
    float* o = out + c;
#pragma omp simd
    for (int i = 0; i < len; ++i) {
      const float x = in[i];
      const float t = tanh_approx(kSqrt2OverPi * (x + kCubic * x * x * x));
      o[i] = 0.5f * x * (1.0f + t);
    }
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, long n) {
#pragma omp parallel for schedule(static)
  for (long c = 0; c < n; c += kChunk) {
    const int len = static_cast<int>(std::min(kChunk, n - c));
    const float* in = inp + c;
    const float* d = dout + c;
    float* di = dinp + c;
#pragma omp simd
    for (int i = 0; i < len; ++i) {
      const float x = in[i];
      const float t = tanh_approx(kSqrt2OverPi * (x + kCubic * x * x * x));
      const float sech2 = 1.0f - t * t;
      const float grad =
          0.5f * (1.0f + t) + 0.5f * x * sech2 * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
      di[i] = d[i] * grad;
    }
  }
}

}  // namespace desloc::model::cpu
