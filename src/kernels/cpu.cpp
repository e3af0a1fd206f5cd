#include "kernels/cpu.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MOEKIT_CPU_X86 1
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace moekit::kernels {

namespace {

#ifdef MOEKIT_CPU_X86
std::uint64_t xcr0() {
  std::uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<std::uint64_t>(edx) << 32) | eax;
}

// Linux (5.16 and later) hands out AMX tile data only to processes that ask for it.
bool amx_permitted() {
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures read() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  f.amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "AuthenticAMD"
  const unsigned max_leaf = a;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1u, fma = (c >> 12) & 1u, f16c = (c >> 29) & 1u;
  if (!osxsave || max_leaf < 7) return f;
  const std::uint64_t x = xcr0();
  const bool os_avx = (x & 0x6u) == 0x6u;         // SSE, AVX state
  const bool os_avx512 = (x & 0xE6u) == 0xE6u;    // + opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_amx = (x & 0x60000u) == 0x60000u;  // XTILECFG, XTILEDATA
  __get_cpuid_count(7, 0, &a, &b, &c, &d);
  const unsigned subleaves = a;
  const bool avx2 = (b >> 5) & 1u;
  const bool avx512f = (b >> 16) & 1u, avx512dq = (b >> 17) & 1u, avx512bw = (b >> 30) & 1u,
             avx512vl = (b >> 31) & 1u;
  const bool vnni = (c >> 11) & 1u;
  const bool amx_bf16 = (d >> 22) & 1u, amx_tile = (d >> 24) & 1u, amx_int8 = (d >> 25) & 1u;
  f.avx2_fma = os_avx && avx2 && fma && f16c;
  f.avx512 = f.avx2_fma && os_avx512 && avx512f && avx512dq && avx512bw && avx512vl;
  f.avx512_vnni = f.avx512 && vnni;
  if (subleaves >= 1) {
    __get_cpuid_count(7, 1, &a, &b, &c, &d);
    f.avx512_bf16 = f.avx512 && ((a >> 5) & 1u);
  }
  if (f.avx512 && os_amx && amx_tile && (amx_bf16 || amx_int8) && amx_permitted()) {
    f.amx_bf16 = amx_bf16;
    f.amx_int8 = amx_int8;
  }
  return f;
}
#endif

}  // namespace

const CpuFeatures& cpu_features() noexcept {
#ifdef MOEKIT_CPU_X86
  static const CpuFeatures f = read();
#else
  static const CpuFeatures f;
#endif
  return f;
}

bool int8_path_supported(Int8Path path) noexcept {
  const CpuFeatures& cpu = cpu_features();
  switch (path) {
    case Int8Path::avx512vnni:
      return cpu.avx2_fma && cpu.avx512_vnni;
    case Int8Path::avx2:
      return cpu.avx2_fma;
    case Int8Path::amx:
      return cpu.amx_int8;
    case Int8Path::best:
    case Int8Path::portable:
      break;
  }
  return true;
}

bool bf16_path_supported(Bf16Path path) noexcept {
  switch (path) {
    case Bf16Path::avx512bf16:
      return cpu_features().avx512_bf16;
    case Bf16Path::amx:
      return cpu_features().amx_bf16;
    case Bf16Path::f32_fma:
      break;
  }
  return true;
}

namespace {

CpuPaths resolve() {
  CpuPaths p;
  const char* int8 = std::getenv("MOEKIT_INT8_PATH");
  const auto asks = [int8](const char* name) { return int8 != nullptr && std::strcmp(int8, name) == 0; };
  if (int8_path_supported(Int8Path::avx512vnni) && !asks("avx2") && !asks("portable")) {
    p.int8 = Int8Path::avx512vnni;
  } else if (int8_path_supported(Int8Path::avx2) && !asks("portable")) {
    p.int8 = Int8Path::avx2;
  }
  p.amx_int8 = int8_path_supported(Int8Path::amx) && (int8 == nullptr || asks("amx"));
  const CpuFeatures& cpu = cpu_features();
  p.bf16 = cpu.amx_bf16 ? Bf16Path::amx : cpu.avx512_bf16 && cpu.amd ? Bf16Path::avx512bf16 : Bf16Path::f32_fma;
  if (const char* bf16 = std::getenv("MOEKIT_BF16_PATH")) {
    for (const Bf16Path b : kBf16Paths)
      if (std::strcmp(bf16, bf16_path_name(b)) == 0 && bf16_path_supported(b)) p.bf16 = b;
  }
  return p;
}

}  // namespace

const CpuPaths& cpu_paths() noexcept {
  static const CpuPaths p = resolve();
  return p;
}

const char* int8_path_name(Int8Path path) noexcept {
  if (path == Int8Path::best) path = cpu_paths().int8;
  switch (path) {
    case Int8Path::amx:
      return "amx";
    case Int8Path::avx512vnni:
      return "avx512vnni";
    case Int8Path::avx2:
      return "avx2";
    case Int8Path::best:
    case Int8Path::portable:
      break;
  }
  return "portable";
}

const char* bf16_path_name(Bf16Path path) noexcept {
  switch (path) {
    case Bf16Path::avx512bf16:
      return "avx512bf16";
    case Bf16Path::amx:
      return "amx";
    case Bf16Path::f32_fma:
      break;
  }
  return "f32_fma";
}

}  // namespace moekit::kernels
