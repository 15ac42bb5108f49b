// Causal self-attention forward and backward: blocked CBLAS GEMMs per (batch, head).
#include "model/cpu/attention.hpp"

#include <algorithm>
#include <cmath>

#include "model/cpu/fast_math.hpp"
#include "model/cpu/gemm.hpp"

namespace desloc::model::cpu {
namespace {

// Rows per causal block: row block [r0, r1) only attends to keys [0, r1). At T = 128 this
// computes 62.5% of the full (T, T) product instead of 100%.
constexpr int kCausalBlock = 32;

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hd = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH;
    const int h = bh % NH;
    const float* q = qkv + static_cast<long>(b) * T * C3 + h * hd;  // (T, hd), ld 3C
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* a = att + static_cast<long>(bh) * T * T;          // (T, T)
    float* y = out + static_cast<long>(b) * T * C + h * hd;  // (T, hd), ld C
    for (int r0 = 0; r0 < T; r0 += kCausalBlock) {
      const int r1 = std::min(T, r0 + kCausalBlock);
      float* ar = a + static_cast<long>(r0) * T;
      // (r1-r0, hd) @ (r1, hd)^T -> (r1-r0, r1)
      gemm(false, true, r1 - r0, r1, hd, scale, q + static_cast<long>(r0) * C3, C3, k, C3, 0.0f, ar,
           T);
      for (int t = r0; t < r1; ++t) {
        float* row = a + static_cast<long>(t) * T;
        float mx = row[0];
#pragma omp simd reduction(max : mx)
        for (int j = 1; j <= t; ++j) mx = std::max(mx, row[j]);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j <= t; ++j) {
          const float e = exp_approx(row[j] - mx);
          row[j] = e;
          sum += e;
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int j = 0; j <= t; ++j) row[j] *= inv;
        for (int j = t + 1; j < r1; ++j) row[j] = 0.0f;
      }
      // (r1-r0, r1) @ (r1, hd) -> (r1-r0, hd)
      gemm(false, false, r1 - r0, hd, r1, 1.0f, ar, T, v, C3, 0.0f, y + static_cast<long>(r0) * C,
           C);
    }
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
  const int hd = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH;
    const int h = bh % NH;
    const long qoff = static_cast<long>(b) * T * C3 + h * hd;
    const float* q = qkv + qoff;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + qoff;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* a = att + static_cast<long>(bh) * T * T;
    float* ds = scratch + static_cast<long>(bh) * T * T;  // dP, then dS in place
    const float* dy = dout + static_cast<long>(b) * T * C + h * hd;
    for (int r0 = 0; r0 < T; r0 += kCausalBlock) {
      const int r1 = std::min(T, r0 + kCausalBlock);
      float* dsr = ds + static_cast<long>(r0) * T;
      // dP (r1-r0, r1) = dy (r1-r0, hd) @ v (r1, hd)^T
      gemm(false, true, r1 - r0, r1, hd, 1.0f, dy + static_cast<long>(r0) * C, C, v, C3, 0.0f, dsr,
           T);
      // dS = P * (dP - sum_j P dP), zero above the diagonal.
      for (int t = r0; t < r1; ++t) {
        const float* p = a + static_cast<long>(t) * T;
        float* d = ds + static_cast<long>(t) * T;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int j = 0; j <= t; ++j) dot += p[j] * d[j];
#pragma omp simd
        for (int j = 0; j <= t; ++j) d[j] = p[j] * (d[j] - dot);
        for (int j = t + 1; j < r1; ++j) d[j] = 0.0f;
      }
      // dq (r1-r0, hd) = scale * dS (r1-r0, r1) @ k (r1, hd)
      gemm(false, false, r1 - r0, hd, r1, scale, dsr, T, k, C3, 0.0f,
           dq + static_cast<long>(r0) * C3, C3);
    }
    // Column block [c0, c1) of keys receives from query rows [c0, T) only.
    for (int c0 = 0; c0 < T; c0 += kCausalBlock) {
      const int c1 = std::min(T, c0 + kCausalBlock);
      const long roff = static_cast<long>(c0) * T + c0;
      // dk (c1-c0, hd) = scale * dS[c0:T, c0:c1]^T @ q[c0:T]
      gemm(true, false, c1 - c0, hd, T - c0, scale, ds + roff, T, q + static_cast<long>(c0) * C3,
           C3, 0.0f, dk + static_cast<long>(c0) * C3, C3);
      // dv (c1-c0, hd) = P[c0:T, c0:c1]^T @ dy[c0:T]
      gemm(true, false, c1 - c0, hd, T - c0, 1.0f, a + roff, T, dy + static_cast<long>(c0) * C, C,
           0.0f, dv + static_cast<long>(c0) * C3, C3);
    }
  }
}

}  // namespace desloc::model::cpu
