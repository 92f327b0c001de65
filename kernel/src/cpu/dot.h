// Per-ISA inner kernels. This header is compiled once per CPU variant with that
// variant's -m flags; the preprocessor picks the code path the flags allow.
//   avx2         FMA on ymm, vpmaddubsw integer dot products
//   avx512_base  the same on zmm (AVX512BW)
//   avx512_vnni  vpdpbusd replaces vpmaddubsw + vpmaddwd + vpaddd
//   avx512_vbmi  vpermb unpacks RAWINT4 nibbles to offset int8 in one step
//   avx512_bf16  as avx512_vbmi in the forward; vdpbf16ps in the backward (moe_grad.cpp)
//   amx          AMX tiles for INT8 prefill (amx.cpp), otherwise as avx512_bf16
// RAWINT4 runs on int8 activations everywhere (quantized per token, as INT8), R weight rows x M
// pairs per pass over the weights (dot_i4_block).
#ifndef KT_DOT_H
#define KT_DOT_H

#include <cpuid.h>

#include <cmath>
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

// Loops over R weight rows and M activation rows are unrolled so that the accumulators live in
// registers: rolled, GCC 12 kept them on the stack and each step waited on a store and a reload
// (RAWINT4 groups of 64: 11 cycles per 64 weight bytes on a Zen 3 core, 7 unrolled).
#define KT_UNROLL _Pragma("GCC unroll 8")
constexpr int64_t kPrefetch = 2048;      // bytes ahead in each RAWINT4 weight row stream into L1 (AVX2; ZMM on AMD),
constexpr int64_t kPrefetchFar = 16384;  // and into L2 on AVX2 (its scales as many steps ahead)
constexpr int64_t kPrefetchL2 = 8192;  // bytes ahead in each ZMM RAWINT4 weight row stream (into L2)
constexpr int64_t kPrefetchI8 = 1024;  // bytes ahead in each INT8 weight row stream

// Whether this is an AMD core (CPUID's vendor string), read once per translation unit when the
// variant loads: INT8 blocks (i8_prefetch) and the ZMM RAWINT4 rows (dot_i4_block) prefetch by vendor.
static const bool kAmdCore = [] {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  return b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "Auth" "enti" "cAMD"
}();
constexpr int64_t kPrefetchI8Far = 8192;  // bytes ahead in each INT8 weight row stream on AMD (into L2)

// The software prefetch of an INT8 block of R weight rows x M pairs, for a row's step at p. Either way
// the integer sums, and so the outputs, are the same.
//   Intel cores: into L1 kPrefetchI8 ahead, every block.
//   AMD cores: into L2 kPrefetchI8Far ahead, in blocks of two or more products a step; none in one-pair
//   blocks, nor in the VNNI decode form (Vnni2: one row against one or two pairs, two chains), where
//   the hardware prefetcher alone streamed the row fastest.
// On a Zen 4 core the hardware prefetcher alone keeps ahead of a row read at memory speed, not of one
// that also feeds two or more pairs' products: DRAM-resident experts of exactly M pairs each, one
// thread, took (against into L1 1 KiB ahead, or none in decode-shaped blocks) 0.80-0.82 of the time at
// M = 2, 3 and 4 without VNNI (avx512_base), 0.53 at 4 with it (avx512_vnni).
template <int R, int M, bool Vnni2 = false>
static inline void i8_prefetch(const int8_t* p) {
  if (kAmdCore) {
    if constexpr (R * M >= 2 && !Vnni2) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchI8Far), _MM_HINT_T1);
  } else {
    _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchI8), _MM_HINT_T0);
  }
}

// 64 RAWINT4-ordered activations (two 32-element blocks) as [block 0 elements 0-15 | block 1
// elements 0-15 | block 0 elements 16-31 | block 1 elements 16-31]: the order of the low nibbles, then
// the high nibbles, of their 32 packed weight bytes.
static inline void i4_order64(int8_t* x) {
  alignas(32) int8_t t[32];
  std::memcpy(t, x + 16, 32);       // block 0 elements 16-31, block 1 elements 0-15
  std::memcpy(x + 16, t + 16, 16);  // block 1 elements 0-15
  std::memcpy(x + 32, t, 16);       // block 0 elements 16-31
}

