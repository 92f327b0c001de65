// Shared by the MoE forward (moe.cpp) and its backward (moe_grad.cpp) within one CPU variant.
// The fp32 helpers are plain loops: compiled with the variant's -m flags (and -fopenmp-simd),
// the compiler vectorizes them for that ISA.
#ifndef KT_MOE_GRAD_H
#define KT_MOE_GRAD_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "isa.h"
#include "kt_cpu_api.h"

namespace kt {

// silu(g) = g / (1 + e^-g), the same on every variant: e^x as x = n ln2 + r with |r| <= ln2 / 2, e^r by
// Cephes' expf polynomial, 2^n from the exponent bits (within 2 ulp of std::exp). x is clamped to
// [-87, 87], so e^-g of a large |g| saturates where std::exp would reach 0 or inf: silu(g) is still ~0
// or ~g, and a NaN g gives NaN. The AVX2 form is the same operations on 8 lanes, so every variant gets
// the same h from the same g and u, whichever path (AMX tiles, a row block, one element) made it.
// (std::exp per element was 3-7% of a one-thread RAWINT4 decode forward.)
// One body for both widths (W = 512 or 256: _mm512_* on __m512, _mm256_* on __m256), so the two
// cannot drift apart.
#define KT_SILU_FOR_WIDTH(W)                                                                                 \
  using vf = __m##W;                                                                                         \
  constexpr int kLanes = W / 32;                                                                             \
  inline vf vf_load(const float* p) { return _mm##W##_loadu_ps(p); }                                         \
  inline void vf_store(float* p, vf v) { _mm##W##_storeu_ps(p, v); }                                         \
  inline vf mul_v(vf a, vf b) { return _mm##W##_mul_ps(a, b); }                                              \
  inline vf add_v(vf a, vf b) { return _mm##W##_add_ps(a, b); }                                              \
  inline vf sub_v(vf a, vf b) { return _mm##W##_sub_ps(a, b); }                                              \
  inline vf div_v(vf a, vf b) { return _mm##W##_div_ps(a, b); }                                              \
  inline vf set1_v(float v) { return _mm##W##_set1_ps(v); }                                                  \
  inline vf fmadd_v(vf a, vf b, vf c) { return _mm##W##_fmadd_ps(a, b, c); }                                 \
  inline vf fnmadd_v(vf a, vf b, vf c) { return _mm##W##_fnmadd_ps(a, b, c); }                               \
  inline vf exp_v(vf x) {                                                                                    \
    x = _mm##W##_max_ps(_mm##W##_min_ps(x, set1_v(87.f)), set1_v(-87.f));                                    \
    const __m##W##i n = _mm##W##_cvtps_epi32(mul_v(x, set1_v(1.44269504088896341f)));                        \
    const vf nf = _mm##W##_cvtepi32_ps(n);                                                                   \
    /* ln2 in two parts: n * the first is exact */                                                           \
    vf r = fnmadd_v(nf, set1_v(0.693359375f), x);                                                            \
    r = fnmadd_v(nf, set1_v(-2.12194440e-4f), r);                                                            \
    vf p = set1_v(1.9875691500e-4f);                                                                         \
    p = fmadd_v(p, r, set1_v(1.3981999507e-3f));                                                             \
    p = fmadd_v(p, r, set1_v(8.3334519073e-3f));                                                             \
    p = fmadd_v(p, r, set1_v(4.1665795894e-2f));                                                             \
    p = fmadd_v(p, r, set1_v(1.6666665459e-1f));                                                             \
    p = fmadd_v(p, r, set1_v(5.0000001201e-1f));                                                             \
    p = fmadd_v(mul_v(p, r), r, add_v(r, set1_v(1.f)));                                                      \
    const __m##W##i e = _mm##W##_slli_epi32(_mm##W##_add_epi32(n, _mm##W##_set1_epi32(127)), 23);            \
    return mul_v(p, _mm##W##_castsi##W##_ps(e));                                                             \
  }                                                                                                          \
  /* 1 + e^-g: silu(g) = g / silu_den(g), and the backward's sigmoid is 1 / silu_den(g) */                   \
  inline vf silu_den(vf g) { return add_v(set1_v(1.f), exp_v(sub_v(_mm##W##_setzero_ps(), g))); }            \
  inline vf silu_v(vf g) { return div_v(g, silu_den(g)); }
#if defined(KT_ISA_AVX512F)
KT_SILU_FOR_WIDTH(512)
inline float silu(float v) { return _mm_cvtss_f32(_mm512_castps512_ps128(silu_v(_mm512_set1_ps(v)))); }
#else
KT_SILU_FOR_WIDTH(256)
inline float silu(float v) { return _mm_cvtss_f32(_mm256_castps256_ps128(silu_v(_mm256_set1_ps(v)))); }
#endif
#undef KT_SILU_FOR_WIDTH

// h[i] = silu(g[i]) * u[i], i < n: kLanes to a vector, the rest one by one (the same values). Kept out
// of line: inlined into the gate/up row loops it moved the AVX2 variant's RAWINT4 decode 4-13% slower
// (in-process A/B; the loops' code changed around it), out of line it measured the same as before.
__attribute__((noinline)) inline void silu_mul(const float* g, const float* u, float* h, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) vf_store(h + i, mul_v(silu_v(vf_load(g + i)), vf_load(u + i)));
  for (; i < n; ++i) h[i] = silu(g[i]) * u[i];
}

// The backward of h = silu(g) * u for one pair's row of n elements, q = dL/dh before the routing weight w:
// dg = w q u sigma(g) (1 + g (1 - sigma(g))), du = w q silu(g); returns dL/dw = sum q silu(g) u. silu(g) is
// the forward's to the bit (the same operations, silu_den), kLanes to a vector; a short last vector runs
// zero-padded through the same operations. dL/dw adds lane by lane, then the lanes in order.
inline float silu_mul_backward(const float* g, const float* u, const float* q, float w, float* dg, float* du,
                               int64_t n) {
  const vf one = set1_v(1.f), wv = set1_v(w);
  vf dw = set1_v(0.f);
  alignas(64) float gb[kLanes], ub[kLanes], qb[kLanes], dgb[kLanes], dub[kLanes];  // the short last vector
  for (int64_t i = 0; i < n; i += kLanes) {
    const int64_t m = n - i < kLanes ? n - i : kLanes;
    const float *gp = g + i, *up = u + i, *qp = q + i;
    float *dgp = dg + i, *dup = du + i;
    if (m < kLanes) {
      for (float* b : {gb, ub, qb}) std::memset(b, 0, sizeof gb);
      std::memcpy(gb, gp, static_cast<size_t>(m) * 4);
      std::memcpy(ub, up, static_cast<size_t>(m) * 4);
      std::memcpy(qb, qp, static_cast<size_t>(m) * 4);
      gp = gb, up = ub, qp = qb, dgp = dgb, dup = dub;
    }
    const vf gv = vf_load(gp), uv = vf_load(up), qv = vf_load(qp);
    const vf den = silu_den(gv), sg = div_v(one, den), act = div_v(gv, den), dh = mul_v(wv, qv);
    dw = add_v(dw, mul_v(mul_v(qv, act), uv));
    vf_store(dgp, mul_v(mul_v(mul_v(dh, uv), sg), fmadd_v(gv, sub_v(one, sg), one)));
    vf_store(dup, mul_v(dh, act));
    if (m < kLanes) {
      std::memcpy(dg + i, dgb, static_cast<size_t>(m) * 4);
      std::memcpy(du + i, dub, static_cast<size_t>(m) * 4);
    }
  }
  alignas(64) float lanes[kLanes];
  vf_store(lanes, dw);
  float sum = 0.f;
  for (float l : lanes) sum += l;
  return sum;
}

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
