// AMX tile GEMM for INT8 prefill. Compiled in every variant; real only where
// the variant's flags enable AMX (the amx variant), a stub elsewhere.
#include "amx.h"

#include <cstring>

#include "isa.h"

#if defined(KT_ISA_AMX_TILE) && defined(KT_ISA_AMX_INT8)

namespace kt {

namespace {
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
}  // namespace

bool amx_available() { return true; }

void amx_gemm_i8_rows16(const int8_t* A, int64_t lda, int64_t M, const int8_t* W, int64_t K, int32_t* C,
                        int8_t* pack_b, int8_t* pad_a) {
  // tmm0: C (16 x 16 int32), tmm1: A (16 x 64 int8), tmm2: B (16 x 64: K/4 rows, 16 cols x 4).
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 3; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  // VNNI layout for B: chunk c, row r, col n*4+j  <-  W[n][64c + 4r + j].
  for (int64_t c = 0; c < K / 64; ++c)
    for (int r = 0; r < 16; ++r)
      for (int n = 0; n < 16; ++n)
        std::memcpy(pack_b + c * 1024 + r * 64 + n * 4, W + n * K + c * 64 + r * 4, 4);
  for (int64_t m0 = 0; m0 < M; m0 += 16) {
    const int64_t rows = M - m0 < 16 ? M - m0 : 16;
    const int8_t* a = A + m0 * lda;
    int64_t stride = lda;
    if (rows < 16) {  // pad the last tile of tokens with zero rows
      std::memset(pad_a, 0, static_cast<size_t>(16 * K));
      for (int64_t r = 0; r < rows; ++r) std::memcpy(pad_a + r * K, A + (m0 + r) * lda, static_cast<size_t>(K));
      a = pad_a;
      stride = K;
    }
    _tile_zero(0);
    for (int64_t c = 0; c < K / 64; ++c) {
      _tile_loadd(1, a + c * 64, stride);
      _tile_loadd(2, pack_b + c * 1024, 64);
      _tile_dpbssd(0, 1, 2);
    }
    if (rows == 16) {
      _tile_stored(0, C + m0 * 16, 64);
    } else {
      alignas(64) int32_t tmp[16 * 16];
      _tile_stored(0, tmp, 64);
      std::memcpy(C + m0 * 16, tmp, static_cast<size_t>(rows) * 16 * sizeof(int32_t));
    }
  }
  _tile_release();
}

}  // namespace kt

#else

namespace kt {
bool amx_available() { return false; }
void amx_gemm_i8_rows16(const int8_t*, int64_t, int64_t, const int8_t*, int64_t, int32_t*, int8_t*, int8_t*) {}
}  // namespace kt

#endif