// max |v[i]| over n floats, NaN ignored (as std::fmax, which GCC calls in libm, one call per element:
// 2% of a prefill forward's time went there). The maximum is exact: the same in any order.
static inline float absmax_f32(const float* v, int64_t n) {
  int64_t i = 0;
  float amax = 0.f;
#if KT_ZMM
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) acc = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(v + i)), acc);  // NaN: acc kept
  alignas(64) float lanes[16];  // (not _mm512_reduce_max_ps: GCC 12 warns inside it)
  _mm512_store_ps(lanes, acc);
#else
  const __m256 mag = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(v + i), mag), acc);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
#endif
  for (float l : lanes) amax = l > amax ? l : amax;
  for (; i < n; ++i) amax = std::fabs(v[i]) > amax ? std::fabs(v[i]) : amax;
  return amax;
}

// Two floats at p into lanes 0-1, zero above. Through __m128i_u, which may alias anything: the
// same vmovq as _mm_load_sd on a float array cast to double*, without reading floats through a
// double lvalue (undefined behaviour under strict aliasing: GCC may then drop stores to the floats
// that it cannot see read).
static inline __m128 load2_ps(const float* p) {
  return _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

#if KT_ZMM
constexpr int64_t kStep = 64;  // int8 elements per vector step

// RAWINT4 x int8 activations, R weight rows x M activation rows per pass (dot_i4_block). A packed
// 32-element block is 16 bytes, byte j holding elements j (low nibble) and j + 16 (high nibble).
// Offset nibbles u = n ^ 8 = value + 8 are unsigned for vpdpbusd/vpmaddubsw;
//   sum value * x = sum u * x - 8 * sum x.
// The -8 * sum x of every int32 lane of every step is computed once per activation row (the row's
// side data, i4_prepare) and is where each step's integer sums start: every lane then holds its exact
// sum value * x, and a row's dot needs nothing after its steps but one reduction.
//
// A step takes 128 elements: 64 packed bytes (four blocks) in one load; their low nibbles are
// [block 0 elements 0-15 | block 1 elements 0-15 | block 2 ... | block 3 ...] and their high nibbles
// the elements 16-31 of the same blocks, so every int32 lane of both products belongs to one block
// (lanes 4b..4b+3: block b) and the two products add before one conversion and one scaling per
// step. The activations are stored in that order once per row (i4_activation_order). A row whose
// length is an odd multiple of 64 ends with a 64-element step: 32 packed bytes and the same bytes
// shifted right by 4 in one register, [block 0 elements 0-15 | block 1 elements 0-15 | block 0
// elements 16-31 | block 1 elements 16-31].
static inline __m512i nibbles_u4(__m512i t) {
#if defined(KT_ISA_AVX512_VBMI)
  // vpermb reads index bits 0..5 only: a 64-entry table repeating every 16 entries masks the
  // nibble and offsets it (n ^ 8) in one instruction.
  const __m512i lut = _mm512_set_epi8(7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8,  //
                                      7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8,  //
                                      7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8,  //
                                      7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8);
  return _mm512_permutexvar_epi8(t, lut);
#else
  // (t & 0x0F) ^ 8 in one vpternlogd (0x6A: (A & B) ^ C), not an and and an xor.
  return _mm512_ternarylogic_epi32(t, _mm512_set1_epi8(0x0F), _mm512_set1_epi8(8), 0x6A);
#endif
}
// The 64-element tail step's register.
static inline __m512i unpack64_u4(const uint8_t* p) {
  const __m256i ab = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return nibbles_u4(_mm512_inserti64x4(_mm512_castsi256_si512(ab), _mm256_srli_epi16(ab, 4), 1));
}

// unsigned (u) x signed (x) byte dot products into 16 int32 lanes.
static inline __m512i dot_step_u(__m512i acc, __m512i u, __m512i x) {
#if defined(KT_ISA_AVX512_VNNI)
  return _mm512_dpbusd_epi32(acc, u, x);
#else
  // int16 partial sums stay exact: 2 * 15 * 128 < 32767.
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, x), _mm512_set1_epi16(1)));
#endif
}
// Both nibbles' products of a RAWINT4 step (u0 x x0 + u1 x x1) into acc. Without VNNI they add in int16
// first (four products of at most 15 * 128: exact), so the step takes one vpmaddwd and one vpaddd,
// not two of each.
static inline __m512i dot_step_u2(__m512i acc, __m512i u0, __m512i x0, __m512i u1, __m512i x1) {
#if defined(KT_ISA_AVX512_VNNI)
  return dot_step_u(dot_step_u(acc, u0, x0), u1, x1);
#else
  const __m512i p = _mm512_add_epi16(_mm512_maddubs_epi16(u0, x0), _mm512_maddubs_epi16(u1, x1));
  return _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_set1_epi16(1)));
