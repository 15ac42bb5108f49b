// Token + position embedding, forward and backward (launchers; kernels in encoder.cu).
#pragma once

#include <cuda_runtime.h>

namespace desloc::model::cuda {

// out (B, T, C) = wte[tokens[b, t]] + wpe[t]; tokens (B, T), wte (V, C), wpe (>= T, C).
cudaError_t encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe,
                            int B, int T, int C, cudaStream_t stream);

// dwte[tok] += sum of dout over the positions holding tok, for each distinct token, in
// ascending position order (deterministic, no atomics). The host groups positions by token:
// unique_tokens (U), offsets (U + 1) into positions (B*T), each position a row b*T + t.
cudaError_t wte_backward(float* dwte, const float* dout, const int* unique_tokens,
                         const int* offsets, const int* positions, int unique_count, int C,
                         cudaStream_t stream);

// dwpe[t] = sum over b of dout[b, t] for t < T; dout (B, T, C), dwpe (>= T, C).
cudaError_t wpe_backward(float* dwpe, const float* dout, int B, int T, int C, cudaStream_t stream);

}  // namespace desloc::model::cuda
