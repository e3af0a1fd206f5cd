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

/// The int8 fast mode's instruction paths (int8_rows.cpp, int8_panels.cpp, gemm_amx_int8.cpp). `best` is a
/// caller's "whatever cpu_paths() says" and is never a resolved path.
enum class Int8Path { best, portable, avx2, avx512vnni, amx };

/// The bf16 compute mode's paths (gemm.hpp, gemm_nt_bf16, says what each computes).
enum class Bf16Path { f32_fma, avx512bf16, amx };
inline constexpr Bf16Path kBf16Paths[] = {Bf16Path::f32_fma, Bf16Path::avx512bf16, Bf16Path::amx};

/// The instruction paths the kernels take on this CPU: cpu_features() and the environment, read
/// once, here and nowhere else (the kernel plan, kernels/plan.hpp, reads this).
///  - int8: avx512vnni where the CPU has it (one `vpdpbusd` per 32 codes instead of three
///    instructions), else avx2, else portable. MOEKIT_INT8_PATH=avx2|portable lowers it.
///  - amx_int8: AMX-INT8 takes the int8 mode's many-row products on MLX affine codes: the CPU has
///    it and MOEKIT_INT8_PATH is unset or `amx`.
///  - bf16: amx where the CPU has AMX-BF16 (and Linux grants tile data); else avx512bf16 on AMD
///    (Zen 4 and later issue vdpbf16ps at the FMA rate, twice the products per instruction); else
///    f32_fma (Intel without AMX issues vdpbf16ps at under half vfmadd231ps's rate, so it computes
///    fewer products per second). MOEKIT_BF16_PATH=f32_fma|avx512bf16|amx picks one the CPU has.
struct CpuPaths {
  Int8Path int8 = Int8Path::portable;
  bool amx_int8 = false;
  Bf16Path bf16 = Bf16Path::f32_fma;
};

/// The resolution, made on first use (thread-safe).
const CpuPaths& cpu_paths() noexcept;

/// Whether this CPU runs `path` (portable, best and f32_fma: everywhere).
bool int8_path_supported(Int8Path path) noexcept;
bool bf16_path_supported(Bf16Path path) noexcept;
/// "avx512vnni", "avx2", "portable", "amx" (best: what cpu_paths() resolved it to).
const char* int8_path_name(Int8Path path) noexcept;
/// "f32_fma", "avx512bf16", "amx".
const char* bf16_path_name(Bf16Path path) noexcept;

}  // namespace moekit::kernels
