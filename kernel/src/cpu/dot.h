// Per-ISA inner kernels. This header is compiled once per CPU variant with that
// variant's -m flags; the preprocessor picks the code path the flags allow.
//   avx2         FMA on ymm, vpmaddubsw integer dot products
//   avx512_base  the same on zmm (AVX512BW)
//   avx512_vnni  vpdpbusd replaces vpmaddubsw + vpmaddwd + vpaddd
//   avx512_vbmi  vpermb unpacks RAWINT4 nibbles to signed int8 in one step
//   avx512_bf16  RAWINT4 x bf16 activations through vdpbf16ps
//   amx          AMX tiles for INT8 prefill (amx.cpp), otherwise as avx512_bf16
#ifndef KT_DOT_H
#define KT_DOT_H

#include <cstdint>
#include <cstring>

#include "isa.h"

#if !defined(KT_ISA_AVX2) || !defined(KT_ISA_FMA)
#error "CPU variants need at least AVX2 and FMA; check add_cpu_variant() in kernel/CMakeLists.txt"
#endif

#if defined(KT_ISA_AVX512F) && defined(KT_ISA_AVX512BW)
#define KT_ZMM 1
#else
#define KT_ZMM 0
#endif
#if defined(KT_ISA_AVX512_BF16)
#define KT_BF16_DOT 1
#else
#define KT_BF16_DOT 0
#endif

namespace kt {

#if KT_ZMM
constexpr int64_t kStep = 64;  // int8 elements per vector step

static inline __m512i dot_step(__m512i acc, __m512i w, __m512i x) {
  // Signed x signed through the unsigned x signed instructions: |w| * (x * sign(w)).
  const __m512i aw = _mm512_abs_epi8(w);
  const __m512i sx = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
#if defined(KT_ISA_AVX512_VNNI)
  return _mm512_dpbusd_epi32(acc, aw, sx);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(aw, sx), _mm512_set1_epi16(1)));
#endif
}

// RAWINT4 dot products use offset nibbles u = n ^ 8 = value + 8 in [0, 15]:
// unsigned, so they feed vpmaddubsw/vpdpbusd directly, and
//   sum value * x = sum u * x - 8 * sum x,
// with sum x per group (`xg`) computed once per activation row.

// 32 packed bytes (two 32-element blocks) -> 64 offset nibbles in natural order.
static inline __m512i unpack64_u4(const uint8_t* p) {
  const __m256i ab = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  __m512i t = _mm512_inserti64x4(_mm512_castsi256_si512(ab), _mm256_srli_epi16(ab, 4), 1);
  t = _mm512_shuffle_i64x2(t, t, _MM_SHUFFLE(3, 1, 2, 0));  // [A, A>>4, B, B>>4]
#if defined(KT_ISA_AVX512_VBMI)
  // vpermb reads index bits 0..5 only: a 64-entry table repeating every 16
  // entries masks the nibble and offsets it (n ^ 8) in one instruction.
  const __m512i lut = _mm512_set_epi8(7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8,  //
                                      7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8,  //
                                      7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8,  //
                                      7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8);
  return _mm512_permutexvar_epi8(t, lut);
#else
  return _mm512_xor_si512(_mm512_and_si512(t, _mm512_set1_epi8(0x0F)), _mm512_set1_epi8(8));
#endif
}

// unsigned (u) x signed (x) byte dot products into 16 int32 lanes.
static inline __m512i dot_step_u(__m512i acc, __m512i u, __m512i x) {
#if defined(KT_ISA_AVX512_VNNI)
  return _mm512_dpbusd_epi32(acc, u, x);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, x), _mm512_set1_epi16(1)));
#endif
}

static inline int32_t dot_i8(const int8_t* w, const int8_t* x, int64_t n) {
  __m512i acc = _mm512_setzero_si512();
  for (int64_t i = 0; i < n; i += kStep)
    acc = dot_step(acc, _mm512_loadu_si512(w + i), _mm512_loadu_si512(x + i));
  return _mm512_reduce_add_epi32(acc);
}

// The ZMM paths read the activations in natural order.
static inline void i4_activation_order(int8_t*, int64_t) {}