#endif
}


// The lane sums of M int32 accumulators into out[0, M). For four, one transposing
// reduction serves all of them (about 13 instructions instead of four reductions of 9): a down row of
// 768 bytes is only 12 steps, so at prefill the reductions were a large share of the down pass.
// Integer sums: the same values in any order.
template <int M>
static inline void hsum_epi32_m(const __m512i* acc, int32_t* out) {
  if constexpr (M == 4) {
    // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3], then [sum a, sum b, sum c, sum d].
    const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[0], acc[1]), _mm512_unpackhi_epi32(acc[0], acc[1]));
    const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[2], acc[3]), _mm512_unpackhi_epi32(acc[2], acc[3]));
    const __m512i q = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(q), _mm512_extracti64x4_epi64(q, 1));
    const __m128i v = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), v);
  } else {
    KT_UNROLL
    for (int m = 0; m < M; ++m) out[m] = _mm512_reduce_add_epi32(acc[m]);
  }
}

// INT8: R weight rows x M activation rows per pass, out[r * M + m] = the exact int32 dot (integer
// sums: the result does not depend on R, M or the order). xsum[m]: the sum of activation row m (the
// VNNI form needs it; prepared once per row).
// VNNI, decode-shaped blocks (fewer than four (row, activation) pairs: one weight row against one or
// two pairs): the row streams from memory once, in two accumulator chains that keep vpdpbusd's
// latency off the stream, prefetched in software except on AMD (i8_prefetch). In-process A/B
// against the prefetching single-chain loop the blocked prefill form keeps, 1-8 tokens, one and two
// threads: on a Zen 4 core, without the prefetch, 7-26% less time; on an AMX Xeon without it 16-34%
// more, with it 0.97-1.01. The prefill form prefetches everywhere: into L1 on Intel (on Zen 4 that
// was 6-16% faster than none), into L2 8 KiB ahead on AMD (Zen 4, avx512_vnni, against into L1: 0.68-0.80
// of the time at 16 and 64 tokens, 0.90 at 256, one and two threads). The non-VNNI form keeps one chain;
// on AMD its one-pair blocks go without the prefetch, the others prefetch into L2 (i8_prefetch).
template <int R, int M>
static inline void dot_i8_block(const int8_t* const* w, const int8_t* const* x, const int32_t* xsum, int64_t n,
                                int32_t* out) {
  __m512i acc[R][M];
  KT_UNROLL
  for (int r = 0; r < R; ++r) {
    KT_UNROLL
    for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_si512();
  }
#if defined(KT_ISA_AVX512_VNNI)
  // vpdpbusd takes unsigned x signed with no int16 step to saturate, so the weights go in as
  // w + 128 (w ^ 0x80, once per row step for all M activations) and the activations as they are:
  //   sum x * w = sum (w + 128) * x - 128 * sum x,  sum x once per activation row (xsum).
  // One vpdpbusd per (row, activation) and nothing per weight row beyond its flip.
  const __m512i flip = _mm512_set1_epi8(-128);
  if constexpr (R * M < 4) {  // decode-shaped (above)
    __m512i acc2[R][M];
    KT_UNROLL
    for (int r = 0; r < R; ++r) {
      KT_UNROLL
      for (int m = 0; m < M; ++m) acc2[r][m] = _mm512_setzero_si512();
    }
    int64_t i = 0;
    for (; i + 2 * kStep <= n; i += 2 * kStep) {
      __m512i x0[M], x1[M];
      KT_UNROLL
      for (int m = 0; m < M; ++m) {
        x0[m] = _mm512_loadu_si512(x[m] + i);
        x1[m] = _mm512_loadu_si512(x[m] + i + kStep);
      }
      KT_UNROLL
      for (int r = 0; r < R; ++r) {
        i8_prefetch<R, M, true>(w[r] + i);
        i8_prefetch<R, M, true>(w[r] + i + kStep);
        const __m512i w0 = _mm512_xor_si512(_mm512_loadu_si512(w[r] + i), flip);
        const __m512i w1 = _mm512_xor_si512(_mm512_loadu_si512(w[r] + i + kStep), flip);
        KT_UNROLL
        for (int m = 0; m < M; ++m) {
          acc[r][m] = _mm512_dpbusd_epi32(acc[r][m], w0, x0[m]);
          acc2[r][m] = _mm512_dpbusd_epi32(acc2[r][m], w1, x1[m]);
        }
      }
    }
    for (; i < n; i += kStep) {
      KT_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m512i wu = _mm512_xor_si512(_mm512_loadu_si512(w[r] + i), flip);
        KT_UNROLL
        for (int m = 0; m < M; ++m) acc[r][m] = _mm512_dpbusd_epi32(acc[r][m], wu, _mm512_loadu_si512(x[m] + i));
      }
    }
    KT_UNROLL
    for (int r = 0; r < R; ++r) {
      KT_UNROLL
      for (int m = 0; m < M; ++m) acc[r][m] = _mm512_add_epi32(acc[r][m], acc2[r][m]);
    }
  } else {
    for (int64_t i = 0; i < n; i += kStep) {
      __m512i xv[M];
      KT_UNROLL
      for (int m = 0; m < M; ++m) xv[m] = _mm512_loadu_si512(x[m] + i);
      KT_UNROLL
      for (int r = 0; r < R; ++r) {
        i8_prefetch<R, M>(w[r] + i);
        const __m512i wu = _mm512_xor_si512(_mm512_loadu_si512(w[r] + i), flip);
        KT_UNROLL
        for (int m = 0; m < M; ++m) acc[r][m] = _mm512_dpbusd_epi32(acc[r][m], wu, xv[m]);
      }
    }
  }
  KT_UNROLL
  for (int r = 0; r < R; ++r) {
    hsum_epi32_m<M>(acc[r], out + r * M);
    KT_UNROLL
    for (int m = 0; m < M; ++m) out[r * M + m] -= 128 * xsum[m];
  }
