// Row-major SGEMM through CBLAS, split into per-thread tiles by OpenMP.
#include "model/cpu/gemm.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <thread>

namespace desloc::model::cpu {
namespace {

// Tiles are multiples of this many rows/columns so each one keeps OpenBLAS's full-width
// micro-kernels busy (16 floats = one AVX-512 register).
constexpr int kTileAlign = 16;
// Below this many multiply-adds a GEMM is not worth splitting.
constexpr long kMinSplitWork = 1L << 18;

void gemm_serial(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  const int team = omp_in_parallel() ? 1 : omp_get_max_threads();
  const long work = static_cast<long>(M) * N * K;
  if (team <= 1 || work < kMinSplitWork) {
    gemm_serial(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const bool split_m = M >= N;
  const int extent = split_m ? M : N;
  int chunk = (extent + team - 1) / team;
  chunk = (chunk + kTileAlign - 1) / kTileAlign * kTileAlign;
  const int tiles = (extent + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) num_threads(team)
  for (int i = 0; i < tiles; ++i) {
    const int lo = i * chunk;
    const int len = std::min(chunk, extent - lo);
    if (split_m) {
      // Rows [lo, lo+len) of op(A) and C.
      const float* a = trans_a ? A + lo : A + static_cast<long>(lo) * lda;
      gemm_serial(trans_a, trans_b, len, N, K, alpha, a, lda, B, ldb, beta,
                  C + static_cast<long>(lo) * ldc, ldc);
    } else {
      // Columns [lo, lo+len) of op(B) and C.
      const float* b = trans_b ? B + static_cast<long>(lo) * ldb : B + lo;
      gemm_serial(trans_a, trans_b, M, len, K, alpha, A, lda, b, ldb, beta, C + lo, ldc);
    }
  }
}

int set_cpu_threads(int threads) {
  const int n =
      threads > 0 ? threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  openblas_set_num_threads(1);
  omp_set_num_threads(n);
  return n;
}

}  // namespace desloc::model::cpu
