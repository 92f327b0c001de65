// C ABI between the baseline `_core` extension and the per-ISA variant libraries.
//
// `_core` is compiled for the x86-64 baseline; it dlopen()s exactly one variant
// library (libkt_cpu_<name>.so) *after* CPUID/XGETBV said the CPU and OS can run
// it, and calls through this table. A variant library exports one symbol,
// kt_cpu_variant_ops(); nothing in it runs before that dlopen.
#ifndef KT_CPU_API_H
#define KT_CPU_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KT_CPU_ABI_VERSION 1u

enum kt_dtype { KT_F32 = 0, KT_BF16 = 1 };
enum kt_wfmt { KT_INT8 = 0, KT_RAWINT4 = 1 };

// One quantized projection for all experts.
//   INT8:    q = int8 [E, rows, cols], scale = f32 [E, rows]          (per output row)
//   RAWINT4: q = uint8 [E, rows, cols/2], scale = f32 [E, rows, cols/group]
//            Within each 32-element block, byte j (0..15) holds element j in its
//            low nibble and element j+16 in its high nibble; nibbles are signed
//            two's complement (-8..7).
typedef struct kt_qweight {
  const void* q;
  const float* scale;
} kt_qweight;

typedef struct kt_moe_args {
  int64_t tokens, hidden, inter, experts, topk;
  int32_t x_dtype;      // enum kt_dtype, also the dtype of y
  int32_t wfmt;         // enum kt_wfmt
  int32_t group_size;   // RAWINT4 only: 32, 64 or 128
  int32_t num_threads;  // >= 1
  const void* x;        // [tokens, hidden]
  const int64_t* ids;   // [tokens, topk], each in [0, experts)
  const float* weights; // [tokens, topk]
  kt_qweight gate, up;  // rows = inter, cols = hidden
  kt_qweight down;      // rows = hidden, cols = inter
  void* y;              // [tokens, hidden], written (not accumulated)
} kt_moe_args;

typedef struct kt_cpu_ops {
  uint32_t abi_version;
  const char* name;
  // Returns 0 on success; otherwise writes a message into err (NUL-terminated).
  int (*moe_forward)(const kt_moe_args* args, char* err, size_t err_len);
} kt_cpu_ops;

typedef const kt_cpu_ops* (*kt_cpu_variant_ops_fn)(void);

#ifdef __cplusplus
}
#endif

#endif  // KT_CPU_API_H
