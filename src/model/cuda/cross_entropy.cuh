// Softmax cross-entropy over the vocabulary, fused with its backward
// (launchers; kernels in cross_entropy.cu).
#pragma once

#include <cuda_runtime.h>

namespace desloc::model::cuda {

// losses (N) = logsumexp(logits[n]) - logits[n, targets[n]] for logits (N, V).
cudaError_t cross_entropy_forward(float* losses, const float* logits, const int* targets, int N,
                                  int V, cudaStream_t stream);

// As cross_entropy_forward, and overwrites logits (N, V) in place with
// d(loss)/d(logits) = (softmax(logits) - onehot(target)) * dloss, dloss = 1 / (B*T) for the
// mean loss.
cudaError_t cross_entropy_forward_backward(float* losses, float* logits, const int* targets, int N,
                                           int V, float dloss, cudaStream_t stream);

}  // namespace desloc::model::cuda
