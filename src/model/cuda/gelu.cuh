// GELU (tanh approximation) with the fc bias fused in (launchers; kernels in gelu.cu).
#pragma once

#include <cuda_runtime.h>

namespace desloc::model::cuda {

// pre (N, cols) += bias (cols); out (N, cols) = gelu(pre). pre keeps the biased input for
// the backward pass.
cudaError_t bias_gelu_forward(float* pre, float* out, const float* bias, int N, int cols,
                              cudaStream_t stream);

// d (N, cols) *= gelu'(pre), in place: turns d(out) into d(pre).
cudaError_t gelu_backward(float* d, const float* pre, int N, int cols, cudaStream_t stream);

}  // namespace desloc::model::cuda
