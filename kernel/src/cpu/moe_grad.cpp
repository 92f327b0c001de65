// MoE expert backward for one CPU variant (fine-tuning with LoRA on the experts).
//
// Forward, per pair p = (token t, k) routed to expert e, s = alpha / rank:
//   g = Wg x + s Bg Ag x,   u = Wu x + s Bu Au x,   h = silu(g) * u
//   o = Wd h + s Bd Ad h,   y[t] = sum_k w[t,k] o_p
// Backward from dy = dL/dy[t]:
//   q  = Wd^T dy + s Ad^T (Bd^T dy)       (so that dot(dy, o) = dot(q, h))
//   dw = dot(q, h),   dh = w q,   dg = dh u silu'(g),   du = dh silu(g)
//   dx = sum_k Wg^T dg + Wu^T du + s Ag^T (Bg^T dg) + s Au^T (Bu^T du)
//   dBg = s dg (Ag x)^T,  dAg = s (Bg^T dg) x^T,  likewise up;  dBd = s (w dy)(Ad h)^T,  dAd = s w (Bd^T dy) h^T
// The quantized base weights are read (dequantized a row block at a time), never written.
// Products with W^T run over (expert, column block) work items: each item owns its output
// columns, so no two threads write the same float and no reduction is needed. Per variant:
//   avx2 .. avx512_vbmi  fp32 register tiles (GCC vector extensions: ymm or zmm)
//   avx512_bf16          the block and the vectors rounded to bf16, vdpbf16ps into fp32
//   amx                  the same in AMX-BF16 tiles (tdpbf16ps) for 16 pairs at a time
// The bf16 paths round the dequantized weights and dy, dg, du to bf16 (as torch's bf16 autograd
// does; the vectors once per call, not per work item); accumulation stays fp32.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "amx.h"
#include "common.h"
#include "dot.h"
#include "moe_grad.h"

namespace kt {
namespace {

constexpr int64_t kCols = 64;   // output columns per work item
constexpr int64_t kRows = 256;  // weight rows dequantized into one block (64 KiB of fp32)
constexpr int kTile = 4;        // pairs per register tile

// One vector register of fp32 for this variant: GCC vector extensions, compiled with the variant's
// -m flags (ymm for AVX2, zmm for AVX-512; emulated builds get the baseline's registers).
#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#else
constexpr int kVecBytes = 32;
#endif
typedef float vf __attribute__((vector_size(kVecBytes)));
constexpr int kVec = kVecBytes / 4;
static_assert(kCols % (2 * kVec) == 0, "a column block is a whole number of two-register tiles");

struct QView {
  const kt_qweight& w;
  int64_t rows, cols;
  int wfmt, g;
  // fp32 values of row r of expert e, columns [c0, c1) (c0, c1 multiples of 32).
  void row(int64_t e, int64_t r, int64_t c0, int64_t c1, float* dst) const {
    const int64_t row = e * rows + r;
    if (wfmt == KT_INT8) {
      const int8_t* q = static_cast<const int8_t*>(w.q) + row * cols;
      const float sc = w.scale[row];
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) dst[c - c0] = static_cast<float>(q[c]) * sc;
      return;
    }
    const uint8_t* q = static_cast<const uint8_t*>(w.q) + row * (cols >> 1);
    const float* sr = w.scale + row * (cols / g);
    for (int64_t b = c0; b < c1; b += 32) {
      const uint8_t* by = q + (b >> 1);
      const float sc = sr[b / g];
      float* d = dst + (b - c0);
#if KT_ZMM  // the loop below, 16 bytes at a time (GCC vectorized it on xmm)
      const __m512i v =  // sign-extended bytes (two steps: SIMDe, for the emulated builds, has no one-step form)
          _mm512_cvtepi16_epi32(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(by))));
      const __m512 s = _mm512_set1_ps(sc);
      _mm512_storeu_ps(d, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 28), 28)), s));
      _mm512_storeu_ps(d + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(v, 4)), s));
