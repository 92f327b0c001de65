// AMX tile GEMMs: INT8 for the prefill forward, BF16 for the backward's products with a dequantized
// weight block. Compiled in every variant; real only where the variant's flags enable AMX (the amx
// variant), stubs elsewhere (amx_pack_tokens is plain C++ everywhere).
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

// One pass over K for the token tile at x0 and, when Two, the one after it: tmm0/tmm1 = W0/W1 x
// tokens of the first, tmm2/tmm3 = W0/W1 x tokens of the second (16 x 16 int32 each); tmm4/tmm5: W0/W1,
// 16 rows x 64 int8 of the chunk; tmm6/tmm7: the chunk of each token tile (16 rows of 4 bytes x 16
// tokens). Each tile loaded serves two products. (Tile numbers are immediates: hence the template.)
namespace {
template <bool Two>
void pass_w32(const int8_t* W0, const int8_t* W1, int64_t K, const int8_t* x0, int64_t tile_bytes, int32_t* C0,
              int32_t* C1, int64_t ldc, const int8_t* N0, const int8_t* N1) {
  _tile_zero(0);
  _tile_zero(1);
  if (Two) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t c = 0; c < K / 64; ++c) {
    if (N0)  // the next call's blocks into L2, in address order: 16 of each block's 16 * K / 64 lines a chunk
      for (int j = 0; j < 16; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(N0 + (c * 16 + j) * 64), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(N1 + (c * 16 + j) * 64), _MM_HINT_T1);
      }
    _tile_loadd(4, W0 + c * 64, K);
    _tile_loadd(5, W1 + c * 64, K);
    _tile_loadd(6, x0 + c * 1024, 64);
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 5, 6);
    if (Two) {
      _tile_loadd(7, x0 + tile_bytes + c * 1024, 64);
      _tile_dpbssd(2, 4, 7);
      _tile_dpbssd(3, 5, 7);
    }
  }
  _tile_stored(0, C0, ldc);
  _tile_stored(1, C1, ldc);
  if (Two) {
    _tile_stored(2, C0 + 16, ldc);
    _tile_stored(3, C1 + 16, ldc);
  }
}
}  // namespace

void amx_gemm_i8_w32(const int8_t* W0, const int8_t* W1, int64_t K, const int8_t* Xp, int64_t tiles, int32_t* C0,
                     int32_t* C1, const int8_t* N0, const int8_t* N1) {
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  const int64_t ldc = 16 * tiles * 4, tile_bytes = 16 * K;  // C row stride in bytes; bytes per token tile
  int64_t t = 0;
  for (; t + 2 <= tiles; t += 2)
    pass_w32<true>(W0, W1, K, Xp + t * tile_bytes, tile_bytes, C0 + 16 * t, C1 + 16 * t, ldc, t ? nullptr : N0, N1);
  if (t < tiles)
    pass_w32<false>(W0, W1, K, Xp + t * tile_bytes, tile_bytes, C0 + 16 * t, C1 + 16 * t, ldc, t ? nullptr : N0, N1);
  _tile_release();
}

}  // namespace kt

#else

namespace kt {
bool amx_available() { return false; }
void amx_gemm_i8_w32(const int8_t*, const int8_t*, int64_t, const int8_t*, int64_t, int32_t*, int32_t*, const int8_t*,
                     const int8_t*) {}
}  // namespace kt

#endif

namespace kt {

void amx_pack_tokens(const int8_t* X, int64_t ld, int64_t rows, int64_t K, int8_t* tile) {
  if (rows < 16) std::memset(tile, 0, static_cast<size_t>(16 * K));
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t c = 0; c < K / 64; ++c)
      for (int k = 0; k < 16; ++k) std::memcpy(tile + c * 1024 + k * 64 + n * 4, X + n * ld + c * 64 + k * 4, 4);
}

}  // namespace kt

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
