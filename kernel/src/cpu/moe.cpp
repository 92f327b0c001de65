// MoE expert forward for one CPU variant:
//   y[t] = sum_k w[t,k] * down_e( silu(gate_e(x[t])) * up_e(x[t]) ),  e = ids[t,k]
// Pairs (t, k) are sorted by expert so that each weight row is read once per
// call and reused from cache across all tokens routed to that expert.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "amx.h"
#include "common.h"
#include "dot.h"
#include "moe_grad.h"

#ifndef KT_VARIANT_NAME
#error "KT_VARIANT_NAME must be set by add_cpu_variant()"
#endif

namespace kt {
namespace {

constexpr int64_t kRowsA = 16;        // gate/up rows per work item (INT8; RAWINT4 twice as many)
constexpr int64_t kRowsC = 32;        // down rows per work item (INT8; RAWINT4 twice as many)
// A work item covers the same bytes of weights in either format: RAWINT4 items of INT8's row count
// cut each weight stream into 16 KiB pieces, and decode reached ~67% of the read roofline instead of
// ~80% (2 threads, one token, groups of 64).
// (hidden and inter are multiples of 64, so either row count divides them.)
int64_t rows_per_item(int wfmt, int64_t int8_rows) { return wfmt == KT_RAWINT4 ? 2 * int8_rows : int8_rows; }
constexpr int64_t kItemRowsMax = 2 * kRowsA;  // gate/up rows of a work item, either format
// AMX pays off from 6 pairs an expert, a tile of 16 token slots 3/8 full: on an AMX Xeon at 48-64
// tokens (top-8 of 64 experts) that took 4-9% less time than starting at 8 (in-process A/B, one and
// two threads), equal at 24 and 96; starting at 4 was no better. Below it the VNNI blocks run.
constexpr int64_t kAmxMinPairs = 6;

// Symmetric per-row int8 quantization; returns the scale (0 for an all-zero row).
float quantize_i8(const float* v, int64_t n, int8_t* q) {
  const float amax = absmax_f32(v, n);
  if (amax == 0.f) {
    std::memset(q, 0, static_cast<size_t>(n));
    return 0.f;
  }
  const float inv = 127.f / amax;
  for (int64_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::nearbyint(v[i] * inv));
  return amax / 127.f;
}

struct Plan {
  const kt_moe_args& a;
  Routing r;
  int64_t P, H, I;
  size_t ldx, ldxg, ldh, ldhq, ldhg, ldo, ld_amx = 0;
  std::vector<int64_t> tile0;  // per expert: its first AMX token tile, -1 where it does not use AMX
  std::vector<std::pair<int64_t, int64_t>> amx_tiles;  // every AMX token tile: (expert, tile of that expert)
  size_t o_xp = 0, o_hp = 0;
  Scratch s;
  size_t o_xq, o_xs, o_xi, o_xsum, o_h, o_hq, o_hs, o_hi, o_hsum, o_out, o_amx = 0, o_la = 0, ldla = 0;
  bool int_groups;  // RAWINT4 on int8 activations: each row's int32 side data (dot.h, i4_prepare)
  int rank = 0;     // LoRA rank (0: none)
  int threads = 1;
  float lscale = 0.f;
  std::vector<int64_t> expert_of;  // sorted pair -> expert (training forward only)
  std::vector<int64_t> orig;       // sorted pair -> row t * topk + k (training forward only)

  explicit Plan(const kt_moe_args& args) : a(args) {}

