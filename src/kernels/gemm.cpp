// GEMM driver and SIMD kernel (Highway, dynamic dispatch per CPU target).
//
// C[M, N] (+)= A[M, K] · B[N, K]ᵀ with B the weights as stored, [out, in]. The kernel computes
// register tiles of up to 3 rows × 4 columns as dot products: each C element owns one vector
// accumulator whose lane j sums k ≡ j (mod lanes) sequentially with FMA, then the lanes are
// reduced in a fixed order. That order depends only on K and the CPU target, never on the tile
// an element landed in, M, N or the thread count, so results are bit-identical however the
// work is split. B is streamed in its stored dtype (f32, bf16 or f16) and widened in registers:
// a bf16 or f16 model is never expanded in memory.
#include "kernels/gemm.hpp"

#include <algorithm>
#include <cstring>

#include "util/thread_pool.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemm.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// Loads lanes(df) elements of B starting at p, widened to f32.
template <typename TB>
HWY_INLINE hn::Vec<DF> LoadB(DF df, const TB* p) {
  if constexpr (std::is_same_v<TB, float>) {
    return hn::LoadU(df, p);
  } else if constexpr (std::is_same_v<TB, hwy::bfloat16_t>) {
    const hn::Rebind<uint16_t, DF> du16;
    const hn::Rebind<uint32_t, DF> du32;
    const auto bits = hn::PromoteTo(du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p)));
    return hn::BitCast(df, hn::ShiftLeft<16>(bits));
  } else {
    const hn::Rebind<hwy::float16_t, DF> df16;
    return hn::PromoteTo(df, hn::LoadU(df16, p));
  }
}

// One MR x NR tile over the full K. Tail lanes (K % lanes) come from zero-padded copies, so
// they add exact zeros and never read past the rows.
template <int MR, int NR, typename TB>
HWY_INLINE void Tile(const float* HWY_RESTRICT A, int64_t lda, const TB* HWY_RESTRICT B, int64_t ldb,
                     float* HWY_RESTRICT C, int64_t ldc, int64_t K, bool accumulate) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<DF> acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = hn::Zero(df);
  int64_t k = 0;
  for (; k + L <= K; k += L) {
    hn::Vec<DF> a[MR];
    for (int i = 0; i < MR; ++i) a[i] = hn::LoadU(df, A + i * lda + k);
    for (int j = 0; j < NR; ++j) {
      const auto b = LoadB(df, B + j * ldb + k);
      for (int i = 0; i < MR; ++i) acc[i][j] = hn::MulAdd(a[i], b, acc[i][j]);
    }
  }
  if (k < K) {
    const int64_t r = K - k;
    HWY_ALIGN float abuf[MR][HWY_MAX_BYTES / sizeof(float)] = {};
    HWY_ALIGN TB bbuf[HWY_MAX_BYTES / sizeof(float)];
    hn::Vec<DF> a[MR];
    for (int i = 0; i < MR; ++i) {
      std::memcpy(abuf[i], A + i * lda + k, static_cast<size_t>(r) * sizeof(float));
      a[i] = hn::Load(df, abuf[i]);
    }
    for (int j = 0; j < NR; ++j) {
      std::memset(bbuf, 0, sizeof(bbuf));
      std::memcpy(bbuf, B + j * ldb + k, static_cast<size_t>(r) * sizeof(TB));
      const auto b = LoadB(df, bbuf);
      for (int i = 0; i < MR; ++i) acc[i][j] = hn::MulAdd(a[i], b, acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      const float v = hn::GetLane(hn::SumOfLanes(df, acc[i][j]));
      C[i * ldc + j] = accumulate ? C[i * ldc + j] + v : v;
    }
}

template <int MR, typename TB>
HWY_INLINE void RowStrip(const float* A, int64_t lda, const TB* B, int64_t ldb, float* C, int64_t ldc, int64_t n0,
                         int64_t n1, int64_t K, bool accumulate) {
  int64_t n = n0;
  // A single row (decode) has no A reuse to gain from tall tiles; 8 columns give 8 independent
  // FMA chains and 8 weight streams in flight instead of 4.
  if constexpr (MR == 1) {
    for (; n + 8 <= n1; n += 8) Tile<1, 8>(A, lda, B + n * ldb, ldb, C + n, ldc, K, accumulate);
  }
  for (; n + 4 <= n1; n += 4) Tile<MR, 4>(A, lda, B + n * ldb, ldb, C + n, ldc, K, accumulate);
  switch (n1 - n) {
    case 3:
      Tile<MR, 3>(A, lda, B + n * ldb, ldb, C + n, ldc, K, accumulate);
      break;
    case 2:
      Tile<MR, 2>(A, lda, B + n * ldb, ldb, C + n, ldc, K, accumulate);
      break;
    case 1:
      Tile<MR, 1>(A, lda, B + n * ldb, ldb, C + n, ldc, K, accumulate);
      break;
    default:
      break;
  }
}

// Rows per register tile: 3 x 4 accumulators fit AVX2's 16 registers; with 32 registers
// (AVX-512) 6 x 4 halves the B traffic per FMA: measured 79 -> 105 GFLOP/s on one core at
// M = 32, N = 768, K = 2048 (OpenBLAS sgemm: 104 in the same run).
constexpr int kMaxRows = HWY_MAX_BYTES >= 64 ? 6 : 3;

template <typename TB>
HWY_INLINE void Strip(int rows, const float* A, int64_t lda, const TB* B, int64_t ldb, float* C, int64_t ldc,
                      int64_t n0, int64_t n1, int64_t K, bool accumulate) {
  switch (rows) {
    case 1:
      return RowStrip<1>(A, lda, B, ldb, C, ldc, n0, n1, K, accumulate);
    case 2:
      return RowStrip<2>(A, lda, B, ldb, C, ldc, n0, n1, K, accumulate);
    case 3:
      return RowStrip<3>(A, lda, B, ldb, C, ldc, n0, n1, K, accumulate);
#if HWY_MAX_BYTES >= 64
    case 4:
      return RowStrip<4>(A, lda, B, ldb, C, ldc, n0, n1, K, accumulate);
    case 5:
      return RowStrip<5>(A, lda, B, ldb, C, ldc, n0, n1, K, accumulate);
    case 6:
      return RowStrip<6>(A, lda, B, ldb, C, ldc, n0, n1, K, accumulate);
#endif
    default:
      return;
  }
}

template <typename TB>
void GemmTyped(const float* A, int64_t lda, const TB* B, int64_t ldb, float* C, int64_t ldc, int64_t M, int64_t N,
               int64_t K, bool accumulate) {
  // A block of B rows is reused by every row strip of A while it sits in L2 (≈ 256 KB).
  const int64_t row_bytes = std::max<int64_t>(1, K * static_cast<int64_t>(sizeof(TB)));
  const int64_t block_n = std::max<int64_t>(4, (256 * 1024 / row_bytes) / 4 * 4);
  for (int64_t n0 = 0; n0 < N; n0 += block_n) {
    const int64_t n1 = std::min(N, n0 + block_n);
    for (int64_t m = 0; m < M; m += kMaxRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, M - m));
      Strip(rows, A + m * lda, lda, B, ldb, C + m * ldc, ldc, n0, n1, K, accumulate);
    }
  }
}