#else
#pragma omp simd
      for (int j = 0; j < 16; ++j) {
        d[j] = static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(by[j] << 4)) >> 4) * sc;
        d[j + 16] = static_cast<float>(static_cast<int8_t>(by[j]) >> 4) * sc;
      }
#endif
    }
  }
};

// out_m[j0, j0 + 2 * kVec) += sum_{r in [r0, r1)} v_m[r] * buf[r - r0][j0 ...] for M pairs: M x 2
// accumulators stay in registers across the rows.
template <int M>
inline void tile(const float* const* v, int64_t r0, int64_t r1, const float* buf, float* const* out, int64_t j0) {
  vf acc[M][2];
  for (int m = 0; m < M; ++m) {
    acc[m][0] = *reinterpret_cast<const vf*>(out[m] + j0);
    acc[m][1] = *reinterpret_cast<const vf*>(out[m] + j0 + kVec);
  }
  for (int64_t r = r0; r < r1; ++r) {
    const float* wr = buf + (r - r0) * kCols + j0;
    const vf w0 = *reinterpret_cast<const vf*>(wr);
    const vf w1 = *reinterpret_cast<const vf*>(wr + kVec);
    for (int m = 0; m < M; ++m) {
      const float a = v[m][r];
      acc[m][0] += a * w0;
      acc[m][1] += a * w1;
    }
  }
  for (int m = 0; m < M; ++m) {
    *reinterpret_cast<vf*>(out[m] + j0) = acc[m][0];
    *reinterpret_cast<vf*>(out[m] + j0 + kVec) = acc[m][1];
  }
}

#if KT_BF16_DOT
// The bf16 paths' per-thread pieces of the kRows x kCols x 4-byte block: the weight block as
// kRows / 2 rows of kCols bf16 pairs (W[2k][j], W[2k+1][j]) (what vdpbf16ps and tdpbf16ps pair up),
// 16 vectors of kRows bf16 and a 16 x kCols fp32 tile.
constexpr int64_t kPairBlock = kRows / 2 * kCols;  // uint32 elements
static_assert((kPairBlock * 4 + 16 * kRows * 2 + 16 * kCols * 4) <= kRows * kCols * 4, "bf16 pieces fit the block");

// out_m[0, kCols) += sum_k vb_m[k] . blk[k][...] for M vectors; vb_m points at bf16 pairs (v[2k], v[2k+1]).
template <int M>
inline void tile_bf16(const uint32_t* const* vb, int64_t kpairs, const uint32_t* blk, float* const* out) {
  __m512 acc[M][4];
  for (int m = 0; m < M; ++m)
    for (int c = 0; c < 4; ++c) acc[m][c] = _mm512_loadu_ps(out[m] + 16 * c);
  for (int64_t k = 0; k < kpairs; ++k) {
    const uint32_t* wr = blk + k * kCols;
    const __m512i w0 = _mm512_loadu_si512(wr), w1 = _mm512_loadu_si512(wr + 16);
    const __m512i w2 = _mm512_loadu_si512(wr + 32), w3 = _mm512_loadu_si512(wr + 48);
    for (int m = 0; m < M; ++m) {
      const __m512bh a = as_bh(_mm512_set1_epi32(static_cast<int>(vb[m][k])));
      acc[m][0] = _mm512_dpbf16_ps(acc[m][0], a, as_bh(w0));
      acc[m][1] = _mm512_dpbf16_ps(acc[m][1], a, as_bh(w1));
      acc[m][2] = _mm512_dpbf16_ps(acc[m][2], a, as_bh(w2));
      acc[m][3] = _mm512_dpbf16_ps(acc[m][3], a, as_bh(w3));
    }
  }
  for (int m = 0; m < M; ++m)
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(out[m] + 16 * c, acc[m][c]);
}

// f32_to_bf16 (common.h) of 16 floats, each in the low half of its int32 lane: the same bits.
inline __m512i bf16_bits16(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __mmask16 nan = _mm512_cmp_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                              _mm512_set1_epi32(0x7f800000), _MM_CMPINT_NLE);  // unsigned >
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_mask_mov_epi32(rounded, nan, quiet);
}

