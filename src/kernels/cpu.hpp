// What the CPU (and the operating system) lets the kernels run: one CPUID + XCR0 reading, made
// once, for every hand-written instruction path (AVX2 and AVX512-VNNI int8 tiles, AVX512-BF16,
// AMX). Internal.
//
// A feature counts only when the OS saves its register state: AVX needs XCR0's SSE and AVX bits,
// AVX-512 also the opmask and both ZMM halves, AMX the tile config and tile data bits — and, on
// Linux, the process's permission to use tile data, asked for once here with
// arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). Off x86 every flag is false.
#pragma once

namespace moekit::kernels {

struct CpuFeatures {
  bool avx2_fma = false;    ///< AVX2 + FMA + F16C, OS-enabled
  bool avx512 = false;      ///< AVX-512 F, BW, VL, DQ, OS-enabled
  bool avx512_bf16 = false;  ///< avx512 + AVX512-BF16
  bool avx512_vnni = false;  ///< avx512 + AVX512-VNNI
  bool amx_bf16 = false;    ///< AMX-TILE + AMX-BF16, OS-enabled and permitted for this process
  bool amx_int8 = false;    ///< AMX-TILE + AMX-INT8, likewise
  bool amd = false;         ///< vendor "AuthenticAMD"
};

/// The reading, made on first use (thread-safe).
const CpuFeatures& cpu_features() noexcept;

}  // namespace moekit::kernels
