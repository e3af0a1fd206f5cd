// The bf16 compute mode's product (gemm_nt_bf16 in gemm.hpp): the AVX512-BF16 micro-kernel, the
// path the plan reads (cpu_paths().bf16, or a test's override), and the AMX activation packing
// (the rounding kernel is in gemm_nt.cpp, the AMX kernel in gemm_amx.cpp).
//
// Highway 1.0.3 (Debian 12) has no AVX512-BF16 target, so the native kernel is written with
// intrinsics in functions that carry their own target attribute; the rest of the library is
// compiled for the baseline, and the kernel runs only where cpu_features() says it may.
//
// Micro-kernel: register tiles of up to 6 rows × 4 columns (24 zmm accumulators, 6 for A, 1 for
// B), each C element one accumulator of 16 fp32 lanes fed 32 bf16 products per `vdpbf16ps`.
// The reduction axis is padded with zeros to a multiple of 32 by masked loads (nothing past a
// row is read), then each accumulator is reduced by one fixed tree (ref::reduce16), so an
// element's bits depend only on K, never on the tile it landed in, M, N or the thread count.
// Where vdpbf16ps issues at the FMA's rate (Zen 4) the loop's arithmetic ceiling is twice the
// f32 kernel's, so memory sets its pace; hence the activation rows are staggered across L1 sets
// (bf16_activation_ld: rows 4 KB apart would share sets with the weight rows), and the next L2
// block of weight rows is prefetched while the current one computes, so that the first strip
// over a block does not wait on DRAM (kernels/prefetch.hpp; figures: docs/performance.md).
#include <algorithm>
#include <atomic>
#include <cstring>

#include "kernels/cpu.hpp"
#include "kernels/gemm.hpp"
#include "kernels/prefetch.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MOEKIT_HAVE_X86_BF16_KERNEL 1
#include <immintrin.h>
#endif

namespace moekit::kernels {

namespace {

std::atomic<int> path_override{-1};

}  // namespace

Bf16Path bf16_path() noexcept {
  const int forced = path_override.load(std::memory_order_relaxed);
  return forced >= 0 ? static_cast<Bf16Path>(forced) : cpu_paths().bf16;
}

void detail::set_bf16_path_for_tests(std::optional<Bf16Path> path) {
  if (path && !bf16_path_supported(*path)) path = Bf16Path::f32_fma;
  path_override.store(path ? static_cast<int>(*path) : -1, std::memory_order_relaxed);
}

namespace {
// The amx form: rows rounded a block of kAmxRows × kChunk at a time into a stack buffer (the
// vectorised rounding kernel), then each row's k pairs scattered as 32-bit words into its panel.
void round_rows_amx(const RowSource& A, std::int64_t rows, std::int64_t K, std::uint16_t* dst) {
  constexpr std::int64_t kChunk = 256;
  const std::int64_t Kp = amx_padded_k(K);
  const std::int64_t panels = (rows + kAmxRows - 1) / kAmxRows;
  std::memset(dst, 0, static_cast<std::size_t>(panels * kAmxRows * Kp) * 2);
  std::uint16_t block[kAmxRows * kChunk];
  for (std::int64_t p = 0; p < panels; ++p) {
    const std::int64_t r = std::min(kAmxRows, rows - p * kAmxRows);
    std::uint16_t* panel = dst + p * kAmxRows * Kp;
    for (std::int64_t k0 = 0; k0 < K; k0 += kChunk) {
      const std::int64_t w = std::min(kChunk, K - k0);
      RowSource src = A.from(p * kAmxRows);
      src.data += k0;  // columns [k0, k0 + w) of each row, gathered rows included
      detail::round_rows_bf16(src, r, w, false, block, w);
      for (std::int64_t i = 0; i < r; ++i) {
        const std::uint16_t* from = block + i * w;
        std::uint16_t* to = panel + (k0 / 2) * 2 * kAmxRows + i * 2;
        std::int64_t k = 0;
        for (; k + 2 <= w; k += 2) {
          to[(k / 2) * 2 * kAmxRows] = from[k];
          to[(k / 2) * 2 * kAmxRows + 1] = from[k + 1];
        }
        if (k < w) to[(k / 2) * 2 * kAmxRows] = from[k];  // odd K: its last pair's second half stays 0
      }
    }
  }
}
}  // namespace

#ifdef MOEKIT_HAVE_X86_BF16_KERNEL
#define MOEKIT_AVX512BW __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
namespace {

// GCC 12's AVX-512 intrinsics (the shifts, the conversions, the casts) seed their results from a
// deliberately undefined vector, which -W(maybe-)uninitialized reports once they are inlined: a
// false positive (every lane is written), silenced for these functions alone.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// f32 lanes -> their bf16 bits (f32_to_bf16's rule: round to nearest even, a NaN made quiet) in
// the low 16 bits of each 32-bit lane: RoundedBf16Bits (gemm_nt.cpp) in AVX-512.
MOEKIT_AVX512BW inline __m512i bf16_bits(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
  const __m512i quiet = _mm512_or_si512(bits, _mm512_set1_epi32(0x400000));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_srli_epi32(_mm512_mask_blend_epi32(nan, rounded, quiet), 16);
}

// r[i] = row i's 16 words of 32 bits -> r[j] = word j of every row (a 16 × 16 transpose: pairs
// of 32 bits within 128-bit lanes, then pairs of 64, then whole lanes).
MOEKIT_AVX512BW inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);      // a0 b0 a1 b1 per lane
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);  // a2 b2 a3 b3
  }
  for (int g = 0; g < 4; ++g) {  // rows 4g .. 4g + 3: u[4g + c] holds their column c of each lane
    u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // column 4L + c = lane L of u[c], u[4 + c], u[8 + c], u[12 + c]
    const __m512i x0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), x1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
    const __m512i y0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44),
                  y1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
    r[8 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
  }
}

