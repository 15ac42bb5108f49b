// The non-GEMM parts of causal self-attention: head (un)permutes and the causal softmax,
// forward and backward (launchers; kernels in attention.cu). The GEMMs are cuBLAS calls.
#pragma once

#include <cuda_runtime.h>

namespace desloc::model::cuda {

// dst (B, NH, T, hd) = columns [col_offset + h*hd, col_offset + (h+1)*hd) of src (B, T, width).
cudaError_t split_heads(float* dst, const float* src, int width, int col_offset, int B, int T,
                        int NH, int hd, cudaStream_t stream);

// The inverse: columns [col_offset + h*hd, ...) of dst (B, T, width) = src (B, NH, T, hd).
cudaError_t merge_heads(float* dst, const float* src, int width, int col_offset, int B, int T,
                        int NH, int hd, cudaStream_t stream);

// In place over rows of att (rows, T), rows = B*NH*T, row r at query t = r % T: the already
// scaled scores become softmax over keys j <= t, and 0 for j > t.
cudaError_t causal_softmax_forward(float* att, int rows, int T, cudaStream_t stream);

// In place: datt (rows, T) = P * (datt - sum_j P_j datt_j) for j <= t, 0 for j > t, where
// P (rows, T) is the forward's output. Gives d(loss)/d(scaled scores).
cudaError_t causal_softmax_backward(float* datt, const float* att, int rows, int T,
                                    cudaStream_t stream);

}  // namespace desloc::model::cuda
