// Embedding kernels: x0 = wte[token] + wpe[position], and their deterministic backward.
#include "device_reduce.cuh"
#include "encoder.cuh"

namespace desloc::model::cuda {

namespace {

__global__ void encoder_forward_kernel(float* __restrict__ out, const int* __restrict__ tokens,
                                       const float* __restrict__ wte, const float* __restrict__ wpe,
                                       int T, int C, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long bt = i / C;
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(bt % T);
    out[i] =
        wte[static_cast<long long>(tokens[bt]) * C + c] + wpe[static_cast<long long>(t) * C + c];
  }
}

// grid (U, ceil(C / blockDim.x)): one block column per distinct token.
__global__ void wte_backward_kernel(float* __restrict__ dwte, const float* __restrict__ dout,
                                    const int* __restrict__ unique_tokens,
                                    const int* __restrict__ offsets,
                                    const int* __restrict__ positions, int C) {
  const int u = blockIdx.x;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sum = 0.0f;
  for (int p = offsets[u]; p < offsets[u + 1]; ++p)
    sum += dout[static_cast<long long>(positions[p]) * C + c];
  dwte[static_cast<long long>(unique_tokens[u]) * C + c] += sum;
}

__global__ void wpe_backward_kernel(float* __restrict__ dwpe, const float* __restrict__ dout, int B,
                                    int T, int C) {
  const long long n = static_cast<long long>(T) * C;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int b = 0; b < B; ++b) sum += dout[static_cast<long long>(b) * n + i];
    dwpe[i] = sum;
  }
}

}  // namespace

cudaError_t encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe,
                            int B, int T, int C, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const long long n = static_cast<long long>(B) * T * C;
  encoder_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, tokens, wte, wpe, T,
                                                                         C, n);
  return cudaGetLastError();
}

cudaError_t wte_backward(float* dwte, const float* dout, const int* unique_tokens,
                         const int* offsets, const int* positions, int unique_count, int C,
                         cudaStream_t stream) {
  if (unique_count == 0) return cudaSuccess;
  constexpr int kThreads = 128;
  const dim3 grid(unique_count, (C + kThreads - 1) / kThreads);
  wte_backward_kernel<<<grid, kThreads, 0, stream>>>(dwte, dout, unique_tokens, offsets, positions,
                                                     C);
  return cudaGetLastError();
}

cudaError_t wpe_backward(float* dwpe, const float* dout, int B, int T, int C, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const long long n = static_cast<long long>(T) * C;
  wpe_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dwpe, dout, B, T, C);
  return cudaGetLastError();
}

}  // namespace desloc::model::cuda