  void layout(int nthreads) {
    threads = nthreads;
    P = a.tokens * a.topk;
    H = a.hidden;
    I = a.inter;
    int_groups = a.wfmt == KT_RAWINT4;
    // Every per-pair row is rounded up to 64 bytes.
    ldx = align_up(H);
    ldxg = int_groups ? align_up(4 * i4_side_len(H, a.group_size)) : 0;  // RAWINT4 side data of x, of h
    ldh = align_up(4 * I);
    ldhq = align_up(I);
    ldhg = int_groups ? align_up(4 * i4_side_len(I, a.group_size)) : 0;
    ldo = align_up(4 * H);
    o_xq = s.reserve(P * ldx);
    o_xs = s.reserve(4 * P);
    o_xi = int_groups ? s.reserve(P * ldxg) : 0;
    o_xsum = s.reserve(4 * P);
    o_h = s.reserve(P * ldh);
    o_hq = s.reserve(P * ldhq);
    o_hs = s.reserve(4 * P);
    o_hi = int_groups ? s.reserve(P * ldhg) : 0;
    o_hsum = s.reserve(4 * P);
    o_out = s.reserve(P * ldo);
    rank = a.lora.rank;
    lscale = a.lora.scale;
    if (rank > 0) {
      ldla = align_up(4 * 3 * static_cast<size_t>(rank));
      o_la = s.reserve(P * ldla);
    }
    // AMX (INT8, experts with at least kAmxMinPairs pairs): their activations packed once as token
    // tiles (16 * K bytes each, K = H for gate/up, I for down), and per thread two C blocks of 16 rows
    // x (P + 16) int32.
    tile0.assign(static_cast<size_t>(a.experts), -1);
    if (amx_available() && a.wfmt == KT_INT8)
      for (int64_t e : r.active) {
        const int64_t m = r.expert_begin[e + 1] - r.expert_begin[e];
        if (m < kAmxMinPairs) continue;
        tile0[static_cast<size_t>(e)] = ntiles();
        for (int64_t t = 0; 16 * t < m; ++t) amx_tiles.emplace_back(e, t);
      }
    if (ntiles() > 0) {
      o_xp = s.reserve(static_cast<size_t>(ntiles() * 16 * H));
      o_hp = s.reserve(static_cast<size_t>(ntiles() * 16 * I));
      ld_amx = align_up(128 * (P + 16));
      o_amx = s.reserve(static_cast<size_t>(threads) * ld_amx);
    }
  }

  int64_t ntiles() const { return static_cast<int64_t>(amx_tiles.size()); }
  bool amx_expert(int64_t e) const { return tile0[static_cast<size_t>(e)] >= 0; }
  // Expert e's token tiles: of x (gate/up) or h (down).
  int8_t* xp(int64_t e) const { return s.at<int8_t>(o_xp + tile0[static_cast<size_t>(e)] * 16 * H); }
  int8_t* hp(int64_t e) const { return s.at<int8_t>(o_hp + tile0[static_cast<size_t>(e)] * 16 * I); }
  struct AmxWorkspace {
    int32_t* c0;
    int32_t* c1;
  };
  AmxWorkspace amx(int thread) const {
    int32_t* c0 = s.at<int32_t>(o_amx + thread * ld_amx);
    return {c0, c0 + 16 * (P + 16)};
  }

  int8_t* xq(int64_t p) const { return s.at<int8_t>(o_xq + p * ldx); }
  float* xs() const { return s.at<float>(o_xs); }
  float* h(int64_t p) const { return s.at<float>(o_h + p * ldh); }
  int8_t* hq(int64_t p) const { return s.at<int8_t>(o_hq + p * ldhq); }
  float* hs() const { return s.at<float>(o_hs); }
  int32_t* xi(int64_t p) const { return s.at<int32_t>(o_xi + p * ldxg); }
  // INT8: the sum of each pair's int8 x, of its int8 h (dot_i8_block's xsum), indexed by pair
  int32_t* xsum() const { return s.at<int32_t>(o_xsum); }
  int32_t* hsum() const { return s.at<int32_t>(o_hsum); }
  int32_t* hi(int64_t p) const { return s.at<int32_t>(o_hi + p * ldhg); }
  float* out(int64_t p) const { return s.at<float>(o_out + p * ldo); }
  // A_gate x, A_up x, A_down h of pair p: [3, rank]
  float* la(int64_t p) const { return s.at<float>(o_la + p * ldla); }

