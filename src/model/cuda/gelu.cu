// GELU, tanh approximation: gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#include "device_reduce.cuh"
#include "gelu.cuh"

namespace desloc::model::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

__global__ void bias_gelu_forward_kernel(float* __restrict__ pre, float* __restrict__ out,
                                         const float* __restrict__ bias, int cols, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const float x = pre[i] + bias[i % cols];
    pre[i] = x;
    out[i] = 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kCubic * x * x * x)));
  }
}

__global__ void gelu_backward_kernel(float* __restrict__ d, const float* __restrict__ pre,
                                     long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const float x = pre[i];
    const float th = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
    const float dudx = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    d[i] *= 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * dudx;
  }
}

}  // namespace

cudaError_t bias_gelu_forward(float* pre, float* out, const float* bias, int N, int cols,
                              cudaStream_t stream) {
  constexpr int kThreads = 256;
  const long long n = static_cast<long long>(N) * cols;
  bias_gelu_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(pre, out, bias, cols, n);
  return cudaGetLastError();
}

cudaError_t gelu_backward(float* d, const float* pre, int N, int cols, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const long long n = static_cast<long long>(N) * cols;
  gelu_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(d, pre, n);
  return cudaGetLastError();
}

}  // namespace desloc::model::cuda