#else
  (void)xsum;
  // vpmaddubsw would saturate on w + 128 (two products of up to 255 * 128 in int16): |w| (once per row
  // step) times x with w's sign.
  for (int64_t i = 0; i < n; i += kStep) {
    KT_UNROLL
    for (int r = 0; r < R; ++r) {
      i8_prefetch<R, M>(w[r] + i);
      const __m512i wv = _mm512_loadu_si512(w[r] + i);
      const __m512i aw = _mm512_abs_epi8(wv);
      const __mmask64 neg = _mm512_movepi8_mask(wv);
      KT_UNROLL
      for (int m = 0; m < M; ++m) {
        const __m512i xv = _mm512_loadu_si512(x[m] + i);
        const __m512i sx = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
        acc[r][m] = dot_step_u(acc[r][m], aw, sx);
      }
    }
  }
  KT_UNROLL
  for (int r = 0; r < R; ++r) hsum_epi32_m<M>(acc[r], out + r * M);
#endif
}

// int32 side data per activation row of n (i4_prepare): 16 lanes per step.
static inline int64_t i4_side_len(int64_t n, int /*g*/) { return (n + 127) / 128 * 16; }

// Puts an int8 activation row in the order the steps read (per 128 elements [blocks 0-3 elements
// 0-15 | blocks 0-3 elements 16-31], a final 64 as [block 0 elements 0-15 | block 1 elements 0-15 |
// block 0 16-31 | block 1 16-31]) and writes its side data: for the step at element i, lane l starts
// at -8 * (the 4 activations its low-nibble product covers + the 4 its high-nibble product covers).
static inline void i4_prepare(int8_t* x, int64_t n, int /*g*/, int32_t* side) {
  int64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    alignas(64) int8_t t[128];
    for (int b = 0; b < 4; ++b) {
      std::memcpy(t + 16 * b, x + i + 32 * b, 16);
      std::memcpy(t + 64 + 16 * b, x + i + 32 * b + 16, 16);
    }
    std::memcpy(x + i, t, 128);
    for (int l = 0; l < 16; ++l) {
      int32_t sum = 0;
      for (int j = 0; j < 4; ++j) sum += t[4 * l + j] + t[64 + 4 * l + j];
      side[(i >> 3) + l] = -8 * sum;
    }
  }
  if (i < n) {
    i4_order64(x + i);
    for (int l = 0; l < 16; ++l) {
      int32_t sum = 0;
      for (int j = 0; j < 4; ++j) sum += x[i + 4 * l + j];
      side[(i >> 3) + l] = -8 * sum;
    }
  }
}

