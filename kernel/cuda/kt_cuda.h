// kt_kernel CUDA launchers: plain C ABI, device pointers and a stream handle
// (cudaStream_t as void*), callable through ctypes with torch tensors'
// data_ptr() and torch.cuda.current_stream().cuda_stream. Nothing links libtorch.
// Every function returns a cudaError_t value (0 = success).
#ifndef KT_CUDA_H
#define KT_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KT_CUDA_API __attribute__((visibility("default")))
#define KT_CUDA_ABI_VERSION 1

KT_CUDA_API int kt_cuda_abi_version(void);
KT_CUDA_API const char* kt_cuda_error_string(int code);
KT_CUDA_API int kt_cuda_device_count(int* count);
KT_CUDA_API int kt_cuda_device_capability(int device, int* major, int* minor);

// Fused router: softmax over `experts` logits per token, then the top-k
// experts (ties -> lower index); weights renormalised to sum 1 if asked.
KT_CUDA_API int kt_cuda_router_topk_f32(const float* logits, int64_t tokens, int experts, int topk, int renormalize,
                                        int64_t* ids, float* weights, void* stream);

// Dequantisation to bf16 (layouts as in kernel/src/common/kt_cpu_api.h).
KT_CUDA_API int kt_cuda_dequant_int8_bf16(const int8_t* q, const float* scale, int64_t rows, int64_t cols,
                                          void* out, void* stream);
KT_CUDA_API int kt_cuda_dequant_rawint4_bf16(const uint8_t* q, const float* scale, int64_t rows, int64_t cols,
                                             int group, void* out, void* stream);

// Grouped expert GEMM: rows [offsets[e], offsets[e+1]) of x (bf16 [M, k]) times
// w[e]^T (bf16 [experts, n, k]) into y (f32 [M, n]).
KT_CUDA_API int kt_cuda_grouped_gemm_bf16(const void* x, const int64_t* offsets, int experts, const void* w, int64_t n,
                                          int64_t k, float* y, void* stream);
// Host-side argument check shared with the sm_90a library; 0 or cudaErrorInvalidValue.
KT_CUDA_API int kt_cuda_check_gemm_args(const void* x, const int64_t* offsets, int experts, const void* w, int64_t n,
                                        int64_t k, const float* y);

// libkt_cuda_sm90a.so only: the same GEMM through a Hopper-only (sm_90a) kernel.
KT_CUDA_API int kt_cuda_sm90a_grouped_gemm_bf16(const void* x, const int64_t* offsets, int experts, const void* w,
                                                int64_t n, int64_t k, float* y, void* stream);

#ifdef __cplusplus
}
#endif

#endif
