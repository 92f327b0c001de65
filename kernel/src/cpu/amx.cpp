// AMX tile GEMMs: INT8 for the prefill forward, BF16 for the backward's products with a dequantized
// weight block. Compiled in every variant; real only where the variant's flags enable AMX (the amx
// variant), stubs elsewhere.
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

#if defined(KT_ISA_AMX_TILE) && defined(KT_ISA_AMX_BF16)

namespace kt {

bool amx_bf16_available() { return true; }

void amx_gemm_bf16_cols64(const uint16_t* A, int64_t lda, const uint32_t* Wp, int64_t K, float* C) {
  // tmm0-3: C, 16 rows x 16 fp32 each (columns 16c..16c+15); tmm4: A, 16 rows x 32 bf16;
  // tmm5: B, 16 rows (32 values of k as pairs) x 16 columns x 2 bf16.
  struct alignas(64) {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  } cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 6; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  _tile_loadd(0, C, 256);
  _tile_loadd(1, C + 16, 256);
  _tile_loadd(2, C + 32, 256);
  _tile_loadd(3, C + 48, 256);
  const uint8_t* a = reinterpret_cast<const uint8_t*>(A);
  for (int64_t k = 0; k < K; k += 32) {
    _tile_loadd(4, a + 2 * k, lda);
    const uint32_t* b = Wp + (k / 2) * 64;
    _tile_loadd(5, b, 256);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(5, b + 16, 256);
    _tile_dpbf16ps(1, 4, 5);
    _tile_loadd(5, b + 32, 256);
    _tile_dpbf16ps(2, 4, 5);
    _tile_loadd(5, b + 48, 256);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, C, 256);
  _tile_stored(1, C + 16, 256);
  _tile_stored(2, C + 32, 256);
  _tile_stored(3, C + 48, 256);
  _tile_release();
}

}  // namespace kt

#else

namespace kt {
bool amx_bf16_available() { return false; }
void amx_gemm_bf16_cols64(const uint16_t*, int64_t, const uint32_t*, int64_t, float*) {}
}  // namespace kt

#endif