// round_rows_amx in registers: per panel and chunk of 32 k, each row's 32 values (masked loads:
// zeros past K and for rows past the last) rounded and packed into 16 pairs, the 16 rows × 16
// pairs transposed, each pair's row of 16 stored whole. Writes every element of the panels, so
// no clearing first. The same bits as the portable form (the test holds them together).
MOEKIT_AVX512BW void round_rows_amx_avx512(const RowSource& A, std::int64_t rows, std::int64_t K,
                                           std::uint16_t* dst) {
  const std::int64_t Kp = amx_padded_k(K);
  for (std::int64_t p = 0; p * kAmxRows < rows; ++p) {
    const std::int64_t r = std::min(kAmxRows, rows - p * kAmxRows);
    const float* src[kAmxRows];
    __m512 scale[kAmxRows];
    for (std::int64_t i = 0; i < r; ++i) {
      src[i] = A.row(p * kAmxRows + i);
      scale[i] = _mm512_set1_ps(A.factor(p * kAmxRows + i));
    }
    std::uint16_t* panel = dst + p * kAmxRows * Kp;
    for (std::int64_t k0 = 0; k0 < Kp; k0 += 32) {
      const std::int64_t n = K - k0;  // 1 .. 32 valid, or more
      const auto mask = [](std::int64_t count) {
        return static_cast<__mmask16>(count >= 16 ? 0xffffu : count <= 0 ? 0u : (1u << count) - 1u);
      };
      const __mmask16 lo = mask(n), hi = mask(n - 16);
      __m512i w[kAmxRows];
      for (std::int64_t i = 0; i < kAmxRows; ++i) {
        if (i >= r) {
          w[i] = _mm512_setzero_si512();
          continue;
        }
        __m512 v0 = _mm512_maskz_loadu_ps(lo, src[i] + k0), v1 = _mm512_maskz_loadu_ps(hi, src[i] + k0 + 16);
        if (A.scale) {
          v0 = _mm512_mul_ps(v0, scale[i]);
          v1 = _mm512_mul_ps(v1, scale[i]);
        }
        // Words k0 .. k0 + 31 in order: 32-bit word j = the pair (k0 + 2j, k0 + 2j + 1).
        w[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(bf16_bits(v0))),
                                  _mm512_cvtepi32_epi16(bf16_bits(v1)), 1);
      }
      transpose16(w);
      for (int q = 0; q < 16; ++q) _mm512_storeu_si512(panel + k0 * kAmxRows + q * 2 * kAmxRows, w[q]);
    }
  }
}
#pragma GCC diagnostic pop

}  // namespace
#endif