// sum over groups g of s[g] * (int dot of group g); x is int8, xg its group sums.
static inline float dot_i4(const uint8_t* w, const float* s, const int8_t* x, const int32_t* xg, int64_t n, int g) {
  __m512 facc = _mm512_setzero_ps();
  if (g == 32) {
    for (int64_t i = 0; i < n; i += 64) {
      const __m512i p = dot_step_u(_mm512_setzero_si512(), unpack64_u4(w + (i >> 1)), _mm512_loadu_si512(x + i));
      const __m512 sc = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(s[i >> 5]), _mm512_set1_ps(s[(i >> 5) + 1]));
      facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, facc);
    }
  } else {
    for (int64_t b = 0, gi = 0; b < n; b += g, ++gi) {  // no division in the loop: idiv costs ~40 cycles
      __m512i iacc = _mm512_setzero_si512();
      for (int64_t i = b; i < b + g; i += 64)
        iacc = dot_step_u(iacc, unpack64_u4(w + (i >> 1)), _mm512_loadu_si512(x + i));
      facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc), _mm512_set1_ps(s[gi]), facc);
    }
  }
  float corr = 0.f;
  for (int64_t b = 0; b < n / g; ++b) corr += s[b] * static_cast<float>(xg[b]);
  return _mm512_reduce_add_ps(facc) - 8.f * corr;
}

#else  // AVX2

constexpr int64_t kStep = 32;

static inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

static inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline __m256i dot_step(__m256i acc, __m256i w, __m256i x) {
  const __m256i aw = _mm256_sign_epi8(w, w);
  const __m256i sx = _mm256_sign_epi8(x, w);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1)));
}

static inline int32_t dot_i8(const int8_t* w, const int8_t* x, int64_t n) {
  __m256i acc = _mm256_setzero_si256();
  for (int64_t i = 0; i < n; i += kStep) {
    _mm_prefetch(reinterpret_cast<const char*>(w + i + 1024), _MM_HINT_T0);
    acc = dot_step(acc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i)),
                   _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
  }
  return hsum_epi32(acc);
}

// RAWINT4 x int8 activations. 32 packed bytes (two 32-element blocks) are loaded as one register;
// their low nibbles are [block 0 elements 0-15 | block 1 elements 0-15] and their high nibbles
// [block 0 elements 16-31 | block 1 elements 16-31]. The activations are stored in that order once
// per row (i4_activation_order), so unpacking is two masks and a shift, with no lane crossing.
// Offset nibbles u = n ^ 8 = value + 8 are unsigned for vpmaddubsw; sum value * x = sum u * x - 8 * sum x.
static inline void i4_activation_order(int8_t* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 64) {
    alignas(32) int8_t t[32];
    std::memcpy(t, x + i + 16, 32);           // block 0 elements 16-31, block 1 elements 0-15
    std::memcpy(x + i + 16, t + 16, 16);      // block 1 elements 0-15
    std::memcpy(x + i + 32, t, 16);           // block 0 elements 16-31
  }
}

