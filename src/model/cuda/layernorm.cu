// LayerNorm kernels: one warp per row for the normalisation, chunked column sums for the
// weight and bias gradients (deterministic, no atomics).
#include "bias.cuh"
#include "device_reduce.cuh"
#include "layernorm.cuh"

namespace desloc::model::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each

__global__ void layernorm_forward_kernel(float* __restrict__ out, float* __restrict__ mean,
                                         float* __restrict__ rstd, const float* __restrict__ inp,
                                         const float* __restrict__ weight,
                                         const float* __restrict__ bias, int N, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;  // whole warps exit together
  const float* x = inp + static_cast<long long>(row) * C;
  float sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) sum += x[c];
  const float m = warp_sum(sum) / C;
  float var = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float d = x[c] - m;
    var += d * d;
  }
  const float s = 1.0f / sqrtf(warp_sum(var) / C + kLayerNormEps);  // biased variance
  float* o = out + static_cast<long long>(row) * C;
  for (int c = lane; c < C; c += kWarpSize) o[c] = (x[c] - m) * s * weight[c] + bias[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dout * weight.
__global__ void layernorm_backward_kernel(float* __restrict__ dinp, const float* __restrict__ dout,
                                          const float* __restrict__ inp,
                                          const float* __restrict__ weight,
                                          const float* __restrict__ mean,
                                          const float* __restrict__ rstd, int N, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const long long base = static_cast<long long>(row) * C;
  const float m = mean[row];
  const float s = rstd[row];
  float sum_d = 0.0f;
  float sum_dx = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float xhat = (inp[base + c] - m) * s;
    const float d = dout[base + c] * weight[c];
    sum_d += d;
    sum_dx += d * xhat;
  }
  const float mean_d = warp_sum(sum_d) / C;
  const float mean_dx = warp_sum(sum_dx) / C;
  for (int c = lane; c < C; c += kWarpSize) {
    const float xhat = (inp[base + c] - m) * s;
    const float d = dout[base + c] * weight[c];
    dinp[base + c] += (d - mean_d - xhat * mean_dx) * s;
  }
}

constexpr int kTileCols = 32;
constexpr int kTileRows = 8;

// grid (ceil(C / 32), chunks), block (32, 8); same chunking as column_sum in bias.cu.
__global__ void layernorm_param_partial_kernel(float* __restrict__ partial_w,
                                               float* __restrict__ partial_b,
                                               const float* __restrict__ dout,
                                               const float* __restrict__ inp,
                                               const float* __restrict__ mean,
                                               const float* __restrict__ rstd, int N, int C) {
  __shared__ float sums_w[kTileRows][kTileCols];
  __shared__ float sums_b[kTileRows][kTileCols];
  const int col = blockIdx.x * kTileCols + threadIdx.x;
  const int chunk = blockIdx.y;
  const int begin = chunk * kColumnChunkRows;
  const int end = min(N, begin + kColumnChunkRows);
  float sw = 0.0f;
  float sb = 0.0f;
  if (col < C)
    for (int r = begin + threadIdx.y; r < end; r += kTileRows) {
      const long long i = static_cast<long long>(r) * C + col;
      const float d = dout[i];
      sw += d * ((inp[i] - mean[r]) * rstd[r]);
      sb += d;
    }
  sums_w[threadIdx.y][threadIdx.x] = sw;
  sums_b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && col < C) {
    float tw = 0.0f;
    float tb = 0.0f;
    for (int k = 0; k < kTileRows; ++k) {
      tw += sums_w[k][threadIdx.x];
      tb += sums_b[k][threadIdx.x];
    }
    partial_w[static_cast<long long>(chunk) * C + col] = tw;
    partial_b[static_cast<long long>(chunk) * C + col] = tb;
  }
}

}  // namespace

cudaError_t layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int N, int C,
                              cudaStream_t stream) {
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  layernorm_forward_kernel<<<blocks, kRowsPerBlock * kWarpSize, 0, stream>>>(out, mean, rstd, inp,
                                                                             weight, bias, N, C);
  return cudaGetLastError();
}

cudaError_t layernorm_backward(float* dinp, const float* dout, const float* inp,
                               const float* weight, const float* mean, const float* rstd, int N,
                               int C, cudaStream_t stream) {
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  layernorm_backward_kernel<<<blocks, kRowsPerBlock * kWarpSize, 0, stream>>>(
      dinp, dout, inp, weight, mean, rstd, N, C);
  return cudaGetLastError();
}

cudaError_t layernorm_param_backward(float* dweight, float* dbias, const float* dout,
                                     const float* inp, const float* mean, const float* rstd, int N,
                                     int C, float* scratch, cudaStream_t stream) {
  const int chunks = column_chunks(N);
  float* partial_w = scratch;
  float* partial_b = scratch + column_sum_scratch(N, C);
  const dim3 grid((C + kTileCols - 1) / kTileCols, chunks);
  const dim3 block(kTileCols, kTileRows);
  layernorm_param_partial_kernel<<<grid, block, 0, stream>>>(partial_w, partial_b, dout, inp, mean,
                                                             rstd, N, C);
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  status = sum_chunks(dweight, partial_w, chunks, C, stream);
  if (status != cudaSuccess) return status;
  return sum_chunks(dbias, partial_b, chunks, C, stream);
}

}  // namespace desloc::model::cuda
