// LayerNorm over the channel dimension, eps = 1e-5, with a gain and a bias (torch.nn.LayerNorm).
#pragma once

namespace desloc::model::cpu {

inline constexpr float kLayerNormEps = 1e-5f;

// out (N, C) = (inp - mean) * rstd * weight + bias; mean, rstd (N) are kept for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);

// dinp (N, C) += d/dinp (accumulates: the residual stream's gradient flows through here);
// dweight, dbias (C) += their gradients. Deterministic for a fixed thread count.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

}  // namespace desloc::model::cpu
