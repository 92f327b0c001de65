// Common CUDA library: SASS for sm_80/86/89/90/120 and compute_120 PTX.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cfloat>

#include "gemm_tile.cuh"
#include "kt_cuda.h"

namespace kt_cuda_kernels {  // named: anonymous namespaces mangle a per-build hash into kernel names

constexpr int kMaxExperts = 1024;
constexpr int kMaxTopk = 32;

__global__ void router_topk_kernel(const float* __restrict__ logits, int64_t tokens, int experts, int topk,
                                   int renormalize, int64_t* __restrict__ ids, float* __restrict__ weights) {
  // One warp per token: softmax with warp reductions, then top-k by repeated argmax.
  const int64_t t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= tokens) return;
  const float* row = logits + t * experts;
  float mx = -FLT_MAX;
  for (int e = lane; e < experts; e += 32) mx = fmaxf(mx, row[e]);
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.f;
  for (int e = lane; e < experts; e += 32) sum += __expf(row[e] - mx);
  for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  float picked_sum = 0.f;
  int64_t chosen[kMaxTopk];
  float chosen_w[kMaxTopk];
  for (int j = 0; j < topk; ++j) {
    float best = -FLT_MAX;
    int best_e = experts;
    for (int e = lane; e < experts; e += 32) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= chosen[i] == e;
      const float v = row[e];
      if (!taken && (v > best || (v == best && e < best_e))) {
        best = v;
        best_e = e;
      }
    }
    for (int o = 16; o; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) {
        best = ob;
        best_e = oe;
      }
    }
    chosen[j] = best_e;
    chosen_w[j] = __expf(best - mx) / sum;
    picked_sum += chosen_w[j];
  }
  if (lane == 0)
    for (int j = 0; j < topk; ++j) {
      ids[t * topk + j] = chosen[j];
      weights[t * topk + j] = renormalize ? chosen_w[j] / picked_sum : chosen_w[j];
    }
}

__global__ void dequant_int8_kernel(const int8_t* __restrict__ q, const float* __restrict__ scale, int64_t rows,
                                    int64_t cols, __nv_bfloat16* __restrict__ out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  out[i] = __float2bfloat16(static_cast<float>(q[i]) * scale[i / cols]);
}

__global__ void dequant_rawint4_kernel(const uint8_t* __restrict__ q, const float* __restrict__ scale, int64_t rows,
                                       int64_t cols, int group, __nv_bfloat16* __restrict__ out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  const int64_t block = c / 32, j = c % 32;
  const uint8_t byte = q[r * (cols / 2) + block * 16 + (j % 16)];
  const int nib = j < 16 ? (byte & 0x0F) : (byte >> 4);
  const int value = nib >= 8 ? nib - 16 : nib;
  out[i] = __float2bfloat16(static_cast<float>(value) * scale[r * (cols / group) + c / group]);
}

__global__ void grouped_gemm_kernel(const __nv_bfloat16* __restrict__ x, const int64_t* __restrict__ offsets,
                                    const __nv_bfloat16* __restrict__ w, int64_t n, int64_t k, float* __restrict__ y) {
  const int e = blockIdx.z;
  const int64_t begin = offsets[e], end = offsets[e + 1];
  const int64_t row0 = begin + static_cast<int64_t>(blockIdx.y) * kt_cuda::kTile;
  if (row0 >= end) return;
  kt_cuda::gemm_tile(x, w + e * n * k, y, row0, end, static_cast<int64_t>(blockIdx.x) * kt_cuda::kTile, n, k);
}

int launch_check() { return static_cast<int>(cudaGetLastError()); }

}  // namespace kt_cuda_kernels
using namespace kt_cuda_kernels;

extern "C" {

int kt_cuda_abi_version(void) { return KT_CUDA_ABI_VERSION; }

const char* kt_cuda_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

int kt_cuda_device_count(int* count) { return static_cast<int>(cudaGetDeviceCount(count)); }

int kt_cuda_device_capability(int device, int* major, int* minor) {
  cudaError_t err = cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, device);
  return static_cast<int>(err);
}

int kt_cuda_router_topk_f32(const float* logits, int64_t tokens, int experts, int topk, int renormalize, int64_t* ids,
                            float* weights, void* stream) {
  if (!logits || !ids || !weights || tokens < 0 || experts < 1 || experts > kMaxExperts || topk < 1 ||
      topk > kMaxTopk || topk > experts)
    return static_cast<int>(cudaErrorInvalidValue);
  if (tokens == 0) return 0;
  const int warps = 4;
  const dim3 grid(static_cast<unsigned>((tokens + warps - 1) / warps));
  router_topk_kernel<<<grid, warps * 32, 0, static_cast<cudaStream_t>(stream)>>>(logits, tokens, experts, topk,
                                                                                  renormalize, ids, weights);
  return launch_check();
}

int kt_cuda_dequant_int8_bf16(const int8_t* q, const float* scale, int64_t rows, int64_t cols, void* out,
                              void* stream) {
  if (!q || !scale || !out || rows < 0 || cols < 1) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t total = rows * cols;
  if (total == 0) return 0;
  dequant_int8_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      q, scale, rows, cols, static_cast<__nv_bfloat16*>(out));
  return launch_check();
}

int kt_cuda_dequant_rawint4_bf16(const uint8_t* q, const float* scale, int64_t rows, int64_t cols, int group,
                                 void* out, void* stream) {
  if (!q || !scale || !out || rows < 0 || cols < 32 || cols % 32 || (group != 32 && group != 64 && group != 128) ||
      cols % group)
    return static_cast<int>(cudaErrorInvalidValue);
  const int64_t total = rows * cols;
  if (total == 0) return 0;
  dequant_rawint4_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      q, scale, rows, cols, group, static_cast<__nv_bfloat16*>(out));
  return launch_check();
}

int kt_cuda_check_gemm_args(const void* x, const int64_t* offsets, int experts, const void* w, int64_t n, int64_t k,
                            const float* y) {
  if (!x || !offsets || !w || !y || experts < 1 || n < 1 || k < 1) return static_cast<int>(cudaErrorInvalidValue);
  return 0;
}

int kt_cuda_grouped_gemm_bf16(const void* x, const int64_t* offsets, int experts, const void* w, int64_t n, int64_t k,
                              float* y, void* stream) {
  if (int err = kt_cuda_check_gemm_args(x, offsets, experts, w, n, k, y)) return err;
  // Rows per expert are not known on the host; grid.y covers up to 65535 tiles and
  // blocks past an expert's end return at once.
  const dim3 grid(static_cast<unsigned>((n + kt_cuda::kTile - 1) / kt_cuda::kTile), 65535u / 16u,
                  static_cast<unsigned>(experts));
  grouped_gemm_kernel<<<grid, kt_cuda::kTile * kt_cuda::kTile, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(x), offsets, static_cast<const __nv_bfloat16*>(w), n, k, y);
  return launch_check();
}

}  // extern "C"