Bf16Activations round_to_bf16(const RowSource& A, std::int64_t rows, std::int64_t K, Bf16Path path, void* dst) {
  if (path == Bf16Path::amx) {
#ifdef MOEKIT_HAVE_X86_BF16_KERNEL
    if (cpu_features().avx512) {
      round_rows_amx_avx512(A, rows, K, static_cast<std::uint16_t*>(dst));
      return {dst, amx_padded_k(K), path};
    }
#endif
    round_rows_amx(A, rows, K, static_cast<std::uint16_t*>(dst));
    return {dst, amx_padded_k(K), path};
  }
  const std::int64_t ld = bf16_activation_ld(K, path);
  detail::round_rows_bf16(A, rows, K, path == Bf16Path::f32_fma, dst, ld);
  return {dst, ld, path};
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

// GCC 12's AVX-512 headers make their "undefined" source operands as `__m512 __Y = __Y;`, which
// -Wuninitialized reports once the shuffles below are inlined: a false positive (every lane
// of the result is written), silenced for this function alone.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// reduce16 of four accumulators at once, by the same tree: lanes l and l + 8, then + 4, + 2, + 1
// (IEEE addition commutes, so only the pairing matters; the twin tests hold it to the bit).
// Returns the four sums, in 9 shuffles and 5 additions where four reduce16 take 16 of each.
MOEKIT_AVX512BF16 inline __m128 reduce16x4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  // [a0's lanes l + l+8 | a1's], [a2's | a3's]
  const __m512 t01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE));
  const __m512 t23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xEE));
  // quarter q: the four lanes of a_q after + 4
  const __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(t01, t23, 0x88), _mm512_shuffle_f32x4(t01, t23, 0xDD));
  const __m512 v = _mm512_add_ps(u, _mm512_permute_ps(u, 0x4E));  // + 2: lanes 0, 1 of each quarter
  const __m512 w = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));  // + 1: lane 0 of each quarter
  const __m512i firsts = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(firsts, w));
}
#pragma GCC diagnostic pop

MOEKIT_AVX512BF16 inline __m512bh load_bh(const std::uint16_t* p) {
  return (__m512bh)_mm512_loadu_si512(p);
}
MOEKIT_AVX512BF16 inline __m512bh load_bh_tail(const std::uint16_t* p, __mmask32 mask) {
  return (__m512bh)_mm512_maskz_loadu_epi16(mask, p);
}

// One MR × NR tile over the whole K: rows a[0..MR), columns b[0..NR) (weights rows).
template <int MR, int NR>
MOEKIT_AVX512BF16 inline void tile(const std::uint16_t* const* a, const std::uint16_t* const* b, std::int64_t K,
                                   const Output& C, std::int64_t m, std::int64_t n, NextRows& pf) {
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
    pf.step();
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
    if constexpr (NR % 4 == 0) {
      for (int j = 0; j < NR; j += 4) {
        __m128 v = reduce16x4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
        if (C.row_scale) v = _mm_mul_ps(v, _mm_set1_ps(C.row_scale[m + i]));
        if (C.accumulate) v = _mm_add_ps(_mm_loadu_ps(c + j), v);
        _mm_storeu_ps(c + j, v);
      }
    } else {
      for (int j = 0; j < NR; ++j) {
        float v = reduce16(acc[i][j]);
        if (C.row_scale) v *= C.row_scale[m + i];
        c[j] = C.accumulate ? c[j] + v : v;
      }
    }
  }
}

