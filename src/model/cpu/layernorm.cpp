// LayerNorm forward and backward, one row per iteration, channel loops vectorised.
#include "model/cpu/layernorm.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace desloc::model::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const float* x = inp + static_cast<long>(i) * C;
    float* o = out + static_cast<long>(i) * C;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < C; ++j) s += x[j];
    const float m = s / static_cast<float>(C);
    // Two-pass (biased) variance like torch: no cancellation from E[x^2] - m^2.
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int j = 0; j < C; ++j) v += (x[j] - m) * (x[j] - m);
    const float r = 1.0f / std::sqrt(v / static_cast<float>(C) + kLayerNormEps);
#pragma omp simd
    for (int j = 0; j < C; ++j) o[j] = (x[j] - m) * r * weight[j] + bias[j];
    mean[i] = m;
    rstd[i] = r;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  // Per-thread partials of dweight/dbias over a static block of rows, summed in thread order.
  const int team = omp_get_max_threads();
  std::vector<float> partial(static_cast<std::size_t>(team) * 2 * C, 0.0f);
#pragma omp parallel num_threads(team)
  {
    const int tid = omp_get_thread_num();
    const int nt = omp_get_num_threads();
    const int per = (N + nt - 1) / nt;
    const int lo = std::min(N, tid * per);
    const int hi = std::min(N, lo + per);
    float* dw = partial.data() + static_cast<std::size_t>(tid) * 2 * C;
    float* db = dw + C;
    for (int i = lo; i < hi; ++i) {
      const float* x = inp + static_cast<long>(i) * C;
      const float* d = dout + static_cast<long>(i) * C;
      float* dx = dinp + static_cast<long>(i) * C;
      const float m = mean[i];
      const float r = rstd[i];
      // dxhat = d * w; dx = r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
      float sum_g = 0.0f;
      float sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
      for (int j = 0; j < C; ++j) {
        const float xhat = (x[j] - m) * r;
        const float g = d[j] * weight[j];
        sum_g += g;
        sum_gx += g * xhat;
      }
      const float mg = sum_g / static_cast<float>(C);
      const float mgx = sum_gx / static_cast<float>(C);
#pragma omp simd
      for (int j = 0; j < C; ++j) {
        const float xhat = (x[j] - m) * r;
        dx[j] += r * (d[j] * weight[j] - mg - xhat * mgx);
        dw[j] += d[j] * xhat;
        db[j] += d[j];
      }
    }
  }
  for (int t = 0; t < team; ++t) {
    const float* dw = partial.data() + static_cast<std::size_t>(t) * 2 * C;
#pragma omp simd
    for (int j = 0; j < C; ++j) {
      dweight[j] += dw[j];
      dbias[j] += dw[C + j];
    }
  }
}

}  // namespace desloc::model::cpu
