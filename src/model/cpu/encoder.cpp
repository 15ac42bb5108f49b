// Token + position embedding forward and backward.
#include "model/cpu/encoder.hpp"

#include <omp.h>

#include <algorithm>

namespace desloc::model::cpu {

void encoder_forward(float* out, const std::int32_t* inp, const float* wte, const float* wpe, int B,
                     int T, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < B * T; ++i) {
    const float* e = wte + static_cast<long>(inp[i]) * C;
    const float* p = wpe + static_cast<long>(i % T) * C;
    float* o = out + static_cast<long>(i) * C;
#pragma omp simd
    for (int j = 0; j < C; ++j) o[j] = e[j] + p[j];
  }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* inp, int B,
                      int T, int C) {
#pragma omp parallel
  {
    // Channels [lo, hi) of every dwte row; tokens repeat, so rows cannot be split by thread.
    const int nt = omp_get_num_threads();
    const int per = (C + nt - 1) / nt;
    const int lo = std::min(C, omp_get_thread_num() * per);
    const int hi = std::min(C, lo + per);
    for (int i = 0; i < B * T; ++i) {
      float* dw = dwte + static_cast<long>(inp[i]) * C;
      const float* d = dout + static_cast<long>(i) * C;
#pragma omp simd
      for (int j = lo; j < hi; ++j) dw[j] += d[j];
    }
#pragma omp for schedule(static)
    for (int t = 0; t < T; ++t) {
      float* dp = dwpe + static_cast<long>(t) * C;
      for (int b = 0; b < B; ++b) {
        const float* d = dout + (static_cast<long>(b) * T + t) * C;
#pragma omp simd
        for (int j = 0; j < C; ++j) dp[j] += d[j];
      }
    }
  }
}

}  // namespace desloc::model::cpu
