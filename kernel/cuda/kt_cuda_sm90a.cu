// Hopper-only library, built for sm_90a alone. Its GEMM kernel re-balances the
// register file with setmaxnreg (an sm_90a instruction). It loads the common
// library (libkt_cuda.so) through the wheel-relative RUNPATH $ORIGIN/../lib.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gemm_tile.cuh"
#include "kt_cuda.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "kt_cuda_sm90a.cu must be compiled for sm_90a only (CUDA_ARCHITECTURES 90a-real)"
#endif

namespace kt_cuda_kernels {  // named: anonymous namespaces mangle a per-build hash into kernel names

// Two full warpgroups (256 threads) per block, and one block per SM, so every
// warp executes setmaxnreg and raising the register budget never waits on
// another block.
__global__ void __launch_bounds__(256, 1)
    grouped_gemm_sm90a_kernel(const __nv_bfloat16* __restrict__ x, const int64_t* __restrict__ offsets,
                              const __nv_bfloat16* __restrict__ w, int64_t n, int64_t k, float* __restrict__ y) {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n" ::: "memory");
  const int e = blockIdx.z;
  const int64_t begin = offsets[e], end = offsets[e + 1];
  const int64_t row0 = begin + static_cast<int64_t>(blockIdx.y) * kt_cuda::kTile;
  if (row0 >= end) return;
  kt_cuda::gemm_tile(x, w + e * n * k, y, row0, end, static_cast<int64_t>(blockIdx.x) * kt_cuda::kTile, n, k);
}

}  // namespace kt_cuda_kernels
using namespace kt_cuda_kernels;

extern "C" int kt_cuda_sm90a_grouped_gemm_bf16(const void* x, const int64_t* offsets, int experts, const void* w,
                                               int64_t n, int64_t k, float* y, void* stream) {
  if (int err = kt_cuda_check_gemm_args(x, offsets, experts, w, n, k, y)) return err;  // from libkt_cuda.so
  const dim3 grid(static_cast<unsigned>((n + kt_cuda::kTile - 1) / kt_cuda::kTile), 65535u / 16u,
                  static_cast<unsigned>(experts));
  grouped_gemm_sm90a_kernel<<<grid, kt_cuda::kTile * kt_cuda::kTile, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(x), offsets, static_cast<const __nv_bfloat16*>(w), n, k, y);
  return static_cast<int>(cudaGetLastError());
}