// R weight rows against M activation rows, as the AVX2 dot_i4_block below (same contract). Each
// weight row stream is prefetched into L2 8 KiB ahead (kPrefetchL2): in-process A/B against into L1
// 4 KiB ahead, 1-8 tokens, one and two threads, 0.86-0.98 of the time on a Zen 4 core (avx512_bf16);
// on an AMX Xeon (amx, the layer in L3) 0.89-1.03, where keeping the L1 prefetch for Intel measured
// up to 13% slower at one thread. In decode-shaped blocks (one or two pairs) the scales are
// prefetched as far ahead (the same steps): a decode profile had the scale loads waiting on memory;
// on the Zen 4 core 0.89 of the time at one thread, 0.89-0.97 at two. Blocks of more pairs, which
// re-read their rows from cache, do without: on the AMX Xeon, four threads at 64 and 256 tokens took
// 1.07-1.31x the time of the build before with it in every block, 1.04-1.10x without (two runs; that
// host moves by up to 10%). (The compute-bound AVX2 loop measured 2-7% slower with it.) On AMD cores
// the row streams are also prefetched into L1 2 KiB ahead (kPrefetch), beside the L2 prefetch (Zen 4,
// in-process A/B, 1-8 tokens, one and two threads: avx512_bf16 0.93-1.01 of the time, avx512_vnni
// 0.93-0.98); Intel keeps the L2 prefetch alone (above).
template <int R, int M, int G>
static inline void dot_i4_block(const uint8_t* const* w, const float* const* s, const int8_t* const* x,
                                const int32_t* const* side, int64_t n, float* out) {
  static_assert(G == 32 || G == 64 || G == 128, "RAWINT4 groups are 32, 64 or 128 elements");
  constexpr int g = G;
  constexpr int gshift = G == 32 ? 5 : G == 64 ? 6 : 7;
  // Lane l of a 128-element step holds block l / 4: scale s[l / 4], s[l / 8] or s[0] of the step's.
  const __m512i lanes = g == 32   ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                        : g == 64 ? _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
                                  : _mm512_setzero_si512();
  __m512 facc[R][M];
  KT_UNROLL
  for (int r = 0; r < R; ++r) {
    KT_UNROLL
    for (int m = 0; m < M; ++m) facc[r][m] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    KT_UNROLL
    for (int r = 0; r < R; ++r) {
      const uint8_t* wr = w[r] + (i >> 1);
      _mm_prefetch(reinterpret_cast<const char*>(wr + kPrefetchL2), _MM_HINT_T1);
      if (kAmdCore) _mm_prefetch(reinterpret_cast<const char*>(wr + kPrefetch), _MM_HINT_T0);
      if constexpr (M <= 2)  // decode-shaped blocks only (above)
        _mm_prefetch(reinterpret_cast<const char*>(s[r] + ((i + 2 * kPrefetchL2) >> gshift)), _MM_HINT_T1);
      const __m512i v = _mm512_loadu_si512(wr);
      const __m512i lo = nibbles_u4(v), hi = nibbles_u4(_mm512_srli_epi16(v, 4));
      const float* sr = s[r] + (i >> gshift);
      const __m128 sv = g == 32 ? _mm_loadu_ps(sr)
                        : g == 64 ? load2_ps(sr)
                                  : _mm_load_ss(sr);
      const __m512 sc = _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(sv));
      KT_UNROLL
      for (int m = 0; m < M; ++m) {
        const __m512i p = dot_step_u2(_mm512_loadu_si512(side[m] + (i >> 3)), lo, _mm512_loadu_si512(x[m] + i), hi,
                                      _mm512_loadu_si512(x[m] + i + 64));
        facc[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, facc[r][m]);
      }
    }
  }
  if (i < n) {  // the final 64: int32 lanes 0-3 and 8-11 hold block 0, lanes 4-7 and 12-15 block 1
    const __m512i tail = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
    KT_UNROLL
    for (int r = 0; r < R; ++r) {
      const uint8_t* wr = w[r] + (i >> 1);
      const __m512i u = unpack64_u4(wr);
      __m512 sc;
      if (g == 32) {
        sc = _mm512_permutexvar_ps(tail, _mm512_castps128_ps512(load2_ps(s[r] + (i >> 5))));
      } else {
        sc = _mm512_set1_ps(s[r][i >> gshift]);
      }
      KT_UNROLL
      for (int m = 0; m < M; ++m) {
        const __m512i p = dot_step_u(_mm512_loadu_si512(side[m] + (i >> 3)), u, _mm512_loadu_si512(x[m] + i));
        facc[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, facc[r][m]);
      }
    }
  }
  KT_UNROLL
  for (int r = 0; r < R; ++r) {
    KT_UNROLL
    for (int m = 0; m < M; ++m) out[r * M + m] = _mm512_reduce_add_ps(facc[r][m]);
  }
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