// Rows m .. m + MR - 1 against columns [n0, n1).
template <int MR>
MOEKIT_AVX512BF16 void strip(const Bf16Rows& A, const std::uint16_t* B, std::int64_t ldb, const Output& C,
                             std::int64_t m, std::int64_t n0, std::int64_t n1, std::int64_t K, NextRows& pf) {
  const std::uint16_t* a[MR];
  for (int i = 0; i < MR; ++i) a[i] = A.row(m + i);
  std::int64_t n = n0;
  if constexpr (MR == 1) {  // decode: 8 weight streams in flight, as the f32 kernel
    for (; n + 8 <= n1; n += 8) {
      const std::uint16_t* b[8];
      for (int j = 0; j < 8; ++j) b[j] = B + (n + j) * ldb;
      tile<1, 8>(a, b, K, C, m, n, pf);
    }
  }
  for (; n + 4 <= n1; n += 4) {
    const std::uint16_t* b[4];
    for (int j = 0; j < 4; ++j) b[j] = B + (n + j) * ldb;
    tile<MR, 4>(a, b, K, C, m, n, pf);
  }
  for (; n < n1; ++n) {
    const std::uint16_t* b[1] = {B + n * ldb};
    tile<MR, 1>(a, b, K, C, m, n, pf);
  }
}

constexpr int kMaxRows = 6;

}  // namespace

MOEKIT_AVX512BF16 void detail::gemm_nt_bf16_avx512(const Bf16Rows& A, const WeightMatrix& B, const Output& C,
                                                    std::int64_t M, std::int64_t N, std::int64_t K) {
  const auto* b = static_cast<const std::uint16_t*>(B.data);
  // A block of B's columns stays in L2 while every row strip of A passes over it.
  const std::int64_t row_bytes = std::max<std::int64_t>(1, K * 2);
  const std::int64_t block_n = std::max<std::int64_t>(4, (256 * 1024 / row_bytes) / 4 * 4);
  const std::int64_t strips = (M + kMaxRows - 1) / kMaxRows;
  for (std::int64_t n0 = 0; n0 < N; n0 += block_n) {
    const std::int64_t n1 = std::min(N, n0 + block_n);
    // The next block's rows into L2, spread over this block's k steps (kernels/prefetch.hpp),
    // so that the first strip over the next block does not read them from DRAM.
    const std::int64_t next = n1 < N && K >= 32 ? std::min(N, n1 + block_n) - n1 : 0;
    NextRows pf = NextRows::over(next > 0 ? b + n1 * B.ld : b, next, K * 2, B.ld * 2, strips * ((n1 - n0 + 3) / 4) * (K / 32));
    for (std::int64_t m = 0; m < M; m += kMaxRows) {
      switch (std::min<std::int64_t>(kMaxRows, M - m)) {
        case 1: strip<1>(A, b, B.ld, C, m, n0, n1, K, pf); break;
        case 2: strip<2>(A, b, B.ld, C, m, n0, n1, K, pf); break;
        case 3: strip<3>(A, b, B.ld, C, m, n0, n1, K, pf); break;
        case 4: strip<4>(A, b, B.ld, C, m, n0, n1, K, pf); break;
        case 5: strip<5>(A, b, B.ld, C, m, n0, n1, K, pf); break;
        default: strip<6>(A, b, B.ld, C, m, n0, n1, K, pf); break;
      }
    }
  }
}

#else

void detail::gemm_nt_bf16_avx512(const Bf16Rows&, const WeightMatrix&, const Output&, std::int64_t, std::int64_t,
                                 std::int64_t) {}  // bf16_path() never selects it off x86

#endif

}  // namespace moekit::kernels
