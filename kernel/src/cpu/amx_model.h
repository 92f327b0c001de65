// A software model of the AMX tile instructions amx.cpp uses, for the test-only emulated variants
// (KT_EMULATE, see isa.h); SIMDe has no AMX. Semantics from Intel's SDM pseudo-code:
//   _tile_loadconfig(cfg)   palette 1: per tile, rows and bytes per row (colsb)
//   _tile_zero(t)           every byte of tile t = 0
//   _tile_loadd(t, p, s)    rows[t] rows of colsb[t] bytes from p, rows s bytes apart
//   _tile_stored(t, p, s)   the reverse
//   _tile_dpbssd(c, a, b)   c[m][n] += sum over k, j<4 of int8 a[m][4k+j] * int8 b[k][4n+j] (int32 c)
//   _tile_dpbf16ps(c, a, b) c[m][n] += sum over k, j<2 of bf16 a[m][2k+j] * bf16 b[k][2n+j] (fp32 c; the
//                           real instruction also treats denormal inputs and results as zero)
//   _tile_release()         back to the init state
// Tiles are per thread, as real tile registers are. Never compiled into a shipped library.
#ifndef KT_AMX_MODEL_H
#define KT_AMX_MODEL_H

#include <cstdint>
#include <cstring>

namespace kt_amx_model {

struct State {
  uint8_t rows[8] = {};
  uint16_t colsb[8] = {};
  alignas(64) uint8_t tile[8][16][64] = {};
};

inline State& state() {
  thread_local State s;
  return s;
}

inline void loadconfig(const void* cfg) {
  const auto* c = static_cast<const uint8_t*>(cfg);
  State& s = state();
  for (int t = 0; t < 8; ++t) {
    std::memcpy(&s.colsb[t], c + 16 + 2 * t, 2);
    s.rows[t] = c[48 + t];
  }
}

inline void zero(int t) { std::memset(state().tile[t], 0, sizeof state().tile[t]); }

inline void loadd(int t, const void* p, int64_t stride) {
  State& s = state();
  for (int r = 0; r < s.rows[t]; ++r) std::memcpy(s.tile[t][r], static_cast<const uint8_t*>(p) + r * stride, s.colsb[t]);
}

inline void stored(int t, void* p, int64_t stride) {
  State& s = state();
  for (int r = 0; r < s.rows[t]; ++r) std::memcpy(static_cast<uint8_t*>(p) + r * stride, s.tile[t][r], s.colsb[t]);
}

inline void dpbssd(int c, int a, int b) {
  State& s = state();
  const int m_rows = s.rows[c], n_cols = s.colsb[c] / 4, k_words = s.colsb[a] / 4;
  for (int m = 0; m < m_rows; ++m)
    for (int n = 0; n < n_cols; ++n) {
      int32_t acc;
      std::memcpy(&acc, &s.tile[c][m][4 * n], 4);
      for (int k = 0; k < k_words; ++k)
        for (int j = 0; j < 4; ++j)
          acc += static_cast<int32_t>(static_cast<int8_t>(s.tile[a][m][4 * k + j])) *
                 static_cast<int32_t>(static_cast<int8_t>(s.tile[b][k][4 * n + j]));
      std::memcpy(&s.tile[c][m][4 * n], &acc, 4);
    }
}

inline float bf16(const uint8_t* p) {
  uint32_t u = static_cast<uint32_t>(p[0] | (p[1] << 8)) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline void dpbf16ps(int c, int a, int b) {
  State& s = state();
  const int m_rows = s.rows[c], n_cols = s.colsb[c] / 4, k_words = s.colsb[a] / 4;
  for (int m = 0; m < m_rows; ++m)
    for (int n = 0; n < n_cols; ++n) {
      float acc;
      std::memcpy(&acc, &s.tile[c][m][4 * n], 4);
      for (int k = 0; k < k_words; ++k)
        for (int j = 0; j < 2; ++j) acc += bf16(&s.tile[a][m][4 * k + 2 * j]) * bf16(&s.tile[b][k][4 * n + 2 * j]);
      std::memcpy(&s.tile[c][m][4 * n], &acc, 4);
    }
}

inline void release() { state() = State{}; }

}  // namespace kt_amx_model

#define _tile_loadconfig(cfg) kt_amx_model::loadconfig(cfg)
#define _tile_zero(t) kt_amx_model::zero(t)
#define _tile_loadd(t, p, s) kt_amx_model::loadd((t), (p), (s))
#define _tile_stored(t, p, s) kt_amx_model::stored((t), (p), (s))
#define _tile_dpbssd(c, a, b) kt_amx_model::dpbssd((c), (a), (b))
#define _tile_dpbf16ps(c, a, b) kt_amx_model::dpbf16ps((c), (a), (b))
#define _tile_release() kt_amx_model::release()

#endif  // KT_AMX_MODEL_H