  // LoRA B's term for one element: x + scale * sum_k b[k] * l[k], the k in order, one rounding per
  // step (fma); the AMX epilogues (lora_b_tile) do exactly this 16 pairs to a vector, so a pair's
  // result does not depend on the path its expert took.
  float lora_b(float x, const float* b, const float* l) const {
    float sum = 0.f;
    for (int k = 0; k < rank; ++k) sum = std::fma(b[k], l[k], sum);
    return std::fma(lscale, sum, x);
  }
  // The gate/up projections of pair p (expert e), row r, from the base weights' dot products: adds
  // the LoRA terms and keeps them for the backward when asked. h = silu(g) * u follows for a block of
  // rows at a time (finish_h).
  void gate_up_terms(int64_t e, int64_t p, int64_t r, float& g, float& u) const {
    if (rank > 0) {
      g = lora_b(g, a.lora.gate_b + (e * I + r) * rank, la(p));
      u = lora_b(u, a.lora.up_b + (e * I + r) * rank, la(p) + rank);
    }
    if (a.saved.gate) {
      a.saved.gate[orig[p] * I + r] = g;
      a.saved.up[orig[p] * I + r] = u;
    }
  }
  // h of pair p, rows [r0, r0 + n), from its g and u (gate_up_terms).
  void finish_h(int64_t p, int64_t r0, int64_t n, const float* g, const float* u) const {
    silu_mul(g, u, h(p) + r0, n);
  }
  float finish_down(int64_t e, int64_t p, int64_t r, float o) const {
    return rank > 0 ? lora_b(o, a.lora.down_b + (e * H + r) * rank, la(p) + 2 * rank) : o;
  }
};

// One projection (gate, up or down) of every expert: where row r of expert e lies.
struct Proj {
  const kt_qweight& w;
  int64_t rows, cols;
  int wfmt, g;
  int64_t groups;  // cols / g, computed once: a division per row is measurable
  const int8_t* i8_row(int64_t e, int64_t r) const { return static_cast<const int8_t*>(w.q) + (e * rows + r) * cols; }
  float i8_scale(int64_t e, int64_t r) const { return w.scale[e * rows + r]; }
  const uint8_t* i4_row(int64_t e, int64_t r) const {
    return static_cast<const uint8_t*>(w.q) + (e * rows + r) * (cols >> 1);
  }
  const float* i4_scale(int64_t e, int64_t r) const { return w.scale + (e * rows + r) * groups; }
};

// RAWINT4 on int8 activations: the activations of pairs [p0, p0 + M), x (gate/up) or h (down), as
// dot_i4_block reads them (the int8 rows, their side data) and their scales. Set up once per work
// item, not per weight row.
template <int M>
struct I4Pairs {
  const int8_t* x[M];
  const int32_t* side[M];
  float qs[M];
  I4Pairs(const Plan& pl, int64_t p0, bool down) {
    for (int m = 0; m < M; ++m) {
      x[m] = down ? pl.hq(p0 + m) : pl.xq(p0 + m);
      side[m] = down ? pl.hi(p0 + m) : pl.xi(p0 + m);
      qs[m] = (down ? pl.hs() : pl.xs())[p0 + m];
    }
  }
};

// h of pairs [p0, p0 + M) for gate/up rows [r0, r1) of expert e: both projections of a row in one
// pass (dot.h), groups of G elements. The row loop holds the dot inlined, its pointers stepping row
// by row: a call, the group-size dispatch and the pairs' pointers per row took a fifth of a
// one-token forward.
template <int M, int G>
void gate_up_i4(const Plan& pl, const Proj& gate, const Proj& up, int64_t e, int64_t p0, int64_t r0, int64_t r1) {
  const I4Pairs<M> a(pl, p0, false);
  alignas(64) float g[M][kItemRowsMax], u[M][kItemRowsMax];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* w[2] = {gate.i4_row(e, r), up.i4_row(e, r)};
    const float* s[2] = {gate.i4_scale(e, r), up.i4_scale(e, r)};
    float gu[2 * M];
    dot_i4_block<2, M, G>(w, s, a.x, a.side, gate.cols, gu);
    for (int m = 0; m < M; ++m) {
      g[m][r - r0] = gu[m] * a.qs[m];
      u[m][r - r0] = gu[M + m] * a.qs[m];
      pl.gate_up_terms(e, p0 + m, r, g[m][r - r0], u[m][r - r0]);
    }
  }
  for (int m = 0; m < M; ++m) pl.finish_h(p0 + m, r0, r1 - r0, g[m], u[m]);
}

// out of pairs [p0, p0 + M) for down rows [r0, r1) of expert e, two rows per pass.
template <int M, int G>
void down_i4(const Plan& pl, const Proj& down, int64_t e, int64_t p0, int64_t r0, int64_t r1) {
  const I4Pairs<M> a(pl, p0, true);
  for (int64_t r = r0; r < r1; r += 2) {
    const uint8_t* w[2] = {down.i4_row(e, r), down.i4_row(e, r + 1)};
    const float* s[2] = {down.i4_scale(e, r), down.i4_scale(e, r + 1)};
    float d[2 * M];
    dot_i4_block<2, M, G>(w, s, a.x, a.side, down.cols, d);
    for (int i = 0; i < 2; ++i)
      for (int m = 0; m < M; ++m) pl.out(p0 + m)[r + i] = pl.finish_down(e, p0 + m, r + i, d[i * M + m] * a.qs[m]);
  }
}

// f(std::integral_constant<int, G>{}) for the RAWINT4 group size g (32, 64 or 128).
template <typename F>
void with_group(int g, F&& f) {
  switch (g) {
    case 32:
      return f(std::integral_constant<int, 32>{});
    case 64:
      return f(std::integral_constant<int, 64>{});
    default:
      return f(std::integral_constant<int, 128>{});
  }
}

// INT8 (without AMX, or for fewer pairs than an AMX tile): the same blocking, exact int32 dots.
// Two weight rows w[0], w[1] against M pairs, out[i * M + m]; one or two pairs take the rows one at a
// time (two interleaved row streams measured slower at decode: a lone pair; two pairs 4-9% at 4-8
// tokens, in-process A/B on avx2 and avx512_bf16).
template <int M>
void i8_rows2(const int8_t* const* w, const int8_t* const* x, const int32_t* xsum, int64_t n, int32_t* out) {
  if (M <= 2) {
    dot_i8_block<1, M>(w, x, xsum, n, out);
    dot_i8_block<1, M>(w + 1, x, xsum, n, out + M);
  } else {
    dot_i8_block<2, M>(w, x, xsum, n, out);
  }
}

template <int M>
void gate_up_i8(const Plan& pl, const Proj& gate, const Proj& up, int64_t e, int64_t p0, int64_t r0, int64_t r1) {
  const int8_t* x[M];
  for (int m = 0; m < M; ++m) x[m] = pl.xq(p0 + m);
  alignas(64) float g[M][kItemRowsMax], u[M][kItemRowsMax];
  for (int64_t r = r0; r < r1; ++r) {
    const int8_t* w[2] = {gate.i8_row(e, r), up.i8_row(e, r)};
    int32_t gu[2 * M];
    i8_rows2<M>(w, x, pl.xsum() + p0, pl.H, gu);
    const float gs = gate.i8_scale(e, r), us = up.i8_scale(e, r);
    for (int m = 0; m < M; ++m) {
      const float xs = pl.xs()[p0 + m];
      g[m][r - r0] = static_cast<float>(gu[m]) * xs * gs;
      u[m][r - r0] = static_cast<float>(gu[M + m]) * xs * us;
      pl.gate_up_terms(e, p0 + m, r, g[m][r - r0], u[m][r - r0]);
    }
  }
  for (int m = 0; m < M; ++m) pl.finish_h(p0 + m, r0, r1 - r0, g[m], u[m]);
}

template <int M>
void down_i8(const Plan& pl, const Proj& down, int64_t e, int64_t p0, int64_t r0, int64_t r1) {
  const int8_t* x[M];
  for (int m = 0; m < M; ++m) x[m] = pl.hq(p0 + m);
  for (int64_t r = r0; r < r1; r += 2) {
    const int8_t* w[2] = {down.i8_row(e, r), down.i8_row(e, r + 1)};
    int32_t d[2 * M];
    i8_rows2<M>(w, x, pl.hsum() + p0, pl.I, d);
    for (int i = 0; i < 2; ++i)
      for (int m = 0; m < M; ++m)
        pl.out(p0 + m)[r + i] = pl.finish_down(
            e, p0 + m, r + i, static_cast<float>(d[i * M + m]) * pl.hs()[p0 + m] * down.i8_scale(e, r + i));
  }
}

// Pairs [b, end) in blocks of 4, then the rest: f(M, p0) with M a compile-time count (register-blocked
// over pairs: the loaded weights serve every pair of the block; 4 measured best of 2, 3, 4 and 6 on
// AVX2). A rest of 3 is one block, where 2 + 1 read the rows twice (and in RAWINT4 unpacked them
// twice): outputs bit-identical (a pair's sums do not depend on its block). In-process A/B on the Zen 4
// host (one and two threads): RAWINT4 (avx512_bf16, avx2) 0.93-0.97 of the time at 16 tokens, 0.90-1.01
// at 8, 64 and 256; INT8 together with the blocked form's far prefetch on AMD (dot.h, i8_prefetch).
template <typename F>
void pair_blocks(int64_t b, int64_t end, F&& f) {
  int64_t p = b;
  for (; p + 4 <= end; p += 4) f(std::integral_constant<int, 4>{}, p);
  if (end - p == 3) return f(std::integral_constant<int, 3>{}, p);
  for (; p + 2 <= end; p += 2) f(std::integral_constant<int, 2>{}, p);
  for (; p < end; ++p) f(std::integral_constant<int, 1>{}, p);
}

void gate_up_all(const Plan& pl, const Proj& gate, const Proj& up, int64_t e, int64_t b, int64_t end, int64_t r0,
                 int64_t r1) {
  if (gate.wfmt == KT_RAWINT4)
    return with_group(gate.g, [&](auto G) {
      pair_blocks(b, end, [&](auto M, int64_t p) {
        gate_up_i4<decltype(M)::value, decltype(G)::value>(pl, gate, up, e, p, r0, r1);
      });
    });
  pair_blocks(b, end, [&](auto M, int64_t p) { gate_up_i8<decltype(M)::value>(pl, gate, up, e, p, r0, r1); });
}
void down_all(const Plan& pl, const Proj& down, int64_t e, int64_t b, int64_t end, int64_t r0, int64_t r1) {
  if (down.wfmt == KT_RAWINT4)
    return with_group(down.g, [&](auto G) {
      pair_blocks(b, end, [&](auto M, int64_t p) {
        down_i4<decltype(M)::value, decltype(G)::value>(pl, down, e, p, r0, r1);
      });
    });
  pair_blocks(b, end, [&](auto M, int64_t p) { down_i8<decltype(M)::value>(pl, down, e, p, r0, r1); });
}

// Pair p's int8 row q of v, its scale qs[p], and what this variant's dot reads beside it: RAWINT4's
// order and side data (qg), INT8's sum (qsum[p]).
void prepare(const Plan& pl, int64_t p, const float* v, int64_t n, int8_t* q, float* qs, int32_t* qg, int32_t* qsum) {
  qs[p] = quantize_i8(v, n, q);
  if (pl.int_groups) {
    i4_prepare(q, n, pl.a.group_size, qg);
  } else {
    int32_t sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += q[i];
    qsum[p] = sum;
  }
}

// Pair q's activations from pair p's, which prepare made (both pairs of one token: the same x).
void copy_prepared_x(const Plan& pl, int64_t p, int64_t q) {
  std::memcpy(pl.xq(q), pl.xq(p), static_cast<size_t>(pl.H));
  pl.xs()[q] = pl.xs()[p];
  if (pl.int_groups)
    std::memcpy(pl.xi(q), pl.xi(p), static_cast<size_t>(i4_side_len(pl.H, pl.a.group_size)) * 4);
  else
    pl.xsum()[q] = pl.xsum()[p];
}

// The token tiles of every AMX expert, from x (gate/up: down = false) or h, once per call.
void pack_amx(const Plan& pl, bool down, int threads) {
  const int64_t K = down ? pl.I : pl.H;
  parallel_for(pl.ntiles(), threads, [&](int64_t i, int) {
    const int64_t e = pl.amx_tiles[i].first, t = pl.amx_tiles[i].second;
    const int64_t p0 = pl.r.expert_begin[e] + 16 * t, rows = std::min<int64_t>(16, pl.r.expert_begin[e + 1] - p0);
    const int8_t* x = down ? pl.hq(p0) : pl.xq(p0);
    int8_t* tile = (down ? pl.hp(e) : pl.xp(e)) + t * 16 * K;
    amx_pack_tokens(x, static_cast<int64_t>(down ? pl.ldhq : pl.ldx), rows, K, tile);
  });
}

#if defined(KT_ISA_AMX_TILE) && defined(KT_ISA_AMX_INT8)
// The activation scales of pairs [p0, p0 + count), count <= 16, zero beyond.
inline __m512 load_scales(const float* s, int64_t p0, int64_t count) {
  alignas(64) float v[16] = {};
  std::memcpy(v, s + p0, static_cast<size_t>(count) * 4);
  return _mm512_load_ps(v);
}

// The epilogues work on one token tile at a time: C holds a weight row's 16 pairs side by side, so
// the scaling (and, at inference, silu) run 16 pairs to a vector; a [row][pair] block of floats is then
// stored pair by pair (each pair's outputs one contiguous run).
// out[n][j] = C[n][i0 + j] * qs[j] * rs[n] for 16 rows n of C (ldc int32 apart): the pairs' activation
// scales qs and each row's weight scale rs.
inline void scale_tile(const int32_t* c, int64_t ldc, int64_t i0, __m512 qs, const float* rs, float (*out)[16]) {
  for (int64_t n = 0; n < 16; ++n) {
    const __m512 v = _mm512_cvtepi32_ps(_mm512_loadu_si512(c + n * ldc + i0));
    _mm512_store_ps(out[n], _mm512_mul_ps(_mm512_mul_ps(v, qs), _mm512_set1_ps(rs[n])));
  }
}

// out[n][j] = Plan::lora_b(out[n][j], B + n * rank, la(p0 + j) + off) for `rows` rows n and the tile's
// `count` pairs j, 16 pairs to a vector: the same fma steps in the same order as the scalar form.
inline void lora_b_tile(const Plan& pl, const float* B, int64_t p0, int64_t count, int off, int rows,
                        float (*out)[16]) {
  const int rank = pl.rank;
  alignas(64) float sum[32][16] = {}, lk16[16] = {};
  for (int k = 0; k < rank; ++k) {
    for (int64_t j = 0; j < count; ++j) lk16[j] = pl.la(p0 + j)[off + k];
    const __m512 lk = _mm512_load_ps(lk16);  // la(p0 + j)[off + k], zero past count
    for (int n = 0; n < rows; ++n)
      _mm512_store_ps(sum[n], _mm512_fmadd_ps(_mm512_set1_ps(B[n * rank + k]), lk, _mm512_load_ps(sum[n])));
  }
  const __m512 ls = _mm512_set1_ps(pl.lscale);
  for (int n = 0; n < rows; ++n)
    _mm512_store_ps(out[n], _mm512_fmadd_ps(ls, _mm512_load_ps(sum[n]), _mm512_load_ps(out[n])));
}

// Gate/up rows [r0, r0 + 16) of expert e for all its pairs, through AMX.
void gate_up_amx(const Plan& pl, int64_t e, int64_t r0, int thread) {
  const auto& a = pl.a;
  const int64_t b = pl.r.expert_begin[e], m = pl.r.expert_begin[e + 1] - b, H = pl.H;
  const int64_t tiles = (m + 15) / 16, ldc = 16 * tiles;
  const Plan::AmxWorkspace ws = pl.amx(thread);
  const int8_t* gw = static_cast<const int8_t*>(a.gate.q) + (e * pl.I + r0) * H;
  const int8_t* uw = static_cast<const int8_t*>(a.up.q) + (e * pl.I + r0) * H;
  // The next 16 rows (this expert's or the next one's): the item after this one, which a thread's run of
  // neighbouring items usually holds; none past the last expert's last rows.
  const bool last = e + 1 == a.experts && r0 + 16 == pl.I;
  amx_gemm_i8_w32(gw, uw, H, pl.xp(e), tiles, ws.c0, ws.c1, last ? nullptr : gw + 16 * H, uw + 16 * H);
  const float* gs = a.gate.scale + e * pl.I + r0;
  const float* us = a.up.scale + e * pl.I + r0;
  // h = silu(g) * u, 16 pairs to a vector, as finish_h: in training after the LoRA terms
  // (lora_b_tile), g and u kept for the backward.
  alignas(64) float gb[16][16], ub[16][16], hb[16][16];  // [row][pair of the tile]
  for (int64_t i0 = 0; i0 < m; i0 += 16) {
    const int64_t count = std::min<int64_t>(16, m - i0);
    const __m512 xs = load_scales(pl.xs(), b + i0, count);
    scale_tile(ws.c0, ldc, i0, xs, gs, gb);
    scale_tile(ws.c1, ldc, i0, xs, us, ub);
    if (pl.rank > 0) {
      lora_b_tile(pl, a.lora.gate_b + (e * pl.I + r0) * pl.rank, b + i0, count, 0, 16, gb);
      lora_b_tile(pl, a.lora.up_b + (e * pl.I + r0) * pl.rank, b + i0, count, pl.rank, 16, ub);
    }
    for (int64_t n = 0; n < 16; ++n)
      _mm512_store_ps(hb[n], _mm512_mul_ps(silu_v(_mm512_load_ps(gb[n])), _mm512_load_ps(ub[n])));
    for (int64_t j = 0; j < count; ++j) {
      float* h = pl.h(b + i0 + j) + r0;
      for (int64_t n = 0; n < 16; ++n) h[n] = hb[n][j];
      if (a.saved.gate) {
        float* sg = a.saved.gate + pl.orig[b + i0 + j] * pl.I + r0;
        float* su = a.saved.up + pl.orig[b + i0 + j] * pl.I + r0;
        for (int64_t n = 0; n < 16; ++n) {
          sg[n] = gb[n][j];
          su[n] = ub[n][j];
        }
      }
    }
  }
}

// Down rows [r0, r0 + rows) of expert e (rows % 32 == 0) for all its pairs, through AMX.
void down_amx(const Plan& pl, int64_t e, int64_t r0, int64_t rows, int thread) {
  const auto& a = pl.a;
  const int64_t b = pl.r.expert_begin[e], m = pl.r.expert_begin[e + 1] - b, I = pl.I;
  const int64_t tiles = (m + 15) / 16, ldc = 16 * tiles;
  const Plan::AmxWorkspace ws = pl.amx(thread);
  alignas(64) float ob[32][16];  // [row][pair of the tile]
  for (int64_t rr = r0; rr < r0 + rows; rr += 32) {
    const int8_t* dw = static_cast<const int8_t*>(a.down.q) + (e * pl.H + rr) * I;
    const bool last = e + 1 == a.experts && rr + 32 == pl.H;  // else the next 32 rows, as in gate_up_amx
    amx_gemm_i8_w32(dw, dw + 16 * I, I, pl.hp(e), tiles, ws.c0, ws.c1, last ? nullptr : dw + 32 * I, dw + 48 * I);
    const float* ds = a.down.scale + e * pl.H + rr;
    for (int64_t i0 = 0; i0 < m; i0 += 16) {
      const int64_t count = std::min<int64_t>(16, m - i0);
      const __m512 hs = load_scales(pl.hs(), b + i0, count);
      scale_tile(ws.c0, ldc, i0, hs, ds, ob);
      scale_tile(ws.c1, ldc, i0, hs, ds + 16, ob + 16);
      if (pl.rank > 0)  // finish_down, 16 pairs to a vector
        lora_b_tile(pl, a.lora.down_b + (e * pl.H + rr) * pl.rank, b + i0, count, 2 * pl.rank, 32, ob);
      for (int64_t j = 0; j < count; ++j) {
        float* o = pl.out(b + i0 + j) + rr;
        for (int64_t n = 0; n < 32; ++n) o[n] = ob[n][j];
      }
    }
  }
}
#else
// Never called: amx_available() is false without AMX-INT8, so no expert takes the AMX path.
void gate_up_amx(const Plan&, int64_t, int64_t, int) {}
void down_amx(const Plan&, int64_t, int64_t, int64_t, int) {}
#endif

int moe_forward(const kt_moe_args* args, char* err, size_t err_len) {
  const kt_moe_args& a = *args;
  if (!validate_args(a, err, err_len)) return 1;
  if (a.tokens == 0) return 0;
  const int threads = a.num_threads < 1 ? 1 : a.num_threads;
  Plan pl(a);
  if (!build_routing(a, &pl.r, err, err_len)) return 1;
  pl.layout(threads);
  if (!pl.s.allocate()) {
    std::snprintf(err, err_len, "out of memory allocating MoE scratch buffers");
    return 1;
  }
  const int gs = a.group_size > 0 ? a.group_size : 1;
  const Proj gate{a.gate, pl.I, pl.H, a.wfmt, a.group_size, pl.H / gs};
  const Proj up{a.up, pl.I, pl.H, a.wfmt, a.group_size, pl.H / gs};
  const Proj down{a.down, pl.H, pl.I, a.wfmt, a.group_size, pl.I / gs};
  const bool training = pl.rank > 0 || a.saved.gate != nullptr;
  if (training) {
    pl.expert_of.resize(static_cast<size_t>(pl.P));
    pl.orig.resize(static_cast<size_t>(pl.P));
    for (int64_t e : pl.r.active)
      for (int64_t p = pl.r.expert_begin[e]; p < pl.r.expert_begin[e + 1]; ++p) pl.expert_of[p] = e;
    for (int64_t i = 0; i < pl.P; ++i) pl.orig[pl.r.pair_of[i]] = i;
  }

  // 1. Activations per sorted pair: int8 + scale + what the dot reads beside them (prepare), made once
  // per token and copied to its other pairs (the same x each). A token with a NaN or an infinity is
  // marked: quantization would turn it into finite numbers (silent corruption in a training loop), so
  // its output row becomes NaN, as a float matmul would make it.
  std::vector<uint8_t> nonfinite(static_cast<size_t>(a.tokens), 0);  // per token
  parallel_for(a.tokens, threads, [&](int64_t t, int) {
    const int64_t* pairs = pl.r.pair_of.data() + t * a.topk;
    const int64_t p = pairs[0];
    float* row = pl.out(p);  // scratch row, overwritten in step 3
    if (a.x_dtype == KT_BF16) {
      const uint16_t* x = static_cast<const uint16_t*>(a.x) + t * pl.H;
      for (int64_t i = 0; i < pl.H; ++i) row[i] = bf16_to_f32(x[i]);
    } else {
      std::memcpy(row, static_cast<const float*>(a.x) + t * pl.H, static_cast<size_t>(pl.H) * 4);
    }
    bool finite = true;
    for (int64_t i = 0; i < pl.H; ++i) finite &= std::isfinite(row[i]);
    nonfinite[static_cast<size_t>(t)] = finite ? 0 : 1;
    prepare(pl, p, row, pl.H, pl.xq(p), pl.xs(), pl.int_groups ? pl.xi(p) : nullptr, pl.xsum());
    for (int64_t k = 0; k < a.topk; ++k) {
      const int64_t q = pairs[k];
      if (pl.rank > 0) {
        const int64_t e = pl.expert_of[q];
        lora_a(a.lora.gate_a + e * pl.rank * pl.H, row, pl.H, pl.rank, pl.la(q));
        lora_a(a.lora.up_a + e * pl.rank * pl.H, row, pl.H, pl.rank, pl.la(q) + pl.rank);
      }
      if (k > 0) copy_prepared_x(pl, p, q);
    }
  });

  // Work items: (active expert, row block).
  const int64_t rows_a = rows_per_item(a.wfmt, kRowsA), rows_c = rows_per_item(a.wfmt, kRowsC);
  std::vector<std::pair<int64_t, int64_t>> items;
  for (int64_t e : pl.r.active)
    for (int64_t r0 = 0; r0 < pl.I; r0 += rows_a) items.emplace_back(e, r0);

  if (pl.ntiles() > 0) pack_amx(pl, false, threads);

  // 2. h = silu(gate x) * (up x) per pair.
  parallel_for(static_cast<int64_t>(items.size()), threads, [&](int64_t it, int tid) {
    const int64_t e = items[it].first, r0 = items[it].second;
    const int64_t b = pl.r.expert_begin[e], end = pl.r.expert_begin[e + 1];
    if (pl.amx_expert(e)) return gate_up_amx(pl, e, r0, tid);
    gate_up_all(pl, gate, up, e, b, end, r0, r0 + rows_a);
  });
  parallel_for(pl.P, threads, [&](int64_t p, int) {
    if (pl.rank > 0)
      lora_a(a.lora.down_a + pl.expert_of[p] * pl.rank * pl.I, pl.h(p), pl.I, pl.rank, pl.la(p) + 2 * pl.rank);
    prepare(pl, p, pl.h(p), pl.I, pl.hq(p), pl.hs(), pl.int_groups ? pl.hi(p) : nullptr, pl.hsum());
  });

  if (pl.ntiles() > 0) pack_amx(pl, true, threads);

  // 3. down projection per pair.
  items.clear();
  for (int64_t e : pl.r.active)
    for (int64_t r0 = 0; r0 < pl.H; r0 += rows_c) items.emplace_back(e, r0);
  parallel_for(static_cast<int64_t>(items.size()), threads, [&](int64_t it, int tid) {
    const int64_t e = items[it].first, r0 = items[it].second;
    const int64_t b = pl.r.expert_begin[e], end = pl.r.expert_begin[e + 1];
    if (pl.amx_expert(e)) return down_amx(pl, e, r0, kRowsC, tid);
    down_all(pl, down, e, b, end, r0, r0 + rows_c);
  });

  // The LoRA projections kept for the backward; a token with NaN or infinity keeps NaN rows.
  if (a.saved.gate) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const int64_t nl = 3 * static_cast<int64_t>(pl.rank);
    parallel_for(pl.P, threads, [&](int64_t p, int) {
      const int64_t row = pl.orig[p];
      if (nl > 0) std::memcpy(a.saved.lora + row * nl, pl.la(p), static_cast<size_t>(nl) * 4);
      if (!nonfinite[static_cast<size_t>(pl.r.pair_token[p])]) return;
      std::fill(a.saved.gate + row * pl.I, a.saved.gate + (row + 1) * pl.I, nan);
      std::fill(a.saved.up + row * pl.I, a.saved.up + (row + 1) * pl.I, nan);
      if (nl > 0) std::fill(a.saved.lora + row * nl, a.saved.lora + (row + 1) * nl, nan);
    });
  }