// accumulate_wt's bf16 form: AMX tiles for each full group of 16 vectors (amx variant), vdpbf16ps
// register tiles for the rest. vb: the vectors already rounded to bf16 (once per call, by the caller).
void accumulate_wt_bf16(const QView& w, int64_t e, int64_t c0, const uint16_t* const* vb, float* const* out, int64_t n,
                        float* buf) {
  uint32_t* blk = reinterpret_cast<uint32_t*>(buf);
  uint16_t* at = reinterpret_cast<uint16_t*>(blk + kPairBlock);  // [16][kRows] bf16: the AMX A tile rows
  float* ctile = reinterpret_cast<float*>(at + 16 * kRows);      // [16][kCols] fp32
  alignas(64) float two[2][kCols];
  const uint32_t* vp[16];
  for (int64_t r0 = 0; r0 < w.rows; r0 += kRows) {
    const int64_t r1 = std::min(w.rows, r0 + kRows), kp = (r1 - r0) / 2;
    for (int64_t k = 0; k < kp; ++k) {
      w.row(e, r0 + 2 * k, c0, c0 + kCols, two[0]);
      w.row(e, r0 + 2 * k + 1, c0, c0 + kCols, two[1]);
      for (int64_t j = 0; j < kCols; j += 16)  // f32_to_bf16 of both rows, 16 lanes at a time
        _mm512_storeu_si512(blk + k * kCols + j,
                            _mm512_or_si512(bf16_bits16(_mm512_load_ps(two[0] + j)),
                                            _mm512_slli_epi32(bf16_bits16(_mm512_load_ps(two[1] + j)), 16)));
    }
    // vp[m] = the pairs of vector i + m from row r0 on, for m < M
    auto pairs = [&](int64_t i, int64_t M) {
      for (int64_t m = 0; m < M; ++m) vp[m] = reinterpret_cast<const uint32_t*>(vb[i + m] + r0);
    };
    int64_t i = 0;
    if (amx_bf16_available())
      for (; i + 16 <= n; i += 16) {
        for (int64_t m = 0; m < 16; ++m) {
          std::memcpy(at + m * kRows, vb[i + m] + r0, static_cast<size_t>(r1 - r0) * 2);
          std::memcpy(ctile + m * kCols, out[i + m], kCols * 4);
        }
        amx_gemm_bf16_cols64(at, kRows * 2, blk, r1 - r0, ctile);
        for (int64_t m = 0; m < 16; ++m) std::memcpy(out[i + m], ctile + m * kCols, kCols * 4);
      }
    for (; i + kTile <= n; i += kTile) {
      pairs(i, kTile);
      tile_bf16<kTile>(vp, kp, blk, out + i);
    }
    for (; i < n; ++i) {
      pairs(i, 1);
      tile_bf16<1>(vp, kp, blk, out + i);
    }
  }
}
#endif

// out_i[0, kCols) += sum_r v_i[r] * W[e][r, c0 + ...) for the n rows (i < n) given by pointers; each
// out_i is 64-byte aligned. The weight block is dequantized once per item, then a register-tiled GEMM.
// `buf` is the calling thread's kRows x kCols block. vb: the same vectors in bf16 where the variant
// computes in bf16 (KT_BF16_DOT), else unused.
void accumulate_wt(const QView& w, int64_t e, int64_t c0, const float* const* v, const uint16_t* const* vb,
                   float* const* out, int64_t n, float* buf) {
#if KT_BF16_DOT
  (void)v;
  return accumulate_wt_bf16(w, e, c0, vb, out, n, buf);
#else
  (void)vb;
#endif
  for (int64_t r0 = 0; r0 < w.rows; r0 += kRows) {
    const int64_t r1 = std::min(w.rows, r0 + kRows);
    for (int64_t r = r0; r < r1; ++r) w.row(e, r, c0, c0 + kCols, buf + (r - r0) * kCols);
    int64_t i = 0;
    for (; i + kTile <= n; i += kTile)
      for (int64_t j0 = 0; j0 < kCols; j0 += 2 * kVec) tile<kTile>(v + i, r0, r1, buf, out + i, j0);
    for (; i < n; ++i)
      for (int64_t j0 = 0; j0 < kCols; j0 += 2 * kVec) tile<1>(v + i, r0, r1, buf, out + i, j0);
  }
}

