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
