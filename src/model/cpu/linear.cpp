// Linear layer forward and backward: CBLAS GEMMs plus a deterministic bias reduction.
#include "model/cpu/linear.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "model/cpu/gemm.hpp"

namespace desloc::model::cpu {

void linear_forward(float* out, const float* inp, const float* weight, const float* bias,
                    const float* residual, int N, int IC, int OC) {
  float beta = 0.0f;
  if (bias != nullptr || residual != nullptr) {
    // Pre-broadcast residual + bias into out; the GEMM then accumulates with beta = 1.
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; ++i) {
      float* o = out + static_cast<long>(i) * OC;
      const float* r = residual != nullptr ? residual + static_cast<long>(i) * OC : nullptr;
      if (r != nullptr && bias != nullptr) {
#pragma omp simd
        for (int j = 0; j < OC; ++j) o[j] = r[j] + bias[j];
      } else if (r != nullptr) {
        if (r != o) std::memcpy(o, r, sizeof(float) * OC);
      } else {
        std::memcpy(o, bias, sizeof(float) * OC);
      }
    }
    beta = 1.0f;
  }
  // (N, IC) @ (OC, IC)^T -> (N, OC)
  gemm(false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, beta, out, OC);
}

void column_sum_accumulate(float* out, const float* x, int N, int C) {
  // Each thread sums a static, contiguous block of rows into its own partial; partials are
  // then added in thread order, so the result does not depend on scheduling.
  const int team = omp_in_parallel() ? 1 : omp_get_max_threads();
  std::vector<float> partial(static_cast<std::size_t>(team) * C, 0.0f);
#pragma omp parallel num_threads(team)
  {
    const int tid = omp_get_thread_num();
    const int nt = omp_get_num_threads();
    const int per = (N + nt - 1) / nt;
    const int lo = std::min(N, tid * per);
    const int hi = std::min(N, lo + per);
    float* acc = partial.data() + static_cast<std::size_t>(tid) * C;
    for (int i = lo; i < hi; ++i) {
      const float* row = x + static_cast<long>(i) * C;
#pragma omp simd
      for (int j = 0; j < C; ++j) acc[j] += row[j];
    }
  }
  for (int t = 0; t < team; ++t) {
    const float* acc = partial.data() + static_cast<std::size_t>(t) * C;
#pragma omp simd
    for (int j = 0; j < C; ++j) out[j] += acc[j];
  }
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC) {
  // (N, OC) @ (OC, IC) -> (N, IC)
  if (dinp != nullptr) gemm(false, false, N, IC, OC, 1.0f, dout, OC, weight, IC, 0.0f, dinp, IC);
  // (N, OC)^T @ (N, IC) -> (OC, IC)
  gemm(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
  if (dbias != nullptr) column_sum_accumulate(dbias, dout, N, OC);
}

}  // namespace desloc::model::cpu
