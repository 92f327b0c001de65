// The instruction set a CPU variant's code may use, as KT_ISA_* macros, and the intrinsics.
//
// Shipped variants: add_cpu_variant() in kernel/CMakeLists.txt gives the compiler the variant's
// -m flags, which define __AVX512F__ and friends; the real <immintrin.h> intrinsics compile to the
// real instructions (the ISA audit proves each variant uses its marker instruction).
//
// Test-only emulated variants (KT_EMULATE; add_emulated_cpu_variant, KT_EMULATED_VARIANTS=ON): no
// -m flags at all; the variant's features arrive as -DKT_ISA_<FEATURE>=1, SIMDe implements every
// intrinsic in portable code, and amx_model.h models the AMX tiles. The same kernel source and
// algorithm then run on any x86-64 host, so the numerics of every variant are tested everywhere.
// Emulated libraries are never installed into a wheel.
#ifndef KT_ISA_H
#define KT_ISA_H

#include <cmath>
#include <cstdint>

#if defined(KT_EMULATE)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/fma.h>

#include "amx_model.h"

// Three intrinsics SIMDe 0.8.2 lacks, in the same portable terms (element order as documented by
// Intel; the reductions may round differently from the real instruction sequence).
static inline int32_t kt_emu_reduce_add_epi32(__m512i v) {
  int32_t a[16];
  _mm512_storeu_si512(a, v);
  int32_t s = 0;
  for (int32_t x : a) s += x;
  return s;
}
static inline float kt_emu_reduce_add_ps(__m512 v) {
  float a[16];
  _mm512_storeu_ps(a, v);
  for (int w = 8; w > 0; w /= 2)  // pairwise, as the real sequence of shuffles and adds
    for (int i = 0; i < w; ++i) a[i] += a[i + w];
  return a[0];
}
static inline __m512i kt_emu_cvtepu8_epi16(__m256i v) {
  uint8_t b[32];
  uint16_t w[32];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(b), v);
  for (int i = 0; i < 32; ++i) w[i] = b[i];
  return _mm512_loadu_si512(w);
}
#define _mm512_reduce_add_epi32 kt_emu_reduce_add_epi32
#define _mm512_reduce_add_ps kt_emu_reduce_add_ps
#define _mm512_cvtepu8_epi16 kt_emu_cvtepu8_epi16

// Fused multiply-adds rounded once, as the real instructions: SIMDe's portable forms compute a * b + c
// with two roundings, so an emulated path that fused in a vector (amx's LoRA epilogue, lora_b_tile)
// disagreed with the same steps fused one element at a time (std::fma) where real hardware agrees.
#define KT_EMU_FMA(W, N)                                                                \
  static inline simde__m##W kt_emu_fmadd_##W(simde__m##W a, simde__m##W b, simde__m##W c) { \
    float x[N], y[N], z[N];                                                             \
    simde_mm##W##_storeu_ps(x, a);                                                      \
    simde_mm##W##_storeu_ps(y, b);                                                      \
    simde_mm##W##_storeu_ps(z, c);                                                      \
    for (int i = 0; i < N; ++i) z[i] = std::fma(x[i], y[i], z[i]);                      \
    return simde_mm##W##_loadu_ps(z);                                                   \
  }                                                                                     \
  static inline simde__m##W kt_emu_fnmadd_##W(simde__m##W a, simde__m##W b, simde__m##W c) { \
    return kt_emu_fmadd_##W(simde_mm##W##_sub_ps(simde_mm##W##_setzero_ps(), a), b, c); \
  }
KT_EMU_FMA(512, 16)
KT_EMU_FMA(256, 8)
#undef KT_EMU_FMA
#undef _mm512_fmadd_ps
#undef _mm512_fnmadd_ps
#undef _mm256_fmadd_ps
#undef _mm256_fnmadd_ps
#define _mm512_fmadd_ps kt_emu_fmadd_512
#define _mm512_fnmadd_ps kt_emu_fnmadd_512
#define _mm256_fmadd_ps kt_emu_fmadd_256
#define _mm256_fnmadd_ps kt_emu_fnmadd_256
#else
#include <immintrin.h>
#if defined(__AVX2__)
#define KT_ISA_AVX2 1
#endif
#if defined(__FMA__)
#define KT_ISA_FMA 1
#endif
#if defined(__AVX512F__)
#define KT_ISA_AVX512F 1
#endif
#if defined(__AVX512BW__)
#define KT_ISA_AVX512BW 1
#endif
#if defined(__AVX512VNNI__)
#define KT_ISA_AVX512_VNNI 1
#endif
#if defined(__AVX512VBMI__)
#define KT_ISA_AVX512_VBMI 1
#endif
#if defined(__AVX512BF16__)
#define KT_ISA_AVX512_BF16 1
#endif
#if defined(__AMX_TILE__)
#define KT_ISA_AMX_TILE 1
#endif
#if defined(__AMX_INT8__)
#define KT_ISA_AMX_INT8 1
#endif
#if defined(__AMX_BF16__)
#define KT_ISA_AMX_BF16 1
#endif
#endif

#endif  // KT_ISA_H
