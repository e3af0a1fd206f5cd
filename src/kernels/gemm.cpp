// Portable GEMM driver. The inner product runs over 8 independent fp32 lanes (a fixed
// pattern: lane j sums k ≡ j mod 8, then the lanes are added pairwise), which compilers
// vectorise and which gives the same bits on every thread count.
#include "kernels/gemm.hpp"

#include <algorithm>
#include <vector>

#include "util/thread_pool.hpp"

namespace moekit::kernels {

namespace {

constexpr int kLanes = 8;

inline float reduce_lanes(const float* acc) {
  const float a = (acc[0] + acc[4]) + (acc[2] + acc[6]);
  const float b = (acc[1] + acc[5]) + (acc[3] + acc[7]);
  return a + b;
}

inline float dot_f32(const float* a, const float* b, std::int64_t K) {
  float acc[kLanes] = {};
  std::int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += a[k + j] * b[k + j];
  }
  for (int j = 0; k + j < K; ++j) acc[j] += a[k + j] * b[k + j];
  return reduce_lanes(acc);
}

inline float dot_half(const float* a, const std::uint16_t* b, std::int64_t K, bool bf16) {
  float acc[kLanes] = {};
  float tmp[kLanes];
  std::int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    for (int j = 0; j < kLanes; ++j) tmp[j] = bf16 ? bf16_to_f32(b[k + j]) : f16_to_f32(b[k + j]);
    for (int j = 0; j < kLanes; ++j) acc[j] += a[k + j] * tmp[j];
  }
  for (int j = 0; k + j < K; ++j) acc[j] += a[k + j] * (bf16 ? bf16_to_f32(b[k + j]) : f16_to_f32(b[k + j]));
  return reduce_lanes(acc);
}

}  // namespace

void gemm_nt_serial(const float* A, std::int64_t lda, const void* B, DType b_dtype, std::int64_t ldb, float* C,
                    std::int64_t ldc, std::int64_t M, std::int64_t N, std::int64_t K, bool accumulate) {
  // Blocking over n keeps a panel of B in cache while all rows of A stream past it.
  constexpr std::int64_t kBlockN = 64;
  for (std::int64_t n0 = 0; n0 < N; n0 += kBlockN) {
    const std::int64_t n1 = std::min(N, n0 + kBlockN);
    for (std::int64_t m = 0; m < M; ++m) {
      const float* a = A + m * lda;
      float* c = C + m * ldc;
      for (std::int64_t n = n0; n < n1; ++n) {
        float v;
        if (b_dtype == DType::f32) {
          v = dot_f32(a, static_cast<const float*>(B) + n * ldb, K);
        } else {
          v = dot_half(a, static_cast<const std::uint16_t*>(B) + n * ldb, K, b_dtype == DType::bf16);
        }
        c[n] = accumulate ? c[n] + v : v;
      }
    }
  }
}

void gemm_nt(const float* A, std::int64_t lda, const void* B, DType b_dtype, std::int64_t ldb, float* C,
             std::int64_t ldc, std::int64_t M, std::int64_t N, std::int64_t K, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  // Split over whichever of M and N is larger; each element is still one fixed-order dot.
  if (M >= N) {
    detail::parallel_for(M, 4, [&](std::int64_t m0, std::int64_t m1) {
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
