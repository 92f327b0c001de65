// Shared by the MoE forward (moe.cpp) and its backward (moe_grad.cpp) within one CPU variant.
// The fp32 helpers are plain loops: compiled with the variant's -m flags (and -fopenmp-simd),
// the compiler vectorizes them for that ISA.
#ifndef KT_MOE_GRAD_H
#define KT_MOE_GRAD_H

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "isa.h"
#include "kt_cpu_api.h"

namespace kt {

#if defined(KT_ISA_AMX_INT8)
// exp of 16 floats: x = n ln2 + r with |r| <= ln2 / 2, e^r by Cephes' expf polynomial, 2^n from the
// exponent bits (within 2 ulp of std::exp). x is clamped to [-87, 87], so exp(-g) of a large |g|
// saturates where std::exp would reach 0 or inf: silu(g) is still ~0 or ~g, and a NaN g gives NaN.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(87.f)), _mm512_set1_ps(-87.f));
  const __m512i n = _mm512_cvtps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)));
  const __m512 nf = _mm512_cvtepi32_ps(n);
  __m512 r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(0.693359375f), x);  // ln2 in two parts: n * the first is exact
  r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}
inline __m512 silu16(__m512 g) {
  return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
}
// The amx variant's AMX forward runs silu 16 pairs at a time (silu16); every other silu of that variant
// is the same instructions on one lane, so a token's output does not depend on which path it took.
inline float silu(float v) { return _mm_cvtss_f32(_mm512_castps512_ps128(silu16(_mm512_set1_ps(v)))); }
#else
inline float silu(float v) { return v / (1.f + std::exp(-v)); }
#endif

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
