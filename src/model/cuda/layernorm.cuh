// LayerNorm (eps 1e-5, affine), forward and backward (launchers; kernels in layernorm.cu).
#pragma once

#include <cuda_runtime.h>

namespace desloc::model::cuda {

constexpr float kLayerNormEps = 1e-5f;

// out (N, C) = (inp - mean) * rstd * weight + bias, per row; saves mean (N) and rstd (N).
cudaError_t layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int N, int C,
                              cudaStream_t stream);

// dinp (N, C) += d(loss)/d(inp) given dout (N, C): accumulates into the residual stream.
cudaError_t layernorm_backward(float* dinp, const float* dout, const float* inp,
                               const float* weight, const float* mean, const float* rstd, int N,
                               int C, cudaStream_t stream);

// dweight (C) = sum over rows of dout * xhat, dbias (C) = sum of dout (overwritten).
// scratch holds 2 * column_sum_scratch(N, C) floats (see bias.cuh).
cudaError_t layernorm_param_backward(float* dweight, float* dbias, const float* dout,
                                     const float* inp, const float* mean, const float* rstd, int N,
                                     int C, float* scratch, cudaStream_t stream);

}  // namespace desloc::model::cuda
