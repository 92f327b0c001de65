// Shared-memory tiled bf16 GEMM tile, used by the common and the sm_90a kernels.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

namespace kt_cuda {

constexpr int kTile = 16;

// One 16x16 output tile of y[row0:, col0:] for rows [row0, row_end) of one expert.
__device__ __forceinline__ void gemm_tile(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                          float* __restrict__ y, int64_t row0, int64_t row_end, int64_t col0,
                                          int64_t n, int64_t k) {
  __shared__ float xs[kTile][kTile + 1];
  __shared__ float ws[kTile][kTile + 1];
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t row = row0 + ty, col = col0 + tx;
  float acc = 0.f;
  for (int64_t k0 = 0; k0 < k; k0 += kTile) {
    xs[ty][tx] = (row < row_end && k0 + tx < k) ? __bfloat162float(x[row * k + k0 + tx]) : 0.f;
    const int64_t wrow = col0 + ty;
    ws[ty][tx] = (wrow < n && k0 + tx < k) ? __bfloat162float(w[wrow * k + k0 + tx]) : 0.f;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kTile; ++j) acc += xs[ty][j] * ws[tx][j];
    __syncthreads();
  }
  if (row < row_end && col < n) y[row * n + col] = acc;
}

}  // namespace kt_cuda
