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

#include <immintrin.h>

#include <cstdint>

#if !defined(__AVX2__) || !defined(__FMA__)
#error "CPU variants need at least AVX2 and FMA; check add_cpu_variant() in kernel/CMakeLists.txt"
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define KT_ZMM 1
#else
#define KT_ZMM 0
#endif
#if defined(__AVX512BF16__)
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
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, aw, sx);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(aw, sx), _mm512_set1_epi16(1)));
#endif
}

// 32 packed bytes (two 32-element blocks) -> 64 signed int8 in natural order.
static inline __m512i unpack64_i4(const uint8_t* p) {
  const __m256i ab = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  __m512i t = _mm512_inserti64x4(_mm512_castsi256_si512(ab), _mm256_srli_epi16(ab, 4), 1);
  t = _mm512_shuffle_i64x2(t, t, _MM_SHUFFLE(3, 1, 2, 0));  // [A, A>>4, B, B>>4]
#if defined(__AVX512VBMI__)
  // vpermb reads index bits 0..5 only: a 64-entry table repeating every 16
  // entries masks the nibble and sign-extends it in one instruction.
  const __m512i lut = _mm512_set_epi8(-1, -2, -3, -4, -5, -6, -7, -8, 7, 6, 5, 4, 3, 2, 1, 0,  //
                                      -1, -2, -3, -4, -5, -6, -7, -8, 7, 6, 5, 4, 3, 2, 1, 0,  //
                                      -1, -2, -3, -4, -5, -6, -7, -8, 7, 6, 5, 4, 3, 2, 1, 0,  //
                                      -1, -2, -3, -4, -5, -6, -7, -8, 7, 6, 5, 4, 3, 2, 1, 0);
  return _mm512_permutexvar_epi8(t, lut);
#else
  t = _mm512_and_si512(t, _mm512_set1_epi8(0x0F));
  const __m512i eight = _mm512_set1_epi8(8);
  return _mm512_sub_epi8(_mm512_xor_si512(t, eight), eight);
#endif
}

static inline int32_t dot_i8(const int8_t* w, const int8_t* x, int64_t n) {
  __m512i acc = _mm512_setzero_si512();
  for (int64_t i = 0; i < n; i += kStep)
    acc = dot_step(acc, _mm512_loadu_si512(w + i), _mm512_loadu_si512(x + i));
  return _mm512_reduce_add_epi32(acc);
}

// sum over groups g of s[g] * (int dot of group g); x is int8.
static inline float dot_i4(const uint8_t* w, const float* s, const int8_t* x, int64_t n, int g) {
  __m512 facc = _mm512_setzero_ps();
  if (g == 32) {
    for (int64_t i = 0; i < n; i += 64) {
      const __m512i p = dot_step(_mm512_setzero_si512(), unpack64_i4(w + i / 2), _mm512_loadu_si512(x + i));
      const __m512 sc = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(s[i / 32]), _mm512_set1_ps(s[i / 32 + 1]));
      facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, facc);
    }
  } else {
    for (int64_t b = 0; b < n; b += g) {
      __m512i iacc = _mm512_setzero_si512();
      for (int64_t i = b; i < b + g; i += 64)
        iacc = dot_step(iacc, unpack64_i4(w + i / 2), _mm512_loadu_si512(x + i));
      facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc), _mm512_set1_ps(s[b / g]), facc);
    }
  }
  return _mm512_reduce_add_ps(facc);
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

// 16 packed bytes (one 32-element block) -> 32 signed int8 in natural order.
static inline __m256i unpack32_i4(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1);
  v = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
  const __m256i eight = _mm256_set1_epi8(8);
  return _mm256_sub_epi8(_mm256_xor_si256(v, eight), eight);
}

static inline int32_t dot_i8(const int8_t* w, const int8_t* x, int64_t n) {
  __m256i acc = _mm256_setzero_si256();
  for (int64_t i = 0; i < n; i += kStep)
    acc = dot_step(acc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i)),
                   _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
  return hsum_epi32(acc);
}

static inline float dot_i4(const uint8_t* w, const float* s, const int8_t* x, int64_t n, int g) {
  __m256 facc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n; b += g) {
    __m256i iacc = _mm256_setzero_si256();
    for (int64_t i = b; i < b + g; i += 32)
      iacc = dot_step(iacc, unpack32_i4(w + i / 2), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
    facc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc), _mm256_set1_ps(s[b / g]), facc);
  }
  return hsum_ps(facc);
}

#endif  // KT_ZMM

#if KT_BF16_DOT
// RAWINT4 row x bf16 activations. Each nibble u (two's complement) becomes
// u' = u ^ 8 = value + 8 in [0, 15]; the bf16 bit pattern 0x4180 | u' << 3 is
// exactly 16 + u', so the dot product over a group is
//   sum (value + 24) * x  -  24 * sum x,
// and `gsum` carries sum x per group (computed from the same bf16 values).
static inline float dot_i4_bf16(const uint8_t* w, const float* s, const uint16_t* xb, const float* gsum,
                                int64_t n, int g) {
  __m512 facc = _mm512_setzero_ps();
  float corr = 0.f;
  const __m256i lo = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
  const __m512i magic = _mm512_set1_epi16(0x4180);
  for (int64_t b = 0; b < n; b += g) {
    __m512 gacc = _mm512_setzero_ps();
    for (int64_t i = b; i < b + g; i += 32) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i / 2));
      __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1);
      v = _mm256_xor_si256(_mm256_and_si256(v, lo), eight);
      const __m512i wb = _mm512_or_si512(_mm512_slli_epi16(_mm512_cvtepu8_epi16(v), 3), magic);
      const __m512i xv = _mm512_loadu_si512(xb + i);
      gacc = _mm512_dpbf16_ps(gacc, (__m512bh)wb, (__m512bh)xv);
    }
    facc = _mm512_fmadd_ps(gacc, _mm512_set1_ps(s[b / g]), facc);
    corr += s[b / g] * gsum[b / g];
  }
  return _mm512_reduce_add_ps(facc) - 24.f * corr;
}
#endif

}  // namespace kt

#endif  // KT_DOT_H
