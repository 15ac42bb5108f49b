// Bias and residual kernels, and the chunked column sum used for bias gradients.
#include "bias.cuh"
#include "device_reduce.cuh"

namespace desloc::model::cuda {

namespace {

__global__ void add_bias_kernel(float* __restrict__ out, const float* __restrict__ bias, int cols,
                                long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    out[i] += bias[i % cols];
}

// No __restrict__: out may alias residual (each element is read, then written, by one thread).
__global__ void residual_forward_kernel(float* out, const float* residual,
                                        const float* __restrict__ inp,
                                        const float* __restrict__ bias, int C, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    out[i] = residual[i] + inp[i] + bias[i % C];
}

constexpr int kTileCols = 32;  // threadIdx.x: one column each, so row reads coalesce
constexpr int kTileRows = 8;   // threadIdx.y: rows of a chunk, strided

// grid (ceil(cols / 32), chunks), block (32, 8): partial[chunk, col] = sum of the chunk's rows.
__global__ void column_sum_partial_kernel(float* __restrict__ partial,
                                          const float* __restrict__ inp, int rows, int cols) {
  __shared__ float sums[kTileRows][kTileCols];
  const int col = blockIdx.x * kTileCols + threadIdx.x;
  const int chunk = blockIdx.y;
  const int begin = chunk * kColumnChunkRows;
  const int end = min(rows, begin + kColumnChunkRows);
  float sum = 0.0f;
  if (col < cols)
    for (int r = begin + threadIdx.y; r < end; r += kTileRows)
      sum += inp[static_cast<long long>(r) * cols + col];
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
    for (int k = 0; k < kTileRows; ++k) total += sums[k][threadIdx.x];
    partial[static_cast<long long>(chunk) * cols + col] = total;
  }
}

__global__ void sum_chunks_kernel(float* __restrict__ out, const float* __restrict__ partial,
                                  int chunks, int cols) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float total = 0.0f;
  for (int k = 0; k < chunks; ++k) total += partial[static_cast<long long>(k) * cols + col];
  out[col] = total;
}

}  // namespace

cudaError_t add_bias(float* out, const float* bias, int rows, int cols, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const long long n = static_cast<long long>(rows) * cols;
  add_bias_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, bias, cols, n);
  return cudaGetLastError();
}

cudaError_t residual_forward(float* out, const float* residual, const float* inp, const float* bias,
                             int rows, int C, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const long long n = static_cast<long long>(rows) * C;
  residual_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, residual, inp, bias,
                                                                          C, n);
  return cudaGetLastError();
}

cudaError_t sum_chunks(float* out, const float* partial, int chunks, int cols,
                       cudaStream_t stream) {
  constexpr int kThreads = 256;
  sum_chunks_kernel<<<(cols + kThreads - 1) / kThreads, kThreads, 0, stream>>>(out, partial, chunks,
                                                                               cols);
  return cudaGetLastError();
}

cudaError_t column_sum(float* out, const float* inp, int rows, int cols, float* scratch,
                       cudaStream_t stream) {
  const int chunks = column_chunks(rows);
  const dim3 grid((cols + kTileCols - 1) / kTileCols, chunks);
  const dim3 block(kTileCols, kTileRows);
  column_sum_partial_kernel<<<grid, block, 0, stream>>>(scratch, inp, rows, cols);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  return sum_chunks(out, scratch, chunks, cols, stream);
}

}  // namespace desloc::model::cuda
