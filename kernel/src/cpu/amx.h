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
}  // namespace kt
#endif