void GemmNt(const float* A, int64_t lda, const void* B, int b_dtype, int64_t ldb, float* C, int64_t ldc, int64_t M,
            int64_t N, int64_t K, bool accumulate) {
  switch (static_cast<DType>(b_dtype)) {
    case DType::bf16:
      GemmTyped(A, lda, static_cast<const hwy::bfloat16_t*>(B), ldb, C, ldc, M, N, K, accumulate);
      break;
    case DType::f16:
      GemmTyped(A, lda, static_cast<const hwy::float16_t*>(B), ldb, C, ldc, M, N, K, accumulate);
      break;
    default:
      GemmTyped(A, lda, static_cast<const float*>(B), ldb, C, ldc, M, N, K, accumulate);
      break;
  }
}

// The name of the target this translation unit was compiled for ("AVX3", "AVX2", ...).
const char* TargetNameOfThisTarget() { return hwy::TargetName(HWY_TARGET); }

}  // namespace moekit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace moekit::kernels {

HWY_EXPORT(GemmNt);
HWY_EXPORT(TargetNameOfThisTarget);

const char* simd_target_name() { return HWY_DYNAMIC_DISPATCH(TargetNameOfThisTarget)(); }

void gemm_nt_serial(const float* A, std::int64_t lda, const void* B, DType b_dtype, std::int64_t ldb, float* C,
                    std::int64_t ldc, std::int64_t M, std::int64_t N, std::int64_t K, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemmNt)(A, lda, B, static_cast<int>(b_dtype), ldb, C, ldc, M, N, K, accumulate);
}

void gemm_nt(const float* A, std::int64_t lda, const void* B, DType b_dtype, std::int64_t ldb, float* C,
             std::int64_t ldc, std::int64_t M, std::int64_t N, std::int64_t K, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  // Split over whichever of M and N is larger; each element is still one fixed-order dot.
  if (M >= N) {
    detail::parallel_for(M, 12, [&](std::int64_t m0, std::int64_t m1) {
      gemm_nt_serial(A + m0 * lda, lda, B, b_dtype, ldb, C + m0 * ldc, ldc, m1 - m0, N, K, accumulate);
    });
  } else {
    const std::int64_t esize = static_cast<std::int64_t>(dtype_size(b_dtype));
    detail::parallel_for(N, 16, [&](std::int64_t n0, std::int64_t n1) {
      gemm_nt_serial(A, lda, static_cast<const char*>(B) + n0 * ldb * esize, b_dtype, ldb, C + n0, ldc, M, n1 - n0, K,
                     accumulate);
    });
  }
}

}  // namespace moekit::kernels
#endif  // HWY_ONCE
