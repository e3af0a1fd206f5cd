// The bf16 compute mode's product (gemm_nt_bf16 in gemm.hpp): the AVX512-BF16 micro-kernel and
// the run-time CPU check and policy that pick a path (the rounding kernel is in gemm_nt.cpp).
//
// Highway 1.0.3 (Debian 12) has no AVX512-BF16 target, so the native kernel is written with
// intrinsics in functions that carry their own target attribute; the rest of the library is
// compiled for the baseline, and the kernel runs only where CPUID and XCR0 say it may.
//
// Micro-kernel: register tiles of up to 6 rows × 4 columns (24 zmm accumulators, 6 for A, 1 for
// B), each C element one accumulator of 16 fp32 lanes fed 32 bf16 products per `vdpbf16ps`.
// The reduction axis is padded with zeros to a multiple of 32 by masked loads (nothing past a
// row is read), then each accumulator is reduced by one fixed tree (ref::reduce16), so an
// element's bits depend only on K, never on the tile it landed in, M, N or the thread count.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/gemm.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MOEKIT_HAVE_X86_BF16_KERNEL 1
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace moekit::kernels {

namespace {

#ifdef MOEKIT_HAVE_X86_BF16_KERNEL
std::uint64_t xcr0() {
  std::uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<std::uint64_t>(edx) << 32) | eax;
}

bool cpu_has_avx512bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool osxsave = (c >> 27) & 1u;
  if (!osxsave) return false;
  // XCR0: SSE (1), AVX (2), opmask (5), ZMM_Hi256 (6), Hi16_ZMM (7) state saved by the OS.
  if ((xcr0() & 0xE6u) != 0xE6u) return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool f = (b >> 16) & 1u, bw = (b >> 30) & 1u, vl = (b >> 31) & 1u;
  if (!(f && bw && vl)) return false;
  if (a < 1) return false;  // leaf 7's highest subleaf
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return (a >> 5) & 1u;  // AVX512_BF16
}

bool cpu_is_amd() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  return b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "AuthenticAMD"
}
#endif

bool cpu_supports_native() noexcept {
#ifdef MOEKIT_HAVE_X86_BF16_KERNEL
  static const bool has = cpu_has_avx512bf16();
  return has;
#else
  return false;
#endif
}

// The CPU's choice (bf16_path's rule), with MOEKIT_BF16_PATH applied; decided once.
Bf16Path chosen_path() noexcept {
  static const Bf16Path path = [] {
    if (const char* env = std::getenv("MOEKIT_BF16_PATH")) {
      if (std::strcmp(env, "f32_fma") == 0) return Bf16Path::f32_fma;
      if (std::strcmp(env, "avx512bf16") == 0 && cpu_supports_native()) return Bf16Path::avx512bf16;
    }
#ifdef MOEKIT_HAVE_X86_BF16_KERNEL
    if (cpu_supports_native() && cpu_is_amd()) return Bf16Path::avx512bf16;
#endif
    return Bf16Path::f32_fma;
  }();
  return path;
}

std::atomic<int> path_override{-1};

}  // namespace

bool bf16_path_supported(Bf16Path path) noexcept {
  return path == Bf16Path::f32_fma || cpu_supports_native();
}

Bf16Path bf16_path() noexcept {
  const int forced = path_override.load(std::memory_order_relaxed);
  return forced >= 0 ? static_cast<Bf16Path>(forced) : chosen_path();
}

void detail::set_bf16_path_for_tests(std::optional<Bf16Path> path) {
  if (path && !bf16_path_supported(*path)) path = Bf16Path::f32_fma;
  path_override.store(path ? static_cast<int>(*path) : -1, std::memory_order_relaxed);
}

const char* bf16_path_name(Bf16Path path) noexcept {
  return path == Bf16Path::avx512bf16 ? "avx512bf16" : "f32_fma";
}

Bf16Activations round_to_bf16(const RowSource& A, std::int64_t rows, std::int64_t K, Bf16Path path, void* dst) {
  detail::round_rows_bf16(A, rows, K, path == Bf16Path::f32_fma, dst);
  return {dst, K, path};
}

#ifdef MOEKIT_HAVE_X86_BF16_KERNEL

#define MOEKIT_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace {

// The fixed lane tree of ref::reduce16: (l_i + l_i+8), then + 4, + 2, + 1.
MOEKIT_AVX512BF16 inline float reduce16(__m512 v) {
  const __m256 lo = _mm512_extractf32x8_ps(v, 0);
  const __m256 hi = _mm512_extractf32x8_ps(v, 1);
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

MOEKIT_AVX512BF16 inline __m512bh load_bh(const std::uint16_t* p) {
  return (__m512bh)_mm512_loadu_si512(p);
}
MOEKIT_AVX512BF16 inline __m512bh load_bh_tail(const std::uint16_t* p, __mmask32 mask) {
  return (__m512bh)_mm512_maskz_loadu_epi16(mask, p);
}

// One MR × NR tile over the whole K: rows a[0..MR), columns b[0..NR) (weights rows).
template <int MR, int NR>
MOEKIT_AVX512BF16 inline void tile(const std::uint16_t* const* a, const std::uint16_t* const* b, std::int64_t K,
                                   const Output& C, std::int64_t m, std::int64_t n) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  std::int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512bh av[MR];
    for (int i = 0; i < MR; ++i) av[i] = load_bh(a[i] + k);
    for (int j = 0; j < NR; ++j) {
      const __m512bh bv = load_bh(b[j] + k);
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av[i], bv);
    }
  }
  if (k < K) {
    const __mmask32 mask = static_cast<__mmask32>((1ull << (K - k)) - 1ull);
    __m512bh av[MR];
    for (int i = 0; i < MR; ++i) av[i] = load_bh_tail(a[i] + k, mask);
    for (int j = 0; j < NR; ++j) {
      const __m512bh bv = load_bh_tail(b[j] + k, mask);
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av[i], bv);
    }
  }
  for (int i = 0; i < MR; ++i) {
    float* c = C.data + (m + i) * C.ld + n;
    for (int j = 0; j < NR; ++j) {
      float v = reduce16(acc[i][j]);
      if (C.row_scale) v *= C.row_scale[m + i];
      c[j] = C.accumulate ? c[j] + v : v;
    }
  }
}

// Rows m .. m + MR - 1 against columns [n0, n1).
template <int MR>
MOEKIT_AVX512BF16 void strip(const Bf16Rows& A, const std::uint16_t* B, std::int64_t ldb, const Output& C,
                             std::int64_t m, std::int64_t n0, std::int64_t n1, std::int64_t K) {
  const std::uint16_t* a[MR];
  for (int i = 0; i < MR; ++i) a[i] = A.row(m + i);
  std::int64_t n = n0;
  if constexpr (MR == 1) {  // decode: 8 weight streams in flight, as the f32 kernel
    for (; n + 8 <= n1; n += 8) {
      const std::uint16_t* b[8];
      for (int j = 0; j < 8; ++j) b[j] = B + (n + j) * ldb;
      tile<1, 8>(a, b, K, C, m, n);
    }
  }
  for (; n + 4 <= n1; n += 4) {
    const std::uint16_t* b[4];
    for (int j = 0; j < 4; ++j) b[j] = B + (n + j) * ldb;
    tile<MR, 4>(a, b, K, C, m, n);
  }
  for (; n < n1; ++n) {
    const std::uint16_t* b[1] = {B + n * ldb};
    tile<MR, 1>(a, b, K, C, m, n);
  }
}

}  // namespace

MOEKIT_AVX512BF16 void detail::gemm_nt_bf16_avx512(const Bf16Rows& A, const WeightMatrix& B, const Output& C,
                                                    std::int64_t M, std::int64_t N, std::int64_t K) {
  const auto* b = static_cast<const std::uint16_t*>(B.data);
  // A block of B's columns stays in L2 while every row strip of A passes over it.
  const std::int64_t row_bytes = std::max<std::int64_t>(1, K * 2);
  const std::int64_t block_n = std::max<std::int64_t>(4, (256 * 1024 / row_bytes) / 4 * 4);
  for (std::int64_t n0 = 0; n0 < N; n0 += block_n) {
    const std::int64_t n1 = std::min(N, n0 + block_n);
    for (std::int64_t m = 0; m < M; m += 6) {
      switch (std::min<std::int64_t>(6, M - m)) {
        case 1: strip<1>(A, b, B.ld, C, m, n0, n1, K); break;
        case 2: strip<2>(A, b, B.ld, C, m, n0, n1, K); break;
        case 3: strip<3>(A, b, B.ld, C, m, n0, n1, K); break;
        case 4: strip<4>(A, b, B.ld, C, m, n0, n1, K); break;
        case 5: strip<5>(A, b, B.ld, C, m, n0, n1, K); break;
        default: strip<6>(A, b, B.ld, C, m, n0, n1, K); break;
      }
    }
  }
}

#else

void detail::gemm_nt_bf16_avx512(const Bf16Rows&, const WeightMatrix&, const Output&, std::int64_t, std::int64_t,
                                 std::int64_t) {}  // bf16_path() never selects it off x86

#endif

}  // namespace moekit::kernels
