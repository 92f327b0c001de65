/* One CPU variant of kt_kernel run on its own, with no Python: a tiny INT8 MoE through the variant's
 * kt_cpu_variant_ops() table against a double-precision reference on the same dequantized weights (the check
 * kt-doctor --run makes through Python). verify/glibc_proof.py builds it against glibc 2.28's stubs and runs it
 * in a Debian root of an older glibc than the build host's.
 *
 *   variant_selftest /path/libkt_cpu_<name>.so   -> {"variant": ..., "max_rel_error": ...}, exit 0 (1: off)
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kt_cpu_api.h"

enum { E = 8, H = 256, I = 128, T = 5, K = 2 };
static const double BOUND = 0.03; /* activations are quantized to int8 inside the kernel */

static uint64_t state = 7;
static double uniform(void) { /* xorshift64*, in [0, 1) */
  state ^= state >> 12;
  state ^= state << 25;
  state ^= state >> 27;
  return (double)((state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static int8_t gq[E][I][H], uq[E][I][H], dq[E][H][I];
static float gs[E][I], us[E][I], ds[E][H];
static float x[T][H], w[T][K], y[T][H];
static int64_t ids[T][K];

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s libkt_cpu_<name>.so\n", argv[0]);
    return 2;
  }
  syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA: the AMX variant's tiles */);
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
  kt_cpu_variant_ops_fn fn = (kt_cpu_variant_ops_fn)dlsym(h, "kt_cpu_variant_ops");
  const kt_cpu_ops* ops = fn ? fn() : NULL;
  if (!ops || ops->abi_version != KT_CPU_ABI_VERSION) {
    fprintf(stderr, "%s: no kt_cpu_variant_ops of ABI %u\n", argv[1], KT_CPU_ABI_VERSION);
    return 2;
  }
  for (int e = 0; e < E; e++) {
    for (int r = 0; r < I; r++) {
      gs[e][r] = (float)(0.0005 + 0.0005 * uniform());
      us[e][r] = (float)(0.0005 + 0.0005 * uniform());
      for (int c = 0; c < H; c++) {
        gq[e][r][c] = (int8_t)(uniform() * 255.0 - 127.0);
        uq[e][r][c] = (int8_t)(uniform() * 255.0 - 127.0);
      }
    }
    for (int r = 0; r < H; r++) {
      ds[e][r] = (float)(0.0005 + 0.0005 * uniform());
      for (int c = 0; c < I; c++) dq[e][r][c] = (int8_t)(uniform() * 255.0 - 127.0);
    }
  }
  for (int t = 0; t < T; t++) {
    for (int c = 0; c < H; c++) x[t][c] = (float)(uniform() * 2.0 - 1.0);
    ids[t][0] = t % E;
    ids[t][1] = (t + 3) % E;
    for (int k = 0; k < K; k++) w[t][k] = (float)uniform();
  }
  kt_moe_args a;
  memset(&a, 0, sizeof a);
  a.tokens = T, a.hidden = H, a.inter = I, a.experts = E, a.topk = K;
  a.x_dtype = KT_F32, a.wfmt = KT_INT8, a.group_size = 0, a.num_threads = 1;
  a.x = x, a.ids = &ids[0][0], a.weights = &w[0][0], a.y = y;
  a.gate.q = gq, a.gate.scale = &gs[0][0];
  a.up.q = uq, a.up.scale = &us[0][0];
  a.down.q = dq, a.down.scale = &ds[0][0];
  char err[256] = {0};
  if (ops->moe_forward(&a, err, sizeof err) != 0) {
    fprintf(stderr, "%s: moe_forward: %s\n", ops->name, err);
    return 2;
  }
  double worst = 0.0, scale = 0.0;
  for (int t = 0; t < T; t++) {
    static double ref[H];
    memset(ref, 0, sizeof ref);
    for (int k = 0; k < K; k++) {
      int e = (int)ids[t][k];
      static double act[I];
      for (int r = 0; r < I; r++) {
        double g = 0, u = 0;
        for (int c = 0; c < H; c++) {
          g += gq[e][r][c] * (double)gs[e][r] * x[t][c];
          u += uq[e][r][c] * (double)us[e][r] * x[t][c];
        }
        act[r] = g / (1.0 + exp(-g)) * u;
      }
      for (int r = 0; r < H; r++) {
        double d = 0;
        for (int c = 0; c < I; c++) d += dq[e][r][c] * (double)ds[e][r] * act[c];
        ref[r] += w[t][k] * d;
      }
    }
    for (int r = 0; r < H; r++) {
      if (fabs(ref[r]) > scale) scale = fabs(ref[r]);
      if (fabs(y[t][r] - ref[r]) > worst) worst = fabs(y[t][r] - ref[r]);
    }
  }
  double rel = scale > 0 ? worst / scale : worst;
  printf("{\"variant\": \"%s\", \"max_rel_error\": %.6g}\n", ops->name, rel);
  return rel <= BOUND ? 0 : 1;
}
