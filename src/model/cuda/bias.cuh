// Bias add, residual add and the deterministic column sums behind every bias gradient
// (launchers; kernels in bias.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace desloc::model::cuda {

// Column sums reduce rows in chunks of kColumnChunkRows (one partial row per chunk, in a
// scratch buffer), then add the chunks in order: parallel over rows, yet deterministic.
constexpr int kColumnChunkRows = 128;
inline int column_chunks(int rows) { return (rows + kColumnChunkRows - 1) / kColumnChunkRows; }
// Floats of scratch a column sum over (rows, cols) needs.
inline std::size_t column_sum_scratch(int rows, int cols) {
  return static_cast<std::size_t>(column_chunks(rows)) * static_cast<std::size_t>(cols);
}

// out (rows, cols) += bias (cols), broadcast over rows.
cudaError_t add_bias(float* out, const float* bias, int rows, int cols, cudaStream_t stream);

// out (rows, C) = residual (rows, C) + inp (rows, C) + bias (C). out may alias residual.
cudaError_t residual_forward(float* out, const float* residual, const float* inp, const float* bias,
                             int rows, int C, cudaStream_t stream);

// out (cols) = sum over rows of inp (rows, cols); scratch holds column_sum_scratch floats.
cudaError_t column_sum(float* out, const float* inp, int rows, int cols, float* scratch,
                       cudaStream_t stream);

// out (cols) = sum over chunks of partial (chunks, cols), chunk 0 first.
cudaError_t sum_chunks(float* out, const float* partial, int chunks, int cols, cudaStream_t stream);

}  // namespace desloc::model::cuda