  // 4. y[t] = sum_k w[t,k] * out[pair(t,k)]
  parallel_for(a.tokens, threads, [&](int64_t t, int) {
    float* acc = nullptr;
    alignas(64) float local[1024];
    std::vector<float> big;
    if (pl.H <= 1024) {
      acc = local;
    } else {
      big.resize(pl.H);
      acc = big.data();
    }
    std::memset(acc, 0, static_cast<size_t>(pl.H) * 4);
    const bool poisoned = nonfinite[static_cast<size_t>(t)] != 0;
    for (int64_t k = 0; k < a.topk && !poisoned; ++k) {
      const float wk = a.weights[t * a.topk + k];
      const float* o = pl.out(pl.r.pair_of[t * a.topk + k]);
      for (int64_t i = 0; i < pl.H; ++i) acc[i] += wk * o[i];
    }
    if (poisoned) std::fill(acc, acc + pl.H, std::numeric_limits<float>::quiet_NaN());
    if (a.x_dtype == KT_BF16) {
      uint16_t* y = static_cast<uint16_t*>(a.y) + t * pl.H;
      for (int64_t i = 0; i < pl.H; ++i) y[i] = f32_to_bf16(acc[i]);
    } else {
      std::memcpy(static_cast<float*>(a.y) + t * pl.H, acc, static_cast<size_t>(pl.H) * 4);
    }
  });
  return 0;
}

const kt_cpu_ops kOps = {KT_CPU_ABI_VERSION, KT_VARIANT_NAME, &moe_forward, &moe_backward};

}  // namespace
}  // namespace kt

extern "C" __attribute__((visibility("default"))) const kt_cpu_ops* kt_cpu_variant_ops(void) { return &kt::kOps; }