// The lane sums of M int32 accumulators into out[0, M): for four, one transposing reduction, as the
// ZMM hsum_epi32_m (integer sums: the same values in any order).
template <int M>
static inline void hsum_epi32_m(const __m256i* acc, int32_t* out) {
  if constexpr (M == 4) {
    const __m256i ab = _mm256_add_epi32(_mm256_unpacklo_epi32(acc[0], acc[1]), _mm256_unpackhi_epi32(acc[0], acc[1]));
    const __m256i cd = _mm256_add_epi32(_mm256_unpacklo_epi32(acc[2], acc[3]), _mm256_unpackhi_epi32(acc[2], acc[3]));
    const __m256i q = _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                     _mm_add_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)));
  } else {
    KT_UNROLL
    for (int m = 0; m < M; ++m) out[m] = hsum_epi32(acc[m]);
  }
}

// INT8: R weight rows x M activation rows per pass, out[r * M + m] = the exact int32 dot; |w| once
// per row step, x with w's sign per (row, activation) (vpmaddubsw takes unsigned x signed). Prefetched
// as on ZMM (i8_prefetch): on AMD none in one-pair blocks (Zen 4: 0.87-0.96 of the time at 1-8 tokens on
// one thread against into L1, 0.97-1.00 on two), into L2 in the others.
template <int R, int M>
static inline void dot_i8_block(const int8_t* const* w, const int8_t* const* x, const int32_t* /*xsum*/, int64_t n,
                                int32_t* out) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[R][M];
  KT_UNROLL
  for (int r = 0; r < R; ++r) {
    KT_UNROLL
    for (int m = 0; m < M; ++m) acc[r][m] = _mm256_setzero_si256();
  }
  for (int64_t i = 0; i < n; i += kStep) {
    KT_UNROLL
    for (int r = 0; r < R; ++r) {
      i8_prefetch<R, M>(w[r] + i);
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + i));
      const __m256i aw = _mm256_sign_epi8(wv, wv);
      KT_UNROLL
      for (int m = 0; m < M; ++m) {
        const __m256i sx = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[m] + i)), wv);
        acc[r][m] = _mm256_add_epi32(acc[r][m], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones));
      }
    }
  }
  KT_UNROLL
  for (int r = 0; r < R; ++r) hsum_epi32_m<M>(acc[r], out + r * M);
}

// RAWINT4 x int8 activations. 32 packed bytes (two 32-element blocks) are one step's register; their
// low nibbles are [block 0 elements 0-15 | block 1 elements 0-15] and their high nibbles [block 0
// elements 16-31 | block 1 elements 16-31]. The activations are stored in that order once per row
// (i4_prepare), so unpacking is two masks and a shift, with no lane crossing. Offset nibbles
// u = n ^ 8 = value + 8 are unsigned for vpmaddubsw; sum value * x = sum u * x - 8 * sum x.
//
// Four steps (256 elements, eight blocks) make a chunk, reduced before any float work: per 128-bit
// half (block 0 or block 1 of each step), the int16 partial sums of steps 0 and 1 are interleaved and
// added (vpunpck{l,h}dq, vpaddw), widened once (vpmaddwd), and combined with steps 2 and 3
// (vpunpck{l,h}qdq, vpaddd) into one int32 lane per block: [blocks 0 2 4 6 | blocks 1 3 5 7], each the
// exact sum u * x of its 32 elements. The row's side data, -8 * sum x of each block in the same lane
// order, is added in int32 before one conversion and one multiply-add with the blocks' scales. A weight
// row takes one scale permutation and five prefetches a chunk (were four and twelve), an activation row
// a quarter of the conversions and multiply-adds (the interleaves cost about what they saved: on a
// Zen 4 core this loop issues about four vector instructions a cycle of any kind, and at two and more
// pairs that is its bound). In-process A/B against converting every step, on that core: 0.90-0.92 of
// the time at 1-8 tokens on one thread, 0.97-1.00 on two, 0.95-0.99 at 16-256 tokens; the outputs
// differ in the float rounding of the scaled sums (relative 1e-6), and stay the same whatever R and M.
// int16 sums stay exact: four products of at most 15 * 127 in vpmaddubsw + vpaddw, eight after the
// interleave (15240 < 32767).
// int32 side data per activation row of n (i4_prepare): eight lanes per 256 elements.
static inline int64_t i4_side_len(int64_t n, int /*g*/) { return (n + 255) / 256 * 8; }
static inline void i4_prepare(int8_t* x, int64_t n, int g, int32_t* side) {
  std::memset(side, 0, static_cast<size_t>(i4_side_len(n, g)) * 4);
  for (int64_t b = 0; b < n / 32; ++b) {
    int32_t sum = 0;
    for (int64_t j = 32 * b; j < 32 * b + 32; ++j) sum += x[j];
    const int64_t k = b & 7;  // block of its chunk: lane (k & 1) * 4 + k / 2
    side[(b >> 3) * 8 + (k & 1) * 4 + (k >> 1)] = -8 * sum;
  }
  for (int64_t i = 0; i < n; i += 64) i4_order64(x + i);
}

