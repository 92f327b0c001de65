#ifndef KT_AMX_H
#define KT_AMX_H
#include <cstdint>

namespace kt {
// True in the amx variant, where amx_gemm_i8_rows16 is real.
bool amx_available();
// C[m][n] = sum_k A[m][k] * W[n][k] for m < M, n < 16; int8 x int8 -> int32.
// A rows have stride lda; W is 16 rows of K int8 (stride K); K % 64 == 0.
// pack_b needs 16*K bytes, pad_a 16*K bytes, C has M rows of 16 int32.
void amx_gemm_i8_rows16(const int8_t* A, int64_t lda, int64_t M, const int8_t* W, int64_t K, int32_t* C,
                        int8_t* pack_b, int8_t* pad_a);
// True in the amx variant, where amx_gemm_bf16_cols64 is real.
bool amx_bf16_available();
// C[m][0, 64) += sum_k A[m][k] * W[k][0, 64) for m < 16; bf16 x bf16 -> fp32 (the backward's products
// with a dequantized weight block). A: 16 rows of K bf16, `lda` bytes apart. Wp: W as K/2 rows of 64
// bf16 pairs (W[2k][j], W[2k+1][j]), 256 bytes a row. C: 16 rows of 64 fp32, 256 bytes apart. K % 32 == 0.
void amx_gemm_bf16_cols64(const uint16_t* A, int64_t lda, const uint32_t* Wp, int64_t K, float* C);
}  // namespace kt
#endif
