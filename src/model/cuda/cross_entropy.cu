// Fused softmax + cross-entropy over the vocabulary: one block per (b, t) row.
#include "cross_entropy.cuh"
#include "device_reduce.cuh"

namespace desloc::model::cuda {

namespace {

constexpr int kThreads = 256;

// dlogits may alias logits (in-place backward), so neither is __restrict__. Each element is
// read and then written by the same thread, and the target's logit is read before the block
// synchronises inside the reductions, i.e. before any thread writes.
__global__ void cross_entropy_kernel(float* __restrict__ losses, float* dlogits,
                                     const float* logits, const int* __restrict__ targets, int V,
                                     float dloss) {
  const long long row = blockIdx.x;
  const float* l = logits + row * V;
  const int target = targets[row];
  const float target_logit = l[target];
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, l[j]);
  mx = block_max(mx);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(l[j] - mx);
  sum = block_sum(sum);
  if (threadIdx.x == 0) losses[row] = logf(sum) + mx - target_logit;
  if (dlogits == nullptr) return;
  const float inv = 1.0f / sum;
  float* d = dlogits + row * V;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float p = expf(l[j] - mx) * inv;
    d[j] = (p - (j == target ? 1.0f : 0.0f)) * dloss;
  }
}

}  // namespace

cudaError_t cross_entropy_forward(float* losses, const float* logits, const int* targets, int N,
                                  int V, cudaStream_t stream) {
  cross_entropy_kernel<<<N, kThreads, 0, stream>>>(losses, nullptr, logits, targets, V, 0.0f);
  return cudaGetLastError();
}

cudaError_t cross_entropy_forward_backward(float* losses, float* logits, const int* targets, int N,
                                           int V, float dloss, cudaStream_t stream) {
  cross_entropy_kernel<<<N, kThreads, 0, stream>>>(losses, logits, logits, targets, V, dloss);
  return cudaGetLastError();
}

}  // namespace desloc::model::cuda