// One chunk of R rows (w: 128 packed bytes each, s: the scales of its groups) against M activation
// rows (x: 256 int8 each, side: 8 lanes each) into facc[r][m], lanes as above.
template <int R, int M, int G>
static inline __attribute__((always_inline)) void i4_chunk(const uint8_t* const* w, const float* const* s,
                                                           const int8_t* const* x, const int32_t* const* side,
                                                           __m256 (&facc)[R][M]) {
  const __m256i mask = _mm256_set1_epi8(0x0F), flip = _mm256_set1_epi8(-120), ones = _mm256_set1_epi16(1);
  KT_UNROLL
  for (int r = 0; r < R; ++r) {
    // The chunk's group scales in lane order: groups of 32 [0 2 4 6 | 1 3 5 7], of 64 [0 1 2 3 | 0 1 2 3],
    // of 128 [0 0 1 1 | 0 0 1 1].
    __m256 sc;
    if constexpr (G == 32)
      sc = _mm256_permutevar8x32_ps(_mm256_loadu_ps(s[r]), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    else if constexpr (G == 64)
      sc = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(s[r]));
    else
      sc = _mm256_permutevar8x32_ps(
          _mm256_castps128_ps256(load2_ps(s[r])),
          _mm256_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1));
    __m256i e01[M];
    KT_UNROLL
    for (int half = 0; half < 2; ++half) {  // steps 0 and 1, then 2 and 3
      const __m256i v0 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + 64 * half)), flip);
      const __m256i v1 =
          _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + 64 * half + 32)), flip);
      const __m256i lo0 = _mm256_and_si256(v0, mask), hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), mask);
      const __m256i lo1 = _mm256_and_si256(v1, mask), hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), mask);
      KT_UNROLL
      for (int m = 0; m < M; ++m) {
        const int8_t* xs = x[m] + 128 * half;
        const auto ld = [xs](int o) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs + o)); };
        const __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(lo0, ld(0)), _mm256_maddubs_epi16(hi0, ld(32)));
        const __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(lo1, ld(64)), _mm256_maddubs_epi16(hi1, ld(96)));
        // int32 per half: [step 0, step 1, step 0, step 1] (lanes of the first half shown)
        const __m256i e =
            _mm256_madd_epi16(_mm256_add_epi16(_mm256_unpacklo_epi32(p0, p1), _mm256_unpackhi_epi32(p0, p1)), ones);
        if (half == 0) {
          e01[m] = e;
        } else {
          const __m256i blocks = _mm256_add_epi32(
              _mm256_add_epi32(_mm256_unpacklo_epi64(e01[m], e), _mm256_unpackhi_epi64(e01[m], e)),
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(side[m])));
          facc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(blocks), sc, facc[r][m]);
        }
      }
    }
  }
}

// The last one to three steps of a row (k elements) as a chunk whose activations are zero after them.
// Out of line: rows of a multiple of 256 elements never take it.
template <int R, int M, int G>
__attribute__((noinline)) static void i4_tail(const uint8_t* const* w, const float* const* s, const int8_t* const* x,
                                              const int32_t* const* side, int64_t k, __m256 (&facc)[R][M]) {
  alignas(32) uint8_t wt[R][128] = {};
  alignas(32) float st[R][8] = {};
  alignas(32) int8_t xt[M][256] = {};
  const uint8_t* wq[R];
  const float* sq[R];
  const int8_t* xq[M];
  for (int r = 0; r < R; ++r) {
    std::memcpy(wt[r], w[r], static_cast<size_t>(k / 2));
    std::memcpy(st[r], s[r], static_cast<size_t>((k + G - 1) / G) * 4);
    wq[r] = wt[r], sq[r] = st[r];
  }
  for (int m = 0; m < M; ++m) std::memcpy(xt[m], x[m], static_cast<size_t>(k)), xq[m] = xt[m];
  i4_chunk<R, M, G>(wq, sq, xq, side, facc);
}