// R weight rows against M activation rows: out[r * M + m] = the dot of row r with activation m. The
// rows are unpacked once per step for all M activations (gate and up rows of one expert, or
// neighbouring down rows, against the pairs routed to that expert). Every (r, m) accumulates in the
// same order whatever R and M are, so a pair's result does not depend on how many pairs its expert
// has in the batch. Every loop over R and M is unrolled (KT_UNROLL) so that the accumulators live in
// registers: rolled, GCC 12 kept them on the stack and each step waited on a store and a reload
// (groups of 64: 11 cycles per 64 weight bytes on a Zen 3 core, 7 unrolled).
#define KT_UNROLL _Pragma("GCC unroll 8")
constexpr int64_t kPrefetch = 4096;  // bytes ahead in each weight row stream
template <int R, int M>
static inline void dot_i4_block(const uint8_t* const* w, const float* const* s, const int8_t* const* x,
                                const int32_t* const* xg, int64_t n, int g, float* out) {
  const __m256i mask = _mm256_set1_epi8(0x0F), flip = _mm256_set1_epi8(-120), ones = _mm256_set1_epi16(1);
  const __m256i lanes = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  // g is 32, 64 or 128. (Not __builtin_ctz: GCC emits it as rep bsf, which decodes as BMI1 tzcnt.)
  const int gshift = g == 32 ? 5 : g == 64 ? 6 : 7;
  __m256 facc[R][M];
  KT_UNROLL
  for (int r = 0; r < R; ++r) {
    KT_UNROLL
    for (int m = 0; m < M; ++m) facc[r][m] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < n; i += 64) {
    KT_UNROLL
    for (int r = 0; r < R; ++r) {
      const uint8_t* wr = w[r] + (i >> 1);
      _mm_prefetch(reinterpret_cast<const char*>(wr + kPrefetch), _MM_HINT_T0);
      const __m256i v = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr)), flip);
      const __m256i lo = _mm256_and_si256(v, mask), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
      __m256 sc;  // lanes 0-3 hold block 0 (elements i..i+31), lanes 4-7 block 1
      if (g == 32) {
        const __m128d pair = _mm_load_sd(reinterpret_cast<const double*>(s[r] + (i >> 5)));
        sc = _mm256_permutevar8x32_ps(_mm256_castpd_ps(_mm256_castpd128_pd256(pair)), lanes);
      } else {
        sc = _mm256_set1_ps(s[r][i >> gshift]);
      }
      KT_UNROLL
      for (int m = 0; m < M; ++m) {
        // int16 partial sums stay exact: 2 * 15 * 127 * 2 < 32767.
        const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[m] + i));
        const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[m] + i + 32));
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xa), _mm256_maddubs_epi16(hi, xb));
        facc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), sc, facc[r][m]);
      }
    }
  }
  // - 8 * sum_g s[g] * xg[g], eight groups at a time
  const int64_t ng = n >> gshift;
  KT_UNROLL
  for (int r = 0; r < R; ++r) {
    KT_UNROLL
    for (int m = 0; m < M; ++m) {
      __m256 corr = _mm256_setzero_ps();
      int64_t k = 0;
      for (; k + 8 <= ng; k += 8)
        corr = _mm256_fmadd_ps(_mm256_loadu_ps(s[r] + k),
                               _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg[m] + k))), corr);
      float tail = 0.f;
      for (; k < ng; ++k) tail += s[r][k] * static_cast<float>(xg[m][k]);
      out[r * M + m] = hsum_ps(facc[r][m]) - 8.f * (hsum_ps(corr) + tail);
    }
  }
}

static inline float dot_i4(const uint8_t* w, const float* s, const int8_t* x, const int32_t* xg, int64_t n, int g) {
  float out;
  dot_i4_block<1, 1>(&w, &s, &x, &xg, n, g, &out);
  return out;
}
#define KT_I4_ROWS 1

#endif  // KT_ZMM

#if KT_BF16_DOT
// RAWINT4 row x bf16 activations. Each nibble u (two's complement) becomes
// u' = u ^ 8 = value + 8 in [0, 15]; the bf16 bit pattern 0x4180 | u' << 3 is
// exactly 16 + u', so the dot product over a group is
//   sum (value + 24) * x  -  24 * sum x,
// and `gsum` carries sum x per group (computed from the same bf16 values).
// The same 512 bits seen as 32 bf16 values (a register reinterpretation: no instruction).
static inline __m512bh as_bh(__m512i v) {
#if defined(KT_EMULATE)
  __m512bh r;
  std::memcpy(&r, &v, sizeof r);
  return r;
#else
  return (__m512bh)v;
#endif
}

static inline float dot_i4_bf16(const uint8_t* w, const float* s, const uint16_t* xb, const float* gsum,
                                int64_t n, int g) {
  __m512 facc = _mm512_setzero_ps();
  float corr = 0.f;
  const __m256i lo = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
  const __m512i magic = _mm512_set1_epi16(0x4180);
  for (int64_t b = 0, gi = 0; b < n; b += g, ++gi) {  // no division in the loop: idiv costs ~40 cycles
    __m512 gacc = _mm512_setzero_ps();
    for (int64_t i = b; i < b + g; i += 32) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + (i >> 1)));
      __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1);
      v = _mm256_xor_si256(_mm256_and_si256(v, lo), eight);
      const __m512i wb = _mm512_or_si512(_mm512_slli_epi16(_mm512_cvtepu8_epi16(v), 3), magic);
      const __m512i xv = _mm512_loadu_si512(xb + i);
      gacc = _mm512_dpbf16_ps(gacc, as_bh(wb), as_bh(xv));
    }
    facc = _mm512_fmadd_ps(gacc, _mm512_set1_ps(s[gi]), facc);
    corr += s[gi] * gsum[gi];
  }
  return _mm512_reduce_add_ps(facc) - 24.f * corr;
}
#endif

}  // namespace kt

#endif  // KT_DOT_H
