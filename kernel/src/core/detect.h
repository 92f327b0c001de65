// CPU and OS feature detection. Compiled with no ISA flags and no LTO: this
// runs on every CPU that imports kt_kernel, including ones that can run no
// variant at all, so nothing above the x86-64 baseline may appear here.
#ifndef KT_DETECT_H
#define KT_DETECT_H

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kt {

struct CpuInfo {
  std::string vendor;
  std::string brand;
  // Feature name (iced-x86 CpuidFeature spelling) -> CPUID reports it.
  std::vector<std::pair<std::string, bool>> cpuid;
  bool osxsave = false;
  uint64_t xcr0 = 0;
  bool os_avx = false;     // XCR0: SSE + AVX state
  bool os_avx512 = false;  // XCR0: opmask + ZMM_Hi256 + Hi16_ZMM
  bool os_amx = false;     // XCR0: XTILECFG + XTILEDATA
};

CpuInfo detect_cpu();

// Linux: ask the kernel for permission to use AMX tile data
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)). Returns 0 on success,
// otherwise an errno value (ENOSYS where the kernel predates the interface).
int request_amx_permission();

}  // namespace kt

#endif