// R weight rows against M activation rows: out[r * M + m] = the dot of row r with activation m. The
// rows are unpacked once per step for all M activations (gate and up rows of one expert, or
// neighbouring down rows, against the pairs routed to that expert). Every (r, m) accumulates in the
// same order whatever R and M are, so a pair's result does not depend on how many pairs its expert
// has in the batch (KT_UNROLL keeps the accumulators in registers).
// Each weight row stream is prefetched twice, into L2 16 KiB ahead (kPrefetchFar, its scales as many
// steps ahead) and into L1 2 KiB ahead (kPrefetch): in-process A/B against 4 KiB into L1 alone, on a
// Zen 4 core, 0.84-0.89 of the time at 1-8 tokens on one thread, 0.74-0.93 on two, 0.93-0.98 at 16-256
// tokens. Either prefetch alone, at any distance tried (1-16 KiB), or a scale prefetch beside the L1
// one, moved it by no more than the runs moved.
template <int R, int M, int G>
static inline __attribute__((always_inline)) void dot_i4_block(const uint8_t* const* w, const float* const* s,
                                                               const int8_t* const* x, const int32_t* const* side,
                                                               int64_t n, float* out) {
  static_assert(G == 32 || G == 64 || G == 128, "RAWINT4 groups are 32, 64 or 128 elements");
  constexpr int gshift = G == 32 ? 5 : G == 64 ? 6 : 7;
  __m256 facc[R][M];
  KT_UNROLL
  for (int r = 0; r < R; ++r) {
    KT_UNROLL
    for (int m = 0; m < M; ++m) facc[r][m] = _mm256_setzero_ps();
  }
  // The row, scale and activation pointers step in locals (indexed through w, s and x, GCC reloaded
  // them from the stack every step).
  const uint8_t* wp[R];
  const float* sp[R];
  const int8_t* xp[M];
  const int32_t* dp[M];
  KT_UNROLL
  for (int r = 0; r < R; ++r) wp[r] = w[r], sp[r] = s[r];
  KT_UNROLL
  for (int m = 0; m < M; ++m) xp[m] = x[m], dp[m] = side[m];
  int64_t i = 0;
  for (; i + 256 <= n; i += 256) {
    KT_UNROLL
    for (int r = 0; r < R; ++r) {
      const char* wr = reinterpret_cast<const char*>(wp[r]);
      _mm_prefetch(wr + kPrefetchFar, _MM_HINT_T1);
      _mm_prefetch(wr + kPrefetchFar + 64, _MM_HINT_T1);
      _mm_prefetch(wr + kPrefetch, _MM_HINT_T0);
      _mm_prefetch(wr + kPrefetch + 64, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(sp[r] + ((2 * kPrefetchFar) >> gshift)), _MM_HINT_T1);
    }
    i4_chunk<R, M, G>(wp, sp, xp, dp, facc);
    KT_UNROLL
    for (int r = 0; r < R; ++r) wp[r] += 128, sp[r] += 256 >> gshift;
    KT_UNROLL
    for (int m = 0; m < M; ++m) xp[m] += 256, dp[m] += 8;
  }
  if (i < n) i4_tail<R, M, G>(wp, sp, xp, dp, n - i, facc);
  KT_UNROLL
  for (int r = 0; r < R; ++r) {
    KT_UNROLL
    for (int m = 0; m < M; ++m) out[r * M + m] = hsum_ps(facc[r][m]);
  }
}


#endif  // KT_ZMM

#if KT_BF16_DOT
// 512 bits seen as 32 bf16 values (a register reinterpretation: no instruction), for the backward's
// vdpbf16ps tiles (moe_grad.cpp).
static inline __m512bh as_bh(__m512i v) {
#if defined(KT_EMULATE)
  __m512bh r;
  std::memcpy(&r, &v, sizeof r);
  return r;
#else
  return (__m512bh)v;
#endif
}
#endif

}  // namespace kt

#endif  // KT_DOT_H
