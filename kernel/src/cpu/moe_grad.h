// Shared by the MoE forward (moe.cpp) and its backward (moe_grad.cpp) within one CPU variant.
// The fp32 helpers are plain loops: compiled with the variant's -m flags (and -fopenmp-simd),
// the compiler vectorizes them for that ISA.
#ifndef KT_MOE_GRAD_H
#define KT_MOE_GRAD_H

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kt_cpu_api.h"

namespace kt {

inline float silu(float v) { return v / (1.f + std::exp(-v)); }

inline float dot_f32(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += alpha * x
inline void axpy_f32(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// out[j] = sum_i a[j, i] v[i] for the `rank` rows of a LoRA A (row-major, n columns).
inline void lora_a(const float* a, const float* v, int64_t n, int rank, float* out) {
  for (int j = 0; j < rank; ++j) out[j] = dot_f32(a + j * n, v, n);
}

int moe_backward(const kt_moe_args* args, const kt_moe_grad_args* grad, char* err, size_t err_len);

}  // namespace kt

#endif  // KT_MOE_GRAD_H
