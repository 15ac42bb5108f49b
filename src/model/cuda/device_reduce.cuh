// Warp and block reductions shared by the kernels. Fixed reduction trees, no atomics, so
// every result is bitwise reproducible run to run. Include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace desloc::model::cuda {

constexpr int kWarpSize = 32;

// Butterfly reduction: every lane ends with the same, bitwise identical value.
__device__ __forceinline__ float warp_sum(float v) {
  for (int m = kWarpSize / 2; m > 0; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int m = kWarpSize / 2; m > 0; m /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

// Block-wide reductions for blockDim.x a multiple of 32 and at most 1024. Every thread of
// the block must call them; every thread receives the result.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[kWarpSize];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  __syncthreads();  // `partial` may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_sum(lane < warps ? partial[lane] : 0.0f);
}

__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[kWarpSize];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_max(lane < warps ? partial[lane] : -INFINITY);
}

// Blocks for a grid-stride loop over n elements with `threads` per block.
inline unsigned grid_for(long long n, int threads) {
  const long long blocks = (n + threads - 1) / threads;
  constexpr long long kMaxBlocks = 1 << 20;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

}  // namespace desloc::model::cuda
