// Row-major SGEMM through CBLAS, split into per-thread tiles by OpenMP.
// All parallelism in the CPU backend comes from one OpenMP team; OpenBLAS runs single-threaded
// inside each tile, so two thread pools never spin against each other on the same cores.
#pragma once

namespace desloc::model::cpu {

// C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C, all row-major with leading
// dimensions lda/ldb/ldc. op(X) = X^T when trans_x. Splits the larger of M and N across the
// OpenMP team with a static partition (bitwise reproducible for a fixed thread count); inside
// an active parallel region it runs as one call.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);

// Makes OpenBLAS single-threaded and sets the OpenMP team size (0 = hardware concurrency).
// Returns the team size in effect.
int set_cpu_threads(int threads);

}  // namespace desloc::model::cpu
