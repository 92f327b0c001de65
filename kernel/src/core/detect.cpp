#include "detect.h"

#include <cpuid.h>
#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

namespace kt {
namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub) {
  Regs r;
  if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) r = Regs{};
  return r;
}

uint64_t xgetbv0() {
  unsigned lo = 0, hi = 0;
  // The raw encoding avoids needing -mxsave; only reached when OSXSAVE is set.
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool bit(unsigned v, int n) { return (v >> n) & 1u; }

}  // namespace

CpuInfo detect_cpu() {
  CpuInfo info;
  const Regs l0 = cpuid(0, 0);
  char vendor[13] = {0};
  std::memcpy(vendor, &l0.b, 4);
  std::memcpy(vendor + 4, &l0.d, 4);
  std::memcpy(vendor + 8, &l0.c, 4);
  info.vendor = vendor;
  const unsigned max_leaf = l0.a;
  const Regs l1 = cpuid(1, 0);
  const Regs l7 = max_leaf >= 7 ? cpuid(7, 0) : Regs{};
  const Regs l71 = (max_leaf >= 7 && l7.a >= 1) ? cpuid(7, 1) : Regs{};

  const Regs ext = cpuid(0x80000000u, 0);
  if (ext.a >= 0x80000004u) {
    char brand[49] = {0};
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002u + i, 0);
      std::memcpy(brand + 16 * i, &r, 16);
    }
    info.brand = brand;
    const auto first = info.brand.find_first_not_of(' ');
    info.brand = first == std::string::npos ? "" : info.brand.substr(first);
  }

  info.osxsave = bit(l1.c, 27);
  if (info.osxsave) {
    info.xcr0 = xgetbv0();
    info.os_avx = (info.xcr0 & 0x6) == 0x6;
    info.os_avx512 = info.os_avx && (info.xcr0 & 0xE0) == 0xE0;
    info.os_amx = (info.xcr0 & 0x60000) == 0x60000;
  }

  info.cpuid = {
      {"SSE4_2", bit(l1.c, 20)},       {"AVX", bit(l1.c, 28)},          {"FMA", bit(l1.c, 12)},
      {"F16C", bit(l1.c, 29)},         {"AVX2", bit(l7.b, 5)},          {"BMI1", bit(l7.b, 3)},
      {"BMI2", bit(l7.b, 8)},          {"AVX512F", bit(l7.b, 16)},      {"AVX512DQ", bit(l7.b, 17)},
      {"AVX512BW", bit(l7.b, 30)},     {"AVX512VL", bit(l7.b, 31)},     {"AVX512_VBMI", bit(l7.c, 1)},
      {"AVX512_VNNI", bit(l7.c, 11)},  {"AVX512_BF16", bit(l71.a, 5)},  {"AMX_BF16", bit(l7.d, 22)},
      {"AMX_TILE", bit(l7.d, 24)},     {"AMX_INT8", bit(l7.d, 25)},
  };
  return info;
}

int request_amx_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) return 0;
  return errno;
#else
  return ENOSYS;
#endif
}

}  // namespace kt
