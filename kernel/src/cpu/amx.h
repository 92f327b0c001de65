#ifndef KT_AMX_H
#define KT_AMX_H
#include <cstdint>

namespace kt {
// True in the amx variant, where amx_gemm_i8_w32 is real.
bool amx_available();
// One token tile: up to 16 rows of K int8 activations (`ld` bytes apart; rows < 16 are padded with
// zeros) in the layout an AMX B tile reads, 16 * K bytes: for each 64-byte chunk c of K, 16 rows of
// 64 bytes, row k holding bytes 4k..4k+3 of the chunk of each token in turn. K % 64 == 0. Plain C++:
// the activations are packed once per call, for every weight row block of their expert.
void amx_pack_tokens(const int8_t* X, int64_t ld, int64_t rows, int64_t K, int8_t* tile);
// C0[r][j] = sum_k W0[r][k] * X[j][k] and C1 the same with W1, for weight rows r < 16 and tokens
// j < 16 * tiles; int8 x int8 -> int32. W0, W1: 16 rows of K int8 each, K bytes apart, read in place
// (the weights are the A tiles: no packing). Xp: `tiles` token tiles (amx_pack_tokens). C0, C1: 16 rows
// of 16 * tiles int32. K % 64 == 0. N0, N1: the 16-row blocks (16 * K contiguous bytes each) that the
// caller's next call reads as W0 and W1, or null: the first pass prefetches them into L2 in address
// order, 1 / (K / 64) of each block per chunk, so that call's tile loads hit L2 rather than wait on 32
// strided row streams (nothing else prefetches: a block's rows are read at L2 latency once it is there).
void amx_gemm_i8_w32(const int8_t* W0, const int8_t* W1, int64_t K, const int8_t* Xp, int64_t tiles, int32_t* C0,
                     int32_t* C1, const int8_t* N0, const int8_t* N1);
// True in the amx variant, where amx_gemm_bf16_cols64 is real.
bool amx_bf16_available();
// C[m][0, 64) += sum_k A[m][k] * W[k][0, 64) for m < 16; bf16 x bf16 -> fp32 (the backward's products
// with a dequantized weight block). A: 16 rows of K bf16, `lda` bytes apart. Wp: W as K/2 rows of 64
// bf16 pairs (W[2k][j], W[2k+1][j]), 256 bytes a row. C: 16 rows of 64 fp32, 256 bytes apart. K % 32 == 0.
void amx_gemm_bf16_cols64(const uint16_t* A, int64_t lda, const uint32_t* Wp, int64_t K, float* C);
}  // namespace kt
#endif
