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

#define KT_CPU_ABI_VERSION 2u

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

// LoRA on every expert's three projections (fine-tuning; rank 0 = none), fp32, row-major:
//   gate/up: A [E, rank, hidden], B [E, inter, rank];  down: A [E, rank, inter], B [E, hidden, rank]
//   gate(x) = Wq x + scale * B (A x)      (scale = alpha / rank)
// The quantized base weights are never written and get no gradient.
typedef struct kt_lora {
  int32_t rank;
  float scale;
  const float *gate_a, *gate_b, *up_a, *up_b, *down_a, *down_b;
} kt_lora;

// What a training forward keeps for the backward, per (token, k) row t * topk + k:
//   gate, up  f32 [tokens * topk, inter]  the projections before the activation (LoRA included)
//   lora      f32 [tokens * topk, 3, rank]  A_gate x, A_up x, A_down h  (rank > 0 only)
// A row of a token whose activations hold NaN or infinity is NaN.
typedef struct kt_saved {
  float *gate, *up, *lora;
} kt_saved;

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
  kt_lora lora;         // rank 0: no LoRA
  kt_saved saved;       // null pointers: nothing saved (inference)
} kt_moe_args;

// The backward of one training forward (same kt_moe_args, whose `saved` it filled). Every
// output is written, not accumulated; a LoRA gradient pointer may be null when rank is 0.
typedef struct kt_moe_grad_args {
  const void* dy;       // [tokens, hidden], dtype x_dtype
  float* dx;            // [tokens, hidden]
  float* dweights;      // [tokens, topk]
  float *d_gate_a, *d_gate_b, *d_up_a, *d_up_b, *d_down_a, *d_down_b;  // shapes of kt_lora's
} kt_moe_grad_args;

typedef struct kt_cpu_ops {
  uint32_t abi_version;
  const char* name;
  // Returns 0 on success; otherwise writes a message into err (NUL-terminated).
  int (*moe_forward)(const kt_moe_args* args, char* err, size_t err_len);
  int (*moe_backward)(const kt_moe_args* args, const kt_moe_grad_args* grad, char* err, size_t err_len);
} kt_cpu_ops;

typedef const kt_cpu_ops* (*kt_cpu_variant_ops_fn)(void);

#ifdef __cplusplus
}
#endif

#endif  // KT_CPU_API_H