// The LoRA products with a rank-wide matrix M [rows, R] (row-major): out = M^T v, and the outer-product
// update d[r, 0, R) += (c * v[r]) * x. A rank's row is a few floats: a loop over R per row (axpy_f32)
// spends most of its time outside its vector body, so the usual ranks take one R-wide vector per row
// (GCC lowers it to this variant's registers). Each element sees the same operations in the same order
// as the generic loop (one fused multiply-add per row), so the results are the same bits.
template <int N>
void rank_bt_n(const float* m, const float* v, int64_t rows, float* out) {
  typedef float vt __attribute__((vector_size(N * 4), aligned(4)));
  vt acc = {};
  for (int64_t r = 0; r < rows; ++r) acc += v[r] * *reinterpret_cast<const vt*>(m + r * N);
  *reinterpret_cast<vt*>(out) = acc;
}
template <int N>
void rank_ger_n(float c, const float* v, int64_t rows, const float* x, float* d) {
  typedef float vt __attribute__((vector_size(N * 4), aligned(4)));
  const vt xv = *reinterpret_cast<const vt*>(x);
  for (int64_t r = 0; r < rows; ++r) *reinterpret_cast<vt*>(d + r * N) += (c * v[r]) * xv;
}
void rank_bt(const float* m, const float* v, int64_t rows, int R, float* out) {
  switch (R) {
    case 4: return rank_bt_n<4>(m, v, rows, out);
    case 8: return rank_bt_n<8>(m, v, rows, out);
    case 16: return rank_bt_n<16>(m, v, rows, out);
    case 32: return rank_bt_n<32>(m, v, rows, out);
    case 64: return rank_bt_n<64>(m, v, rows, out);
    default:
      std::fill(out, out + R, 0.f);
      for (int64_t r = 0; r < rows; ++r) axpy_f32(v[r], m + r * R, out, R);
  }
}
void rank_ger(float c, const float* v, int64_t rows, const float* x, int R, float* d) {
  switch (R) {
    case 4: return rank_ger_n<4>(c, v, rows, x, d);
    case 8: return rank_ger_n<8>(c, v, rows, x, d);
    case 16: return rank_ger_n<16>(c, v, rows, x, d);
    case 32: return rank_ger_n<32>(c, v, rows, x, d);
    case 64: return rank_ger_n<64>(c, v, rows, x, d);
    default:
      for (int64_t r = 0; r < rows; ++r) axpy_f32(c * v[r], x, d + r * R, R);
  }
}

int fail(char* err, size_t err_len, const char* msg) {
  std::snprintf(err, err_len, "%s", msg);
  return 1;
}

}  // namespace

