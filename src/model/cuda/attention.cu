// Causal attention helpers: head permutes and a warp-per-row causal softmax.
#include "attention.cuh"
#include "device_reduce.cuh"

namespace desloc::model::cuda {

namespace {

// One thread per element of the (B, NH, T, hd) tensor: writes to it coalesce, and reads from
// the (B, T, width) tensor coalesce within each head's hd columns.
__global__ void split_heads_kernel(float* __restrict__ dst, const float* __restrict__ src,
                                   int width, int col_offset, int T, int NH, int hd, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int d = static_cast<int>(i % hd);
    const int t = static_cast<int>((i / hd) % T);
    const int h = static_cast<int>((i / (static_cast<long long>(hd) * T)) % NH);
    const long long b = i / (static_cast<long long>(hd) * T * NH);
    dst[i] = src[(b * T + t) * width + col_offset + h * hd + d];
  }
}

__global__ void merge_heads_kernel(float* __restrict__ dst, const float* __restrict__ src,
                                   int width, int col_offset, int T, int NH, int hd, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int d = static_cast<int>(i % hd);
    const int t = static_cast<int>((i / hd) % T);
    const int h = static_cast<int>((i / (static_cast<long long>(hd) * T)) % NH);
    const long long b = i / (static_cast<long long>(hd) * T * NH);
    dst[(b * T + t) * width + col_offset + h * hd + d] = src[i];
  }
}

constexpr int kRowsPerBlock = 8;  // warps per block, one attention row each

__global__ void causal_softmax_forward_kernel(float* __restrict__ att, int rows, int T) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;
  const int t = row % T;
  float* a = att + static_cast<long long>(row) * T;
  float mx = -INFINITY;
  for (int j = lane; j <= t; j += kWarpSize) mx = fmaxf(mx, a[j]);
  mx = warp_max(mx);  // finite: key 0 is always visible
  float sum = 0.0f;
  for (int j = lane; j <= t; j += kWarpSize) sum += expf(a[j] - mx);
  const float inv = 1.0f / warp_sum(sum);
  for (int j = lane; j < T; j += kWarpSize) a[j] = j <= t ? expf(a[j] - mx) * inv : 0.0f;
}

__global__ void causal_softmax_backward_kernel(float* __restrict__ datt,
                                               const float* __restrict__ att, int rows, int T) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;
  const int t = row % T;
  const long long base = static_cast<long long>(row) * T;
  float dot = 0.0f;
  for (int j = lane; j <= t; j += kWarpSize) dot += att[base + j] * datt[base + j];
  dot = warp_sum(dot);
  for (int j = lane; j < T; j += kWarpSize)
    datt[base + j] = j <= t ? att[base + j] * (datt[base + j] - dot) : 0.0f;
}

}  // namespace

cudaError_t split_heads(float* dst, const float* src, int width, int col_offset, int B, int T,
                        int NH, int hd, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const long long n = static_cast<long long>(B) * NH * T * hd;
  split_heads_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dst, src, width, col_offset, T,
                                                                     NH, hd, n);
  return cudaGetLastError();
}

cudaError_t merge_heads(float* dst, const float* src, int width, int col_offset, int B, int T,
                        int NH, int hd, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const long long n = static_cast<long long>(B) * NH * T * hd;
  merge_heads_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dst, src, width, col_offset, T,
                                                                     NH, hd, n);
  return cudaGetLastError();
}

cudaError_t causal_softmax_forward(float* att, int rows, int T, cudaStream_t stream) {
  const int blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  causal_softmax_forward_kernel<<<blocks, kRowsPerBlock * kWarpSize, 0, stream>>>(att, rows, T);
  return cudaGetLastError();
}

cudaError_t causal_softmax_backward(float* datt, const float* att, int rows, int T,
                                    cudaStream_t stream) {
  const int blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  causal_softmax_backward_kernel<<<blocks, kRowsPerBlock * kWarpSize, 0, stream>>>(datt, att, rows,
                                                                                   T);
  return cudaGetLastError();
}

}  // namespace desloc::model::cuda