int moe_backward(const kt_moe_args* args, const kt_moe_grad_args* gr, char* err, size_t err_len) {
  const kt_moe_args& a = *args;
  if (!validate_args(a, err, err_len)) return 1;
  const int64_t T = a.tokens, K = a.topk, H = a.hidden, I = a.inter, E = a.experts, P = T * K;
  const int R = a.lora.rank;
  const float s = a.lora.scale;
  if (T > 0 && (!a.saved.gate || !a.saved.up || (R > 0 && !a.saved.lora)))
    return fail(err, err_len, "the backward needs what its training forward saved (gate, up, LoRA projections)");
  if (T > 0 && (!gr->dy || !gr->dx || !gr->dweights)) return fail(err, err_len, "null dy, dx or dweights");
  float* const dl[6] = {gr->d_gate_a, gr->d_gate_b, gr->d_up_a, gr->d_up_b, gr->d_down_a, gr->d_down_b};
  if (R > 0) {
    for (float* d : dl)
      if (!d) return fail(err, err_len, "LoRA rank > 0 needs all six LoRA gradient pointers");
    // Every LoRA gradient has E * rank * (hidden or inter) elements.
    const int64_t n[6] = {E * R * H, E * I * R, E * R * H, E * I * R, E * R * I, E * H * R};
    for (int i = 0; i < 6; ++i) std::memset(dl[i], 0, static_cast<size_t>(n[i]) * 4);
  }
  if (T == 0) return 0;
  const int threads = a.num_threads < 1 ? 1 : a.num_threads;
  Routing rt;
  if (!build_routing(a, &rt, err, err_len)) return 1;
  std::vector<int64_t> expert_of(static_cast<size_t>(P)), orig(static_cast<size_t>(P));
  for (int64_t e : rt.active)
    for (int64_t p = rt.expert_begin[e]; p < rt.expert_begin[e + 1]; ++p) expert_of[p] = e;
  for (int64_t i = 0; i < P; ++i) orig[rt.pair_of[i]] = i;

  // Scratch: dy in fp32 per token, q/dg/du per pair (inter), dx per pair (hidden), B^T vectors.
  const size_t ldH = align_up(4 * H), ldI = align_up(4 * I), ldR = align_up(4 * 3 * static_cast<size_t>(R > 0 ? R : 1));
  Scratch sc;
  const bool dy_bf16 = a.x_dtype == KT_BF16;
  const size_t o_dy = dy_bf16 ? sc.reserve(T * ldH) : 0;
  const size_t o_q = sc.reserve(P * ldI), o_dg = sc.reserve(P * ldI), o_du = sc.reserve(P * ldI);
  const size_t o_dx = sc.reserve(P * ldH), o_bv = sc.reserve(P * ldR);
  const size_t o_blk = sc.reserve(static_cast<size_t>(threads) * kRows * kCols * 4);  // dequantized weight blocks
  // The bf16 variants' copies of dy (per token) and dg, du (per pair), rounded once per call.
  const size_t ldHb = align_up(2 * H), ldIb = align_up(2 * I);
  const size_t o_dyb = KT_BF16_DOT ? sc.reserve(T * ldHb) : 0;
  const size_t o_dgb = KT_BF16_DOT ? sc.reserve(P * ldIb) : 0, o_dub = KT_BF16_DOT ? sc.reserve(P * ldIb) : 0;
  if (!sc.allocate()) return fail(err, err_len, "out of memory allocating MoE backward scratch buffers");
  auto dy = [&](int64_t t) {
    return dy_bf16 ? sc.at<float>(o_dy + t * ldH) : static_cast<const float*>(gr->dy) + t * H;
  };
  auto q = [&](int64_t p) { return sc.at<float>(o_q + p * ldI); };
  auto dg = [&](int64_t p) { return sc.at<float>(o_dg + p * ldI); };
  auto du = [&](int64_t p) { return sc.at<float>(o_du + p * ldI); };
  auto dxp = [&](int64_t p) { return sc.at<float>(o_dx + p * ldH); };
  auto dyb = [&](int64_t t) { return sc.at<uint16_t>(o_dyb + t * ldHb); };
  auto dgb = [&](int64_t p) { return sc.at<uint16_t>(o_dgb + p * ldIb); };
  auto dub = [&](int64_t p) { return sc.at<uint16_t>(o_dub + p * ldIb); };
  auto to_bf16 = [](const float* src, int64_t n, uint16_t* dst) {
    for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
  };
  auto block = [&](int tid) { return sc.at<float>(o_blk + static_cast<size_t>(tid) * kRows * kCols * 4); };
  auto bv = [&](int64_t p) { return sc.at<float>(o_bv + p * ldR); };  // Bd^T dy, Bg^T dg, Bu^T du
  auto lsaved = [&](int64_t p) { return a.saved.lora + orig[p] * 3 * R; };  // Ag x, Au x, Ad h
  auto x_row = [&](int64_t t, float* dst) {
    if (a.x_dtype == KT_BF16) {
      const uint16_t* x = static_cast<const uint16_t*>(a.x) + t * H;
      for (int64_t i = 0; i < H; ++i) dst[i] = bf16_to_f32(x[i]);
    } else {
      std::memcpy(dst, static_cast<const float*>(a.x) + t * H, static_cast<size_t>(H) * 4);
    }
  };
  // B^T v for a LoRA B of shape [rows, R]: out[j] = sum_r B[r, j] v[r]
  auto bt = [&](const float* b, const float* v, int64_t rows, float* out) { rank_bt(b, v, rows, R, out); };

  if (dy_bf16)
    parallel_for(T, threads, [&](int64_t t, int) {
      const uint16_t* src = static_cast<const uint16_t*>(gr->dy) + t * H;
      float* d = sc.at<float>(o_dy + t * ldH);
      for (int64_t i = 0; i < H; ++i) d[i] = bf16_to_f32(src[i]);
    });
  if (KT_BF16_DOT) parallel_for(T, threads, [&](int64_t t, int) { to_bf16(dy(t), H, dyb(t)); });
  const int gsz = a.group_size > 0 ? a.group_size : 1;
  const QView gate{a.gate, I, H, a.wfmt, gsz}, up{a.up, I, H, a.wfmt, gsz}, down{a.down, H, I, a.wfmt, gsz};

  // 1. Bd^T dy per pair.
  if (R > 0)
    parallel_for(P, threads, [&](int64_t p, int) {
      bt(a.lora.down_b + expert_of[p] * H * R, dy(rt.pair_token[p]), H, bv(p));
    });

  // 2. q = Wd^T dy + s Ad^T (Bd^T dy), per (expert, column block of inter).
  std::vector<std::pair<int64_t, int64_t>> items;
  for (int64_t e : rt.active)
    for (int64_t c0 = 0; c0 < I; c0 += kCols) items.emplace_back(e, c0);
  parallel_for(static_cast<int64_t>(items.size()), threads, [&](int64_t it, int tid) {
    const int64_t e = items[it].first, c0 = items[it].second, c1 = c0 + kCols;
    const int64_t b = rt.expert_begin[e], n = rt.expert_begin[e + 1] - b;
    std::vector<const float*> v(static_cast<size_t>(n));
    std::vector<const uint16_t*> vb(static_cast<size_t>(n));
    std::vector<float*> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      v[i] = dy(rt.pair_token[b + i]);
      vb[i] = KT_BF16_DOT ? dyb(rt.pair_token[b + i]) : nullptr;
      out[i] = q(b + i) + c0;
      std::fill(out[i], out[i] + (c1 - c0), 0.f);
    }
    accumulate_wt(down, e, c0, v.data(), vb.data(), out.data(), n, block(tid));
    if (R > 0)
      for (int64_t i = 0; i < n; ++i)
        for (int j = 0; j < R; ++j) axpy_f32(s * bv(b + i)[j], a.lora.down_a + (e * R + j) * I + c0, out[i], c1 - c0);
  });

  // 3. Routing-weight gradient, dg and du per pair; Bg^T dg and Bu^T du.
  parallel_for(P, threads, [&](int64_t p, int) {
    const int64_t row = orig[p];
    const float* g = a.saved.gate + row * I;
    const float* u = a.saved.up + row * I;
    const float w = a.weights[row];
    float* qp = q(p);
    float* dgp = dg(p);
    float* dup = du(p);
    gr->dweights[row] = silu_mul_backward(g, u, qp, w, dgp, dup, I);
    if (KT_BF16_DOT) {
      to_bf16(dgp, I, dgb(p));
      to_bf16(dup, I, dub(p));
    }
    if (R > 0) {
      const int64_t e = expert_of[p];
      bt(a.lora.gate_b + e * I * R, dgp, I, bv(p) + R);
      bt(a.lora.up_b + e * I * R, dup, I, bv(p) + 2 * R);
    }
  });

  // 4. dx per pair = Wg^T dg + Wu^T du + s Ag^T (Bg^T dg) + s Au^T (Bu^T du), per (expert, column block of hidden).
  items.clear();
  for (int64_t e : rt.active)
    for (int64_t c0 = 0; c0 < H; c0 += kCols) items.emplace_back(e, c0);
  parallel_for(static_cast<int64_t>(items.size()), threads, [&](int64_t it, int tid) {
    const int64_t e = items[it].first, c0 = items[it].second, c1 = c0 + kCols;
    const int64_t b = rt.expert_begin[e], n = rt.expert_begin[e + 1] - b;
    std::vector<const float*> vg(static_cast<size_t>(n)), vu(static_cast<size_t>(n));
    std::vector<const uint16_t*> vgb(static_cast<size_t>(n)), vub(static_cast<size_t>(n));
    std::vector<float*> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      vg[i] = dg(b + i);
      vu[i] = du(b + i);
      vgb[i] = KT_BF16_DOT ? dgb(b + i) : nullptr;
      vub[i] = KT_BF16_DOT ? dub(b + i) : nullptr;
      out[i] = dxp(b + i) + c0;
      std::fill(out[i], out[i] + (c1 - c0), 0.f);
    }
    accumulate_wt(gate, e, c0, vg.data(), vgb.data(), out.data(), n, block(tid));
    accumulate_wt(up, e, c0, vu.data(), vub.data(), out.data(), n, block(tid));
    if (R > 0)
      for (int64_t i = 0; i < n; ++i)
        for (int j = 0; j < R; ++j) {
          axpy_f32(s * bv(b + i)[R + j], a.lora.gate_a + (e * R + j) * H + c0, out[i], c1 - c0);
          axpy_f32(s * bv(b + i)[2 * R + j], a.lora.up_a + (e * R + j) * H + c0, out[i], c1 - c0);
        }
  });

  // 5. dx[t] = sum_k dx of its pairs.
  parallel_for(T, threads, [&](int64_t t, int) {
    float* d = gr->dx + t * H;
    std::memcpy(d, dxp(rt.pair_of[t * K]), static_cast<size_t>(H) * 4);
    for (int64_t k = 1; k < K; ++k) axpy_f32(1.f, dxp(rt.pair_of[t * K + k]), d, H);
  });

  // 6. LoRA gradients: one work item per (active expert, tensor); each writes only its own tensor.
  if (R > 0) {
    const int64_t nact = static_cast<int64_t>(rt.active.size());
    parallel_for(nact * 6, threads, [&](int64_t it, int) {
      const int64_t e = rt.active[it / 6];
      const int which = static_cast<int>(it % 6);
      const int64_t b = rt.expert_begin[e], end = rt.expert_begin[e + 1];
      std::vector<float> tmp(static_cast<size_t>(std::max(H, I)));
      for (int64_t p = b; p < end; ++p) {
        const int64_t row = orig[p];
        const float* ls = lsaved(p);
        switch (which) {
          case 0:  // dAg [R, H] += s (Bg^T dg) x^T
          case 2: {  // dAu
            x_row(rt.pair_token[p], tmp.data());
            float* d = dl[which] + e * R * H;
            const float* bvec = bv(p) + (which == 0 ? R : 2 * R);
            for (int j = 0; j < R; ++j) axpy_f32(s * bvec[j], tmp.data(), d + j * H, H);
            break;
          }
          case 1:  // dBg [I, R] += s dg (Ag x)^T
          case 3: {  // dBu
            const float* dv = which == 1 ? dg(p) : du(p);
            const float* lv = ls + (which == 1 ? 0 : R);
            float* d = dl[which] + e * I * R;
            rank_ger(s, dv, I, lv, R, d);
            break;
          }
          case 4: {  // dAd [R, I] += s w (Bd^T dy) h^T
            const float* g = a.saved.gate + row * I;
            const float* u = a.saved.up + row * I;
            silu_mul(g, u, tmp.data(), I);
            float* d = dl[4] + e * R * I;
            const float sw = s * a.weights[row];
            for (int j = 0; j < R; ++j) axpy_f32(sw * bv(p)[j], tmp.data(), d + j * I, I);
            break;
          }
          default: {  // dBd [H, R] += s w dy (Ad h)^T
            const float* dv = dy(rt.pair_token[p]);
            float* d = dl[5] + e * H * R;
            const float sw = s * a.weights[row];
            rank_ger(sw, dv, H, ls + 2 * R, R, d);
            break;
          }
        }
      }
    });
  }
  return 0;
}

}  // namespace kt
